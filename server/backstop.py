"""The seccomp backstop of a session (issue #10, docs/DESIGN.md §6): every ``execve``/``execveat``
of every process of the session reaches the server, whatever made it — static binaries, Go
programs, raw system calls, ``dlvsym``, ``LD_AUDIT`` tricks, 32-bit programs.

How: the session's shell is started as ``execgate-seccomp-launch FD SHELL SHELL -c …`` (inside the
bwrap sandbox when there is one, so bwrap's own execs are not notified). The launcher installs a
seccomp filter returning ``SECCOMP_RET_USER_NOTIF`` for exec calls and sends its listener fd over
``FD``, the client end of a socketpair made here. :class:`Backstop` takes the listener and answers
each notification on the event loop (``loop.add_reader``):

* the launcher's own exec of the shell (the first notification, made by the launcher binary, of
  the shell path) and every exec of the session's wrapper continue without a decision: the wrapper
  asks the server itself;
* an exec that the wrapper makes of a target the server has just approved for that process
  (:meth:`Backstop.expect`, called by the per-exec handler on Run, keyed by the wrapper's
  ``SO_PEERCRED`` pid) continues without a second decision, if the program and argv are exactly
  those approved: the very file the server identified (device and inode; the wrapper's
  ``execveat(fd, "", …, AT_EMPTY_PATH)`` of its target fd is seen as ``/proc/PID/fd/N``, whose
  stat is that file), else the same path or the file at it;
* any other exec is decided by the policy: Run → ``CONTINUE``; Deny → ``EACCES`` and
  ``Execution denied: <reason>`` on the caller's stderr; Escalate → cannot be done in place: also
  ``EACCES``, with a reason saying to run it through the session's shell.

Not a boundary (docs/DESIGN.md §8): ``CONTINUE`` lets the kernel re-read the path and argv after
the check, so another thread (or process sharing the memory) of a hostile caller can swap them in
between (seccomp_unotify(2), "Design goals; use of SECCOMP_USER_NOTIF_FLAG_CONTINUE"). The bwrap
sandbox remains the boundary; the backstop closes the accidental and unsophisticated routes.

The caller's stderr gets the message through ``pidfd_getfd`` (its very open file description, with
the mode it was opened with) and a non-blocking write — never by reopening ``/proc/PID/fd/2``,
which would open the file anew with the server's credentials (a read-only fd of a root-owned file
would become writable for a root server) and could block on a FIFO.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from dataclasses import dataclass
from typing import Sequence

from execgate.server import protocol as p
from execgate.server import seccomp_notify as sn
from execgate.server.exec_facts import Coverage, learn
from execgate.server.fdpass import close_fds, recv_datagram
from execgate.server.policy import Decision, ExecFacts, Policy, SessionContext

log = logging.getLogger(__name__)

LISTENER_MESSAGE = b"execgate-seccomp-listener"
#: Most approved execs remembered at once (wrappers that were told Run and have not exec'd yet).
MAX_EXPECTED = 4096
MAX_ARGS = 65536


@dataclass(frozen=True, slots=True)
class _Expected:
    program: str
    argv: tuple[bytes, ...]
    ident: tuple[int, int] | None  # (st_dev, st_ino) of the file the server identified, if any


@dataclass(frozen=True, slots=True)
class _Exec:
    """One notified exec, as the caller sees it."""

    tid: int
    tgid: int
    program: str  # absolute, lexically normalised
    argv: list[bytes]
    workdir: str
    ident: tuple[int, int] | None  # (st_dev, st_ino) of the file, if it could be stat'ed
    fd_link: str | None = None  # /proc/PID/fd/N for an execveat(N, "", AT_EMPTY_PATH)


class Unnamed(ValueError):
    """The exec is of an open file without a name (memfd, deleted file): refused undecided."""


class Backstop:
    """One session's seccomp listener and the server's answers to it.

    Args:
        launcher: path of ``execgate-seccomp-launch``.
        wrapper: the session's ``EXEC_WRAPPER`` (its execs continue undecided).
        policy, context: what decides the other execs, as for the wrapper's requests.
        max_concurrent: most notifications decided at once; further ones wait in the kernel.
        max_bytes: bound on an exec's argv (bytes).
    """

    def __init__(self, *, launcher: str, wrapper: str, policy: Policy, context: SessionContext,
                 max_concurrent: int = 64, max_bytes: int = 1 << 20) -> None:
        self.launcher = os.path.abspath(launcher)
        self.policy = policy
        self.context = context
        self.max_concurrent = max_concurrent
        self.max_bytes = max_bytes
        self._loop = asyncio.get_running_loop()
        self._launcher_id = _ident(self.launcher)
        self._wrapper_id = _ident(os.path.abspath(wrapper))
        self._server_sock, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._server_sock.setblocking(False)
        self.client_fd = client.detach()
        os.set_inheritable(self.client_fd, True)
        self._listener = -1
        self._shell: str | None = None
        self._expected: dict[int, _Expected] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def launch_argv(self, shell_argv: Sequence[str]) -> list[str]:
        """``[launcher, FD, shell, *shell_argv]``: the argv to start (inside any sandbox) instead of
        ``shell_argv``; spawn it with :attr:`client_fd` inherited, then call :meth:`close_client`."""
        self._shell = os.path.normpath(shell_argv[0])
        return [self.launcher, str(self.client_fd), shell_argv[0], *shell_argv]

    def close_client(self) -> None:
        """Close the server's copy of the launcher's socket end (after the spawn). Idempotent."""
        if self.client_fd >= 0:
            os.close(self.client_fd)
            self.client_fd = -1

    def expect(self, pid: int, program: str, argv: Sequence[str], ident: tuple[int, int] | None = None) -> None:
        """Record that process ``pid`` (server's pid namespace) was told Run for ``program`` (absolute)
        with ``argv`` (wire strings): its next exec, if exactly that, continues undecided.

        Args:
            ident: ``(st_dev, st_ino)`` of the file the server identified for the request (the
                wrapper's target fd, :mod:`execgate.server.identity`), or None. When given, the
                exec must be of that very file, however it is named: the wrapper's
                ``execveat(fd, "", …, AT_EMPTY_PATH)`` is seen as ``/proc/PID/fd/N``.
        """
        if len(self._expected) >= MAX_EXPECTED:
            self._expected.pop(next(iter(self._expected)))  # the oldest: its wrapper never exec'd
        self._expected[pid] = _Expected(program, tuple(p.wire_bytes(a) for a in argv), ident)

    async def serve(self) -> None:
        """Take the launcher's listener and serve it until :meth:`close`. Never raises but for
        cancellation; a listener that cannot be taken is closed (the launcher's exec then fails)."""
        try:
            payload, fds = await recv_datagram(self._server_sock, max_fds=1)
        except (p.ProtocolError, OSError) as exc:
            log.error("session %s: seccomp listener not received: %s", self.context.session_id, exc)
            return
        finally:
            self._server_sock.close()
        if payload != LISTENER_MESSAGE or len(fds) != 1 or not _is_listener(fds[0]):
            log.error("session %s: the launcher sent no seccomp listener", self.context.session_id)
            close_fds(fds)
            return
        self._listener = fds[0]
        os.set_blocking(self._listener, False)
        self._loop.add_reader(self._listener, self._on_readable)

    async def close(self) -> None:
        """Stop serving and close the listener: every exec still waiting fails with ``ENOSYS``
        (seccomp_unotify(2)), as does every later one. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server_sock.close()
        self.close_client()
        if self._listener >= 0:
            self._loop.remove_reader(self._listener)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._listener >= 0:
            os.close(self._listener)
            self._listener = -1

    def _on_readable(self) -> None:
        try:
            notif = sn.receive(self._listener)
        except sn.NotificationGone:
            return
        except OSError as exc:  # fail closed: without a listener every exec fails (ENOSYS)
            log.error("session %s: seccomp listener failed, closing it: %s", self.context.session_id, exc)
            self._loop.remove_reader(self._listener)
            os.close(self._listener)
            self._listener = -1
            return
        task = self._loop.create_task(self._handle(notif))
        self._tasks.add(task)
        task.add_done_callback(self._done)
        if len(self._tasks) >= self.max_concurrent:
            # Back-pressure: further notifications wait in the kernel (their callers stay blocked
            # in exec) until a decision in flight is answered.
            self._loop.remove_reader(self._listener)

    def _done(self, task: asyncio.Task[None]) -> None:
        full = len(self._tasks) >= self.max_concurrent
        self._tasks.discard(task)
        if full and not self._closed and self._listener >= 0:
            self._loop.add_reader(self._listener, self._on_readable)

    def _answer(self, nid: int, error: int) -> None:
        if self._listener < 0:
            return
        try:
            sn.respond(self._listener, nid, error=error)
        except OSError as exc:
            log.error("session %s: seccomp answer failed: %s", self.context.session_id, exc)

    async def _handle(self, notif: sn.Notification) -> None:
        """Decide one notification and answer it; any failure is a refusal (fail closed)."""
        error = errno.EACCES
        try:
            exe = self._read(notif)
            if exe is None or self._undecided(notif.pid, exe):
                error = 0
            else:
                error = await self._decide(exe)
        except sn.NotificationGone:
            return
        except Unnamed as exc:
            self._tell(notif.pid, f"Execution denied: {exc}\n")
        except (OSError, ValueError) as exc:
            log.warning("session %s: exec by pid %d refused, its arguments cannot be read: %s",
                        self.context.session_id, notif.pid, exc)
        except Exception:
            log.exception("session %s: unexpected error deciding a seccomp notification", self.context.session_id)
        self._answer(notif.id, error)

    def _read(self, notif: sn.Notification) -> _Exec | None:
        """Read the exec's program, argv and working directory from the stopped caller; None for
        an ``execve`` of the session's wrapper by absolute path (the shim's exec of it: the fast
        path, it continues undecided).

        Raises:
            NotificationGone: the caller died (its pid may already name another process).
            OSError, ValueError: bad pointers, oversized arguments, an unsupported call.
        """
        kind = sn.EXEC_SYSCALLS.get((notif.arch, notif.nr))
        if kind is None:
            raise ValueError(f"unexpected system call {notif.nr} (arch {notif.arch:#x})")
        ptr = 8 if notif.arch == sn.AUDIT_ARCH_X86_64 else 4
        proc = f"/proc/{notif.pid}"
        mem = os.open(f"{proc}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if not sn.id_valid(self._listener, notif.id):  # opened the right process's memory?
                raise sn.NotificationGone
            a = notif.args if kind == "execve" else notif.args[1:]
            path = sn.read_cstring(mem, a[0], sn.PATH_MAX)
            if kind == "execve" and path.startswith(b"/") and self._shell is None and self._wrapper_id is not None \
                    and _ident(f"{proc}/root{os.path.normpath(os.fsdecode(path))}") == self._wrapper_id:
                return None
            argv = sn.read_argv(mem, a[1], ptr, max_count=MAX_ARGS, max_bytes=self.max_bytes)
            workdir = os.readlink(f"{proc}/cwd")
            tgid = _tgid(proc)
        finally:
            os.close(mem)
        dirfd = sn.AT_FDCWD if kind == "execve" else _signed32(notif.args[0])
        flags = 0 if kind == "execve" else notif.args[4]
        program, ident = _locate(proc, os.fsdecode(path), dirfd, flags, workdir)
        if not sn.id_valid(self._listener, notif.id):
            raise sn.NotificationGone
        fd_link = f"{proc}/fd/{dirfd}" if not path and flags & sn.AT_EMPTY_PATH else None
        return _Exec(notif.pid, tgid, program, argv, workdir, ident, fd_link)

    def _undecided(self, tid: int, exe: _Exec) -> bool:
        """True for the execs that continue without a decision (see the module docstring)."""
        expected = self._expected.pop(exe.tgid, None)  # one-shot: the process's next exec consumes it
        if self._shell is not None:  # only the very first notification can be the launcher's
            shell, self._shell = self._shell, None
            if exe.program == shell and _ident(f"/proc/{tid}/exe") == self._launcher_id:
                return True
        if exe.ident is not None and exe.ident == self._wrapper_id:
            return True
        if expected is None or tuple(exe.argv) != expected.argv:
            return False
        if expected.ident is not None:  # identified by the server: that very file, by any name
            return exe.ident == expected.ident
        if exe.program == expected.program:
            return True
        return exe.ident is not None and exe.ident == _ident(f"/proc/{tid}/root{expected.program}")

    async def _decide(self, exe: _Exec) -> int:
        """Ask the policy; returns 0 (Run) or the errno the exec fails with."""
        argv = [os.fsdecode(a) for a in exe.argv]
        extra = {}
        if getattr(self.policy, "accepts_facts", False):  # Policy doc: what trust rests on, the file's kind
            uid, fd = await asyncio.to_thread(_caller_of, exe)
            if exe.fd_link is not None and fd is None:  # never judge its path instead: another file
                extra["facts"] = ExecFacts(children_unseen=False, problem=f"{exe.fd_link} could not be reopened")
            else:
                extra["facts"] = await learn(exe.tgid, exe.program, Coverage(seccomp=True), uid=uid, fd=fd)
        try:
            decision = await self.policy.determine_action(exe.program, argv, exe.workdir, self.context, **extra)
        except Exception as exc:  # fail closed
            log.error("session %s: policy failed for %s: %r", self.context.session_id, exe.program, exc)
            decision = Decision.deny(f"policy error: {exc}")
        action = getattr(decision, "action", None)
        if action == "run":
            return 0
        if action == "escalate":
            reason = (f"{exe.program} needs escalation, which an exec made without the preload shim "
                      "cannot get in place; run it through the session's shell (e.g. sh -c '...')")
            log.warning("session %s: seccomp backstop refused escalation of %s %r", self.context.session_id,
                        exe.program, argv)
        elif action == "deny":
            reason = decision.reason or ""
        else:
            reason = "policy error: malformed decision"
        self._tell(exe.tid, f"Execution denied: {reason}\n" if reason else "Execution denied\n")
        return errno.EACCES

    def _tell(self, tid: int, text: str) -> None:
        """Best effort: ``text`` on the stderr of thread ``tid``'s process (see the module docstring
        for why this way). Never raises."""
        try:
            tgid = _tgid(f"/proc/{tid}")
            pidfd = os.pidfd_open(tgid)
        except (OSError, ValueError):
            return
        try:
            fd = sn.pidfd_getfd(pidfd, 2)
            try:
                sn.write_nonblocking(fd, text.encode("utf-8", "surrogateescape"))
            finally:
                os.close(fd)
        except OSError as exc:
            log.info("session %s: denial not shown to pid %d: %s", self.context.session_id, tgid, exc)
        finally:
            os.close(pidfd)


def _caller_of(exe: _Exec) -> tuple[int | None, int | None]:
    """``(uid, fd)`` for :func:`execgate.server.exec_facts.learn` of a notified exec: the caller's
    effective uid (None if unreadable: then nothing is trusted) and, for ``execveat(fd, "",
    AT_EMPTY_PATH)``, that very fd reopened ``O_PATH`` through ``/proc/PID/fd/N`` (proc(5); owned
    by the caller), else None (the path is walked in the caller's view). Never raises."""
    try:
        uid: int | None = _uid(f"/proc/{exe.tgid}")
    except (OSError, ValueError, IndexError):
        uid = None
    try:
        fd = None if exe.fd_link is None else os.open(exe.fd_link, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return uid, None
    return uid, fd


def _uid(proc: str) -> int:
    """The effective uid of the process at ``proc`` (``Uid:`` of /proc/PID/status, proc(5)), as
    ``SO_PEERCRED`` reports a wrapper's."""
    with open(f"{proc}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):
                return int(line.split()[2])
    raise OSError(errno.ESRCH, "no Uid")


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _tgid(proc: str) -> int:
    with open(f"{proc}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
    raise OSError(errno.ESRCH, "no Tgid")


def _locate(proc: str, path: str, dirfd: int, flags: int, workdir: str) -> tuple[str, tuple[int, int] | None]:
    """The exec's file as the caller names it: an absolute, lexically normalised path and, if it
    can be stat'ed through the caller's root, its (device, inode).

    Raises:
        Unnamed: ``AT_EMPTY_PATH`` on a memfd or a deleted file.

    ``execveat(fd, "", …, AT_EMPTY_PATH)`` is the file open on ``fd`` (``/proc/PID/fd/N``, which
    stat follows to the very file); a relative path is taken from the caller's cwd or ``dirfd``.
    """
    if path == "" and flags & sn.AT_EMPTY_PATH:
        link = f"{proc}/fd/{dirfd}"
        target = os.readlink(link)
        if not target.startswith("/") or target.endswith(" (deleted)"):
            # As the shim does: a memfd or a deleted file has no name the policy could judge.
            raise Unnamed(f"an unnamed file ({target}) cannot be judged by name")
        return os.path.normpath(target), _ident(link)
    if not path:
        raise ValueError("empty path")
    if not path.startswith("/"):
        base = workdir if dirfd == sn.AT_FDCWD else os.readlink(f"{proc}/fd/{dirfd}")
        path = os.path.join(base, path)
    program = os.path.normpath(path)
    return program, _ident(f"{proc}/root{program}")


def _is_listener(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:seccomp notify"
    except OSError:
        return False
