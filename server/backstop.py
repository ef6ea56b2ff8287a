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
  those approved: the very file the server identified, unchanged (device and inode, change time
  and size; the wrapper's
  ``execveat(fd, "", …, AT_EMPTY_PATH)`` of its target fd is seen as ``/proc/PID/fd/N``, whose
  stat is that file), else the same path or the file at it; likewise the shim's cached Run of a
  ``posix_spawn`` (``expect(..., child=True)``): one exec of exactly that file and argv by a child
  of the requesting process; an approval not used within :data:`EXPECTED_TTL_S` (10 s) is
  dropped (the exec is then decided, as any other);
* a query by exec (server/protocol.py "Query by exec": the shim's raw ``execve`` carrying
  ``QUERY_EXEC_MARK`` and this backstop's :attr:`Backstop.query_token`: ``execveat`` of the file
  the shim opened, named as the caller named it) is answered as the shim's cached-only
  query: the policy's ``query_run`` (a Run given without asking anyone) →
  ``CONTINUE``; anything else, another token, another path, or a file it cannot name in the
  caller's view → ``QUERY_UNDECIDED_ERRNO``, nothing decided or audited (the shim then
  execs the wrapper, whose target fd names the file);
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
import hashlib
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from execgate.server import protocol as p
from execgate.server import seccomp_notify as sn
from execgate.server.escalation import query_run
from execgate.server.exec_facts import Coverage, learn, read_info
from execgate.server.fileinfo import kinds
from execgate.server.fdpass import close_fds, recv_datagram
from execgate.server.identity import Unresolved, open_fd_of, open_root, status_ids, walk
from execgate.server.policy import Decision, Policy, SessionContext

log = logging.getLogger(__name__)

LISTENER_MESSAGE = b"execgate-seccomp-listener"
#: Most approved execs remembered at once (wrappers that were told Run and have not exec'd yet).
MAX_EXPECTED = 4096
#: Seconds an approved exec stays expected: the wrapper, or the shim after a cached Run, execs at
#: once; a Run kept for later (a rules reload or the cache's TTL may have passed since) is
#: decided again. Also the most approvals of one posix_spawn key kept at once.
EXPECTED_TTL_S = 10.0
MAX_EXPECTED_PER_CHILD_KEY = 16
MAX_ARGS = 65536


@dataclass(frozen=True, slots=True)
class _Expected:
    program: str
    argv: bytes  # _argv_digest of the approved argv
    ident: tuple[int, int, int, int] | None  # (st_dev, st_ino, st_ctime_ns, st_size) identified, if any
    deadline: float  # time.monotonic() past which it is no longer expected
    kinds: frozenset[str] | None  # the file's kinds as judged, for a file the caller can modify


@dataclass(frozen=True, slots=True)
class _Exec:
    """One notified exec, as the caller sees it."""

    tid: int
    tgid: int
    ppid: int  # the thread group's parent
    program: str  # absolute, lexically normalised: the name the policy judges
    argv: list[bytes]
    workdir: str
    ident: tuple[int, int]  # (st_dev, st_ino) of the file the kernel's resolution reaches
    version: tuple[int, int]  # its (st_ctime_ns, st_size) now
    fd: int  # O_PATH fd of that very file (owned by whoever holds this _Exec: _handle closes it)
    uid: int | None = None  # the calling thread's effective uid
    mark: int | None = None  # the token of a query by exec, None for any other exec
    named: str | None = None  # a query's name for the file, joined to workdir (not normalised)


class _Undecided(Exception):
    """A query by exec answered undecided before any decision (no name, an unnamed file)."""


class Unnamed(ValueError):
    """The exec's file cannot be identified in the caller's view (a memfd or deleted file, a
    path through ``/proc``, an ``execveat`` relative to a directory fd): refused undecided."""


#: errnos of a failed resolution that the exec itself would fail with: answered as they are,
#: without a decision (a static shell's PATH search tries each directory this way).
_AS_THE_KERNEL = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EBADF})


