"""The seccomp backstop's launcher on its own (real processes, real seccomp filters): it probes, it
refuses to start a program it could not put under a served listener, and an exec under a listener
nobody serves fails instead of running; and which approved execs continue undecided."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from execgate.server import backstop
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


def _matcher() -> "backstop.Backstop":
    """A Backstop with only what :meth:`_undecided` reads (no listener, no loop)."""
    b = object.__new__(backstop.Backstop)
    b._expected, b._expected_children, b._shell, b._wrapper_id = {}, {}, None, (0, 1)
    return b


def _exe(tgid: int, ppid: int, ident: tuple[int, int], argv: list[bytes],
         version: tuple[int, int] = (7, 8)) -> "backstop._Exec":
    return backstop._Exec(tgid, tgid, ppid, "/bin/x", argv, "/", ident, version, -1)


def test_an_approved_exec_is_undecided_once_and_only_before_its_deadline(monkeypatch) -> None:
    """The wrapper's (or the shim's) approved exec: one-shot, that file and argv, within
    EXPECTED_TTL_S; a child's approval (posix_spawn): one per approval, by a child of the
    requester, of that file and argv; anything later or else is decided."""
    now = [1000.0]
    monkeypatch.setattr(backstop.time, "monotonic", lambda: now[0])
    b = _matcher()
    b.expect(10, "/bin/x", ["x"], (5, 6, 7, 8))
    assert not b._undecided(10, _exe(10, 1, (5, 7), [b"x"]))  # another file: decided (and consumed)
    assert not b._undecided(10, _exe(10, 1, (5, 6), [b"x"]))
    b.expect(10, "/bin/x", ["x"], (5, 6, 7, 8))
    assert b._undecided(10, _exe(10, 1, (5, 6), [b"x"]))
    b.expect(10, "/bin/x", ["x"], (5, 6, 7, 8))
    assert not b._undecided(10, _exe(10, 1, (5, 6), [b"x"], version=(9, 8)))  # rewritten in place since
    b.expect(10, "/bin/x", ["x"], (5, 6, 7, 8))
    now[0] += backstop.EXPECTED_TTL_S + 1
    assert not b._undecided(10, _exe(10, 1, (5, 6), [b"x"]))  # kept too long: decided again

    b.expect(20, "/bin/x", ["x"], (5, 6, 7, 8), child=True)
    b.expect(20, "/bin/x", ["x"], (5, 6, 7, 8), child=True)
    assert not b._undecided(30, _exe(30, 21, (5, 6), [b"x"]))  # not a child of 20
    assert not b._undecided(31, _exe(31, 20, (5, 6), [b"y"]))  # other argv
    assert not b._undecided(32, _exe(32, 20, (5, 9), [b"x"]))  # other file
    assert not b._undecided(32, _exe(32, 20, (5, 6), [b"x"], version=(7, 9)))  # same inode, other size
    assert b._undecided(33, _exe(33, 20, (5, 6), [b"x"]))
    assert b._undecided(34, _exe(34, 20, (5, 6), [b"x"]))
    assert not b._undecided(35, _exe(35, 20, (5, 6), [b"x"]))  # two approvals, two execs
    b.expect(20, "/bin/x", ["x"], (5, 6, 7, 8), child=True)
    now[0] += backstop.EXPECTED_TTL_S + 1
    assert not b._undecided(36, _exe(36, 20, (5, 6), [b"x"]))
    b.expect(20, "/bin/x", ["x"], None, child=True)  # an unidentified file is never expected
    assert not b._undecided(37, _exe(37, 20, (5, 6), [b"x"]))


def test_approvals_do_not_keep_the_argvs_a_session_sends() -> None:
    """A session can get an approval per distinct argv (the cache's program scope keys on argv[0]
    alone, so one cached Run covers any arguments): 200 approvals with 1 MB argvs each must not
    make the server hold 200 MB (the first version kept every argv until the table was full)."""
    import tracemalloc

    b = _matcher()
    big = "x" * 1_000_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            b.expect(20, "/bin/true", ["/bin/true", big + str(i)], (5, 6, 7, 8), child=True)
            b.expect(20 + i, "/bin/true", ["/bin/true", big + str(i)], (5, 6, 7, 8))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2_000_000, f"{held} bytes held for 400 approvals"
