"""Spawning and reaping processes the server owns: escalated commands and sessions' shells.

Why ``subprocess.Popen`` and a pidfd rather than asyncio's subprocess API: Popen's C helper maps
any permutation of fds onto the child's 0/1/2 correctly even when the sources themselves are
numbered 0–2 (received fds land there when the server runs with closed stdio), uses ``vfork`` and
needs no ``preexec_fn``; and waiting on a pidfd (pidfd_open(2), Linux ≥ 5.3) with
``loop.add_reader`` behaves identically on asyncio and uvloop without child watchers or threads.
Where pidfds are unavailable the wait falls back to a worker thread.

Every process starts in a new session (``setsid``), so it leads its own process group and a
signal to the group reaches everything it started that did not leave the group. Given a
:class:`~execgate.server.containment.Placement`, it is started through ``execgate-contain``, which
joins the session's cgroup (or sets a parent-death signal) before the program runs, so that what
leaves the group is still reached (:mod:`execgate.server.containment`).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import subprocess
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from execgate.server.fdpass import wait_readable

if TYPE_CHECKING:
    from execgate.server.containment import Placement

log = logging.getLogger(__name__)

#: Default grace period between SIGTERM and SIGKILL, seconds.
DEFAULT_KILL_GRACE_S = 2.0


def status_from_returncode(returncode: int) -> int:
    """Shell-style exit status: Popen's ``-S`` for a death by signal S becomes ``128 + S``."""
    return 128 - returncode if returncode < 0 else returncode


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to process group ``pgid``; False if the group no longer exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("no permission to signal process group %d", pgid)
        return False
    return True


@dataclass(eq=False)  # identity semantics: tracked in sets
class ChildProcess:
    """A spawned process leading its own process group.

    Attributes:
        popen: the underlying Popen (never waited on by anyone else).
        pgid: its process group id (== pid, it called setsid).
    """

    popen: subprocess.Popen[bytes]
    pgid: int

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exit_status(self) -> int | None:
        """Shell-style status (``128 + S`` if killed by signal S), or None while it runs."""
        rc = self.popen.returncode
        return None if rc is None else status_from_returncode(rc)

    async def wait(self) -> int:
        """Wait for the process to exit, reap it and return its shell-style status."""
        if self.popen.returncode is None:
            try:
                pidfd = os.pidfd_open(self.popen.pid)
            except (AttributeError, OSError):
                await asyncio.get_running_loop().run_in_executor(None, self.popen.wait)
            else:
                try:
                    await wait_readable(pidfd)
                finally:
                    os.close(pidfd)
                self.popen.wait()
        return status_from_returncode(self.popen.returncode)

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the whole process group; False if it no longer exists."""
        return signal_group(self.pgid, signum)

    async def terminate_group(self, grace_s: float = DEFAULT_KILL_GRACE_S) -> int:
        """SIGTERM the group, SIGKILL it after ``grace_s`` seconds if the leader still runs, reap
        the leader and return its status. Members that outlive the leader get SIGKILL too."""
        if self.popen.returncode is None:
            self.signal_group(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace_s):
                    await self.wait()
            except TimeoutError:
                pass
        self.signal_group(signal.SIGKILL)
        return await self.wait()


#: Every process :func:`spawn` started, while it is referenced (:func:`running_pids`).
_SPAWNED: "weakref.WeakSet[ChildProcess]" = weakref.WeakSet()


def running_pids() -> set[int]:
    """Pids of the processes :func:`spawn` started that are not reaped yet (any session's)."""
    return {c.pid for c in list(_SPAWNED) if c.popen.returncode is None}


def spawn(
    command: Sequence[str] | Sequence[bytes],
    *,
    env: Mapping[str, str] | Mapping[bytes, bytes],
    cwd: str | bytes,
    arg0: str | bytes | None = None,
    stdio: Mapping[int, int] | None = None,
    pass_fds: Sequence[int] = (),
    placement: Placement | None = None,
) -> ChildProcess:
    """Start ``command`` in a new session with exactly ``env`` and ``cwd``.

    Args:
        command: argv; ``command[0]`` is the absolute path executed: never searched on a PATH
            (the env's PATH is the caller's, and a relative name would run its ``bwrap``).
            Strings are encoded with ``os.fsencode``; pass bytes to choose the exact bytes.
        env: the complete environment; nothing of the server's own is added.
        cwd: working directory.
        arg0: argv[0] seen by the program (default ``command[0]``).
        stdio: destination (0, 1 or 2) → source fd; missing destinations get ``/dev/null``.
            Sources may themselves be numbered 0–2. Still owned by the caller afterwards.
        pass_fds: extra fds inherited under the same number (e.g. the session's client socket).
        placement: the session's containment (started through ``execgate-contain``); None: none.

    Raises:
        ValueError: empty command, a relative ``command[0]``, a destination other than 0, 1, 2,
            a NUL byte in a string or ``=`` in an env name.
        OSError: the exec failed (e.g. ``FileNotFoundError``, ``PermissionError``), or the process
            could not join its containment (the message names it).
    """
    if not command:
        raise ValueError("empty command")
    if not os.path.isabs(command[0]):
        raise ValueError(f"command[0] must be an absolute path, got {command[0]!r}")
    stdio = dict(stdio or {})
    if set(stdio) - {0, 1, 2}:
        raise ValueError(f"only fds 0, 1, 2 can be set, got {sorted(stdio)}")

    def popen(argv: list[str | bytes], executable: str | bytes, fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv, executable=executable, stdin=stdio.get(0, subprocess.DEVNULL),
            stdout=stdio.get(1, subprocess.DEVNULL), stderr=stdio.get(2, subprocess.DEVNULL),
            env=dict(env), cwd=cwd, close_fds=True, pass_fds=fds, start_new_session=True,
        )

    if placement is None:
        started = popen([arg0 if arg0 is not None else command[0], *command[1:]], command[0], tuple(pass_fds))
    else:
        started = _spawn_placed(popen, command, arg0, tuple(pass_fds), placement)
    child = ChildProcess(popen=started, pgid=started.pid)
    _SPAWNED.add(child)
    return child


_Popen = Callable[[list, "str | bytes", tuple[int, ...]], "subprocess.Popen[bytes]"]


def _spawn_placed(popen: _Popen, command: Sequence[str] | Sequence[bytes], arg0: str | bytes | None,
                  pass_fds: tuple[int, ...], placement: Placement) -> subprocess.Popen[bytes]:
    """Start ``command`` through ``execgate-contain``; raise its failure as an OSError.

    The helper reports a failure as ``STAGE ERRNO`` on a close-on-exec pipe (EOF: the program
    runs), as subprocess.Popen does for its own exec; the read blocks until then (microseconds).
    """
    read_end, write_end = os.pipe()
    try:  # above 2: the child's stdio is dup2'ed onto 0-2 before the helper runs
        errfd = fcntl.fcntl(write_end, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(write_end)
    try:
        try:
            started = popen(placement.argv(command, arg0, errfd), placement.helper, (*pass_fds, errfd))
        finally:
            os.close(errfd)
        report = b""
        while chunk := os.read(read_end, 64):
            report += chunk
    finally:
        os.close(read_end)
    if not report:
        return started
    started.wait()
    stage, _, number = report.decode("ascii", "replace").partition(" ")
    err = int(number) if number.strip().isdigit() else 0
    if stage == "exec":
        raise OSError(err, os.strerror(err), os.fsdecode(command[0]))
    raise OSError(err, f"cannot place the process in the session's containment ({stage}): {os.strerror(err)}")

