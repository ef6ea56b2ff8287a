"""The seccomp backstop's launcher on its own (real processes, real seccomp filters): it probes, it
refuses to start a program it could not put under a served listener, and an exec under a listener
nobody serves fails instead of running."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from execgate.server.backstop import LISTENER_MESSAGE
from execgate.wrapper.artifacts import seccomp_launcher_path

LAUNCHER = str(seccomp_launcher_path())


def test_probe_and_usage() -> None:
    assert subprocess.run([LAUNCHER, "--probe"], capture_output=True, check=False).returncode == 0
    done = subprocess.run([LAUNCHER], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "usage:" in done.stderr


def test_no_program_runs_when_the_listener_cannot_be_handed_over(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    fd = os.open("/dev/null", os.O_RDONLY)  # not a socket: sendmsg fails
    try:
        done = subprocess.run([LAUNCHER, str(fd), "/usr/bin/touch", "touch", str(ran)], pass_fds=(fd,),
                              capture_output=True, text=True, check=False)
    finally:
        os.close(fd)
    assert done.returncode == 126
    assert "cannot hand the seccomp listener to the escalation server" in done.stderr
    assert not ran.exists()


def test_exec_fails_closed_when_nobody_serves_the_listener(tmp_path: Path) -> None:
    """The server end reads the listener and closes it unserved (as a session does when it closes):
    the launcher's own exec gets ENOSYS; nothing runs."""
    ran = tmp_path / "ran"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with ours:
        proc = subprocess.Popen([LAUNCHER, str(theirs.fileno()), "/usr/bin/touch", "touch", str(ran)],
                                pass_fds=(theirs.fileno(),), stderr=subprocess.PIPE, text=True)
        theirs.close()
        msg, fds, _, _ = socket.recv_fds(ours, 64, 1)
        assert msg == LISTENER_MESSAGE and len(fds) == 1
        assert os.readlink(f"/proc/self/fd/{fds[0]}") == "anon_inode:seccomp notify"
        os.close(fds[0])
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 126
    assert "the escalation server did not take the seccomp listener" in err
    assert not ran.exists()