class Backstop:
    """One session's seccomp listener and the server's answers to it.

    Args:
        launcher: path of ``execgate-seccomp-launch``.
        wrapper: the session's ``EXEC_WRAPPER`` (its execs continue undecided).
        policy, context: what decides the other execs, as for the wrapper's requests.
        max_concurrent: most notifications decided at once; further ones wait in the kernel.
        max_bytes: bound on an exec's argv (bytes).
        coverage: what the session's interception sees, for the facts of a query by exec (as the
            shim's socket query gets them); the execs decided otherwise are judged as seen by the
            backstop alone.
        on_note: called with a Run's ``note`` for the user (why a program a rule would escalate
            stays in the sandbox), as the socket query's Run is.
    """

    def __init__(self, *, launcher: str, wrapper: str, policy: Policy, context: SessionContext,
                 max_concurrent: int = 64, max_bytes: int = 1 << 20, coverage: Coverage | None = None,
                 on_note: Callable[[str], None] | None = None) -> None:
        self.launcher = os.path.abspath(launcher)
        self.policy = policy
        self.context = context
        self.coverage = coverage or Coverage(seccomp=True)
        self._on_note = on_note
        #: The token a query by exec carries (server/protocol.py "Query by exec"), or None when the
        #: policy answers no queries; exported as ``EXECGATE_BACKSTOP_QUERY`` by the session.
        self.query_token: int | None = (secrets.randbelow((1 << 31) - 1) + 1
                                        if getattr(policy, "answers_queries", False) is True else None)
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
        #: Inode of the session's mount namespace and (device, inode) of its root directory (its
        #: launcher's, the first notification): only there is the caller's ``/proc`` the one the
        #: session started with, and only with that root do its absolute paths name the files
        #: the rules name.
        self._mntns: int | None = None
        self._root: tuple[int, int] | None = None
        self._server_mntns = _mntns(os.getpid())  # this process never changes namespace
        self._first = True
        #: Approved execs of a child: (parent tgid, (st_dev, st_ino), argv digest) → their deadlines
        #: (posix_spawn). Digests, not argvs: a session must not make the server hold its argvs.
        self._expected_children: dict[tuple[int, tuple[int, int, int, int], bytes],
                                      list[tuple[float, frozenset[str] | None]]] = {}
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

    def expect(self, pid: int, program: str, argv: Sequence[str], ident: tuple[int, int, int, int] | None = None,
               *, child: bool = False, kinds: frozenset[str] | None = None) -> None:
        """Record that process ``pid`` (server's pid namespace) was told Run for ``program`` (absolute)
        with ``argv`` (wire strings): its next exec, if exactly that, continues undecided.

        Args:
            ident: ``(st_dev, st_ino, st_ctime_ns, st_size)`` of the file the server identified
                for the request (the wrapper's target fd, :mod:`execgate.server.identity`), or
                None. When given, the exec must be of that very file, however it is named (the
                wrapper's ``execveat(fd, "", …, AT_EMPTY_PATH)`` is seen as ``/proc/PID/fd/N``),
                and unchanged since: rewritten in place (same inode) into another kind of file,
                or chmod'ed, it is decided again (its change time and size differ).
            kinds: the file's kinds (:func:`~execgate.server.fileinfo.kinds`) as judged, given
                for a file the caller can modify: its contents are read again at the exec and
                must still be of those kinds (a write through a shared mapping changes neither
                the change time nor the size), else it is decided again.
            child: the Run is for an exec by a child of ``pid`` (the shim's ``posix_spawn``,
                server/protocol.py "Cached-only query"): one exec of exactly that file (``ident``
                required) and argv by a process whose parent is ``pid`` continues undecided.
        """
        now = time.monotonic()
        digest = _argv_digest([p.wire_bytes(a) for a in argv])
        if child:
            if ident is not None:
                children = self._expected_children
                if len(children) >= MAX_EXPECTED // 2:  # drop what has expired before dropping the oldest
                    for old in [k for k, v in children.items() if v[-1][0] < now]:
                        del children[old]
                key = (pid, ident, digest)
                if len(children) >= MAX_EXPECTED and key not in children:
                    children.pop(next(iter(children)))
                deadlines = children.setdefault(key, [])
                deadlines.append((now + EXPECTED_TTL_S, kinds))
                del deadlines[:-MAX_EXPECTED_PER_CHILD_KEY]
            return
        if len(self._expected) >= MAX_EXPECTED:
            self._expected.pop(next(iter(self._expected)))  # the oldest: its wrapper never exec'd
        self._expected[pid] = _Expected(program, digest, ident, now + EXPECTED_TTL_S, kinds)

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
        exe, error = self._settle(notif)
        if exe is None:  # answered without a decision (or gone): no task, no await
            if error is not None:
                self._answer(notif.id, error)
            return
        task = self._loop.create_task(self._handle(notif, exe))
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

    def _settle(self, notif: sn.Notification) -> tuple[_Exec | None, int | None]:
        """Read one notification and settle what needs no decision, synchronously (the wrapper's
        execs and the approved ones: most of them). Returns ``(exe, None)`` when the policy must
        decide (``exe`` owned by the caller), ``(None, error)`` to answer at once with ``error``
        (0: continue; else the errno: any failure is a refusal, fail closed), ``(None, None)``
        when the caller is gone."""
        exe: _Exec | None = None
        if self._first:  # the launcher's exec of the shell
            self._first = False
            self._mntns, self._root = _mntns(notif.pid), _root_of(notif.pid)
        try:
            exe = self._read(notif)
            if exe is not None and not self._undecided(notif.pid, exe):
                if exe.mark is not None and exe.mark != self.query_token:
                    return None, p.QUERY_UNDECIDED_ERRNO  # another session's (or a forged) query
                exe, decide = None, exe
                return decide, None
            return None, 0
        except sn.NotificationGone:
            return None, None
        except _Undecided:
            return None, p.QUERY_UNDECIDED_ERRNO
        except Unnamed as exc:
            self._tell(notif.pid, f"Execution denied: {exc}\n")
        except OSError as exc:
            if exc.errno in _AS_THE_KERNEL:
                return None, exc.errno
            log.warning("session %s: exec by pid %d refused, its file or arguments cannot be read: %s",
                        self.context.session_id, notif.pid, exc)
        except ValueError as exc:
            log.warning("session %s: exec by pid %d refused, its arguments cannot be read: %s",
                        self.context.session_id, notif.pid, exc)
        except Exception:
            log.exception("session %s: unexpected error deciding a seccomp notification", self.context.session_id)
        finally:
            if exe is not None:
                os.close(exe.fd)
        return None, errno.EACCES

    async def _handle(self, notif: sn.Notification, exe: _Exec) -> None:
        """Decide one notification (``exe``: owned, closed here) and answer it; any failure is a
        refusal (fail closed)."""
        error = errno.EACCES
        try:
            error = await (self._decide(exe) if exe.mark is None else self._query(exe))
        except OSError as exc:  # the caller vanished while its uid was read
            log.info("session %s: exec by pid %d refused: %s", self.context.session_id, exe.tid, exc)
        except Exception:
            log.exception("session %s: unexpected error deciding a seccomp notification", self.context.session_id)
        finally:
            os.close(exe.fd)
        self._answer(notif.id, error)

    def _read(self, notif: sn.Notification) -> _Exec | None:
        """Read the exec's program, argv and working directory from the stopped caller and open
        the file the kernel will run, resolved in the caller's view as the kernel resolves it
        (:func:`~execgate.server.identity.walk`: not the lexically normalised path, whose
        ``link/..`` would name another directory); None for an ``execve`` of the session's
        wrapper (the shim's exec of it: the fast path, it continues undecided). A query by exec
        (:func:`_query_mark`) is named as the caller named it, its file being the one it opened.

        Raises:
            NotificationGone: the caller died (its pid may already name another process).
            Unnamed: the file cannot be identified in the caller's view.
            _Undecided: a query by exec that cannot be answered here (the wrapper will ask).
            OSError: the path does not resolve (the errno the exec would fail with), or the
                caller's memory cannot be read.
            ValueError: bad pointers, oversized arguments, an unsupported call.
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
            path = os.fsdecode(sn.read_cstring(mem, a[0], sn.PATH_MAX))
            workdir = os.readlink(f"{proc}/cwd")
            dirfd = sn.AT_FDCWD if kind == "execve" else _signed32(notif.args[0])
            flags = 0 if kind == "execve" else notif.args[4]
            mark, named = _query_mark(mem, notif, kind, ptr, path) if kind == "execveat" else (None, None)
            if mark is not None and not named:
                raise _Undecided
            tgid, ppid, uid = _ids(proc)
            if _root_of(notif.pid) != self._root or self._root is None:
                raise Unnamed("the caller runs in a root directory of its own (chroot): its paths name other "
                              "files than the session's")
            own_proc = self._mntns is not None and _mntns(notif.pid) == self._mntns
            try:
                program, fd = _locate(notif.pid, path, dirfd, flags, tgid=tgid, own_proc=own_proc)
            except Unnamed:
                if mark is not None:  # the wrapper asks in full, with the file open
                    raise _Undecided from None
                raise
            if named is not None:  # the policy judges the name the shim was asked to run
                program = os.path.normpath(os.path.join(workdir, named))
            if not own_proc and not self._names_the_sessions(program, fd):
                os.close(fd)
                raise Unnamed(f"the caller runs in a mount namespace of its own, where {program} is another file "
                              "than the session's")
            try:
                st = os.fstat(fd)
                ident, version = (st.st_dev, st.st_ino), (st.st_ctime_ns, st.st_size)
                if kind == "execve" and self._shell is None and ident == self._wrapper_id:
                    if not sn.id_valid(self._listener, notif.id):
                        raise sn.NotificationGone
                    os.close(fd)
                    return None
                argv = sn.read_argv(mem, a[1], ptr, max_count=MAX_ARGS, max_bytes=self.max_bytes)
                if not sn.id_valid(self._listener, notif.id):
                    raise sn.NotificationGone
            except BaseException:
                os.close(fd)
                raise
        finally:
            os.close(mem)
        return _Exec(notif.pid, tgid, ppid, program, argv, workdir, ident, version, fd, uid, mark,
                     None if named is None else os.path.join(workdir, named))

    def _names_the_sessions(self, program: str, fd: int) -> bool:
        """For a caller in a mount namespace of its own (``unshare``, no sandbox): True if
        ``program`` names, in the session's view, the very file open on ``fd`` — a bind mount of
        its own over an allowed path would otherwise pass for that path. The session's view is
        this server's when the session shares its mount namespace (no sandbox); in a sandbox of
        its own, a process cannot make a mount namespace (bwrap ``--disable-userns``): False."""
        if self._mntns is None or self._mntns != self._server_mntns:
            return False
        try:
            st, mine = os.stat(program), os.fstat(fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def _undecided(self, tid: int, exe: _Exec) -> bool:
        """True for the execs that continue without a decision (see the module docstring)."""
        expected = self._expected.pop(exe.tgid, None)  # one-shot: the process's next exec consumes it
        if self._shell is not None:  # only the very first notification can be the launcher's
            shell, self._shell = self._shell, None
            if exe.program == shell and _ident(f"/proc/{tid}/exe") == self._launcher_id:
                return True
        if exe.ident == self._wrapper_id:
            return True
        now = time.monotonic()
        if expected is None and self._expected_children and self._take_child(exe, now):
            return True  # an approved posix_spawn of its parent's
        if expected is None or expected.deadline < now or _argv_digest(exe.argv) != expected.argv:
            return False
        # Only the very file the server identified, by any name, unchanged; a request it could
        # not identify is decided again here, on the file the kernel will run.
        return (expected.ident is not None and exe.ident + exe.version == expected.ident
                and _same_kinds(exe, expected.kinds))

    def _take_child(self, exe: _Exec, now: float) -> bool:
        """Consume one live approval of exactly this exec by a child of ``exe.ppid``, if any."""
        key = (exe.ppid, exe.ident + exe.version, _argv_digest(exe.argv))
        deadlines = self._expected_children.get(key)
        if deadlines is None:
            return False
        live = [entry for entry in deadlines if entry[0] >= now]
        if live[1:]:
            self._expected_children[key] = live[1:]
        else:
            del self._expected_children[key]
        return bool(live) and _same_kinds(exe, live[0][1])

    async def _query(self, exe: _Exec) -> int:
        """Answer a query by exec of this session's: 0 (Run, given without asking anyone) or
        ``QUERY_UNDECIDED_ERRNO`` (the shim then execs the wrapper, which asks in full)."""
        # The file the kernel will run (learn owns the duplicate), seen as the shim's socket query sees it.
        facts = await learn(exe.tgid, exe.program, self.coverage, uid=exe.uid, fd=os.dup(exe.fd), path=exe.named,
                            local=os.major(exe.ident[0]) != 0)
        decision = await query_run(self.policy, exe.program, [os.fsdecode(a) for a in exe.argv], exe.workdir,
                                   self.context, facts)
        if decision is None:
            return p.QUERY_UNDECIDED_ERRNO
        if decision.note and self._on_note is not None:
            self._on_note(decision.note)
        return 0

    async def _decide(self, exe: _Exec) -> int:
        """Ask the policy; returns 0 (Run) or the errno the exec fails with."""
        argv = [os.fsdecode(a) for a in exe.argv]
        extra = {}
        if getattr(self.policy, "accepts_facts", False):  # Policy doc: what trust rests on, the file's kind
            # The file the kernel will run (learn owns the duplicate): the identity names the
            # program's path as trustworthy only if that path is this very file.
            extra["facts"] = await learn(exe.tgid, exe.program, Coverage(seccomp=True), uid=exe.uid,
                                         fd=os.dup(exe.fd))
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


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _query_mark(mem: int, notif: sn.Notification, kind: str, ptr: int, path: str) -> tuple[int | None, str | None]:
    """``(token, name)`` of a query by exec (server/protocol.py: ``execveat(fd, "", …,
    AT_EMPTY_PATH)`` whose unused 6th argument points at three words of the caller's size:
    ``QUERY_EXEC_MARK``, the token, the address of the name), else ``(None, None)``. ``mem``: the
    caller's ``/proc/PID/mem`` (borrowed). Never raises for the caller's memory: unreadable words
    are no mark, an unreadable name is None."""
    if kind != "execveat" or path or notif.args[4] != sn.AT_EMPTY_PATH or not notif.args[5]:
        return None, None
    try:
        words = os.pread(mem, 3 * ptr, notif.args[5])
    except (OSError, OverflowError):
        return None, None
    if len(words) != 3 * ptr:
        return None, None
    magic, token, at = (int.from_bytes(words[i:i + ptr], "little") for i in range(0, 3 * ptr, ptr))
    if magic != p.QUERY_EXEC_MARK:
        return None, None
    try:
        return token, os.fsdecode(sn.read_cstring(mem, at, sn.PATH_MAX))
    except (OSError, ValueError):
        return token, None


def _mntns(tid: int) -> int | None:
    """Inode of thread ``tid``'s mount namespace (``/proc/TID/ns/mnt``, namespaces(7)), None if
    it cannot be read."""
    try:
        return os.stat(f"/proc/{tid}/ns/mnt").st_ino
    except OSError:
        return None


def _root_of(tid: int) -> tuple[int, int] | None:
    """(device, inode) of thread ``tid``'s root directory (``/proc/TID/root``, proc(5)), None if
    it cannot be read."""
    try:
        st = os.stat(f"/proc/{tid}/root")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _same_kinds(exe: _Exec, expected: frozenset[str] | None) -> bool:
    """True unless ``expected`` kinds are given and the file on ``exe.fd`` is not of them now."""
    if expected is None:
        return True
    info, _problem = read_info(None, exe.fd)
    return kinds(info) == expected


def _argv_digest(argv: Sequence[bytes]) -> bytes:
    """SHA-256 of ``argv`` joined by NUL bytes (injective: an argument holds no NUL) and its count."""
    return hashlib.sha256(len(argv).to_bytes(4, "little") + b"\0".join(argv)).digest()


def _ids(proc: str) -> tuple[int, int, int]:
    """``(Tgid, PPid, uid)`` of ``proc`` (/proc/PID/status, proc(5): ``Uid:`` is real,
    effective, saved, filesystem): the effective uid (what ``SO_PEERCRED`` reports), or 0 when
    the process has root's power or can take it back (any uid 0, any permitted or effective
    capability: :func:`~execgate.server.identity.status_ids`) — judged as root (red teams
    D and E of 2026-12-02, test_attack_peer_disguise.py)."""
    with open(f"{proc}/status", "rb") as f:
        ids = status_ids(f.read())
    if ids.tgid is None or ids.ppid is None or ids.euid is None:
        raise OSError(errno.ESRCH, "no Tgid, PPid or Uid")
    return ids.tgid, ids.ppid, 0 if ids.holds_root else ids.euid


def _tgid(proc: str) -> int:
    return _ids(proc)[0]


def _locate(tid: int, path: str, dirfd: int, flags: int, *, tgid: int, own_proc: bool) -> tuple[str, int]:
    """The exec's file: the name the caller gives it (absolute, lexically normalised) and an
    ``O_PATH`` fd (owned by the caller of this function) of the very file the kernel will run.

    ``execveat(fd, "", …, AT_EMPTY_PATH)`` runs the file open on ``fd`` (``/proc/TID/fd/N``, which
    open follows to that very file); a path is resolved from the caller's root as the kernel does
    (:func:`~execgate.server.identity.walk`: never lexically normalised first, so ``link/..`` is the
    parent of the link's target), a relative one from the caller's cwd or ``dirfd``,
    ``/proc/self/fd/N`` and ``/dev/fd/N`` as the open files of the thread group ``tgid`` (its
    leader's fd table), ``/proc/thread-self/fd/N`` as thread ``tid``'s — only with ``own_proc``
    (the caller is in the session's mount namespace: its ``/proc`` is the one the session started
    with); otherwise such paths are Unnamed (a ``/proc`` of the caller's own makes them lead
    elsewhere for the kernel).

    Raises:
        Unnamed: a memfd or deleted file, a path through the rest of ``/proc``, a starting
            directory whose name leads elsewhere in the caller's view.
        OSError: the path does not resolve (``ENOENT``, ``ENOTDIR``, ``ELOOP``, ``EBADF`` … as the
            exec would fail).
    """
    if path == "" and flags & sn.AT_EMPTY_PATH:
        try:
            walked = open_fd_of(tid, dirfd)
        except Unresolved as exc:
            raise Unnamed(str(exc)) from exc
        except FileNotFoundError as exc:
            raise OSError(errno.EBADF, f"fd {dirfd} is not open") from exc
        return os.path.normpath(walked.real_path), walked.fd
    if not path:
        raise OSError(errno.ENOENT, "empty path")
    try:
        root = open_root(tid)
    except OSError as exc:
        raise sn.NotificationGone from exc
    try:
        if not path.startswith("/"):
            link = f"/proc/{tid}/cwd" if dirfd == sn.AT_FDCWD else f"/proc/{tid}/fd/{dirfd}"
            path = os.path.join(_dir_of(root, link), path)
        walked = walk(root, path, fds_of=(tid, tgid) if own_proc else None)
    except Unresolved as exc:
        raise Unnamed(f"{path} cannot be identified: {exc}") from exc
    finally:
        os.close(root)
    return os.path.normpath(path), walked.fd


def _dir_of(root: int, link: str) -> str:
    """The path, in the caller's view (``root``, borrowed), of the directory a magic link of the
    caller names (``/proc/TID/cwd``, ``/proc/TID/fd/N``, proc(5)): its kernel name, accepted only
    if it leads to that very directory there (the name is the server's view of it).

    Raises:
        Unnamed: the name leads elsewhere (a directory outside the caller's view, or moved).
        OSError: the link does not exist (``EBADF``: no such fd, as the exec would fail).
    """
    try:
        name = os.readlink(link)
        st = os.stat(link)
    except OSError as exc:
        raise OSError(errno.EBADF, f"{link}: {exc.strerror}") from exc
    try:
        found = walk(root, name) if name.startswith("/") else None
    except OSError:
        found = None
    if found is None:
        raise Unnamed(f"the directory {name} cannot be found in the caller's view")
    os.close(found.fd)
    if (found.st.st_dev, found.st.st_ino) != (st.st_dev, st.st_ino):
        raise Unnamed(f"the directory open as {name} is another one in the caller's view")
    return found.real_path


def _is_listener(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:seccomp notify"
    except OSError:
        return False
