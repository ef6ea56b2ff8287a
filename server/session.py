"""A session: one sandboxed shell (or one agent) and every exec it makes.

A session owns:

* the ``AF_UNIX SOCK_DGRAM`` socketpair of the handshake. The client end's number is exported as
  ``CODEX_ESCALATE_SOCKET`` and is inheritable; the caller spawns its shell, then calls
  :meth:`Session.close_client_socket` so that only the shell holds it.
* the **fallback socket path** (execgate extension, documented in :mod:`execgate.server.protocol`):
  a ``SOCK_STREAM`` listener at ``<private dir, 0700>/s`` (mode 0600), exported as
  ``EXECGATE_SOCKET_PATH``. Programs such as CPython's ``subprocess`` close inherited fds in their
  children, which would otherwise leave the grandchildren unable to reach the server. Each accepted
  connection whose peer uid (``SO_PEERCRED``, unix(7)) is the server's uid or root is served exactly
  like a stream end received in a handshake. A bwrap sandbox binds the directory back in
  **read-only** (:mod:`execgate.server.sandbox`): connect(2) works there, unlink, rename and bind
  do not, so nothing inside (root included) can stand a fake server at this path.
* its concurrency (:class:`~execgate.server.escalation.Limits`): at most ``max_concurrent``
  decisions at once; further connections wait for a slot in arrival order (never refused for
  this); an escalated command gives its slot back once started. Only past ``max_connections``
  connections held at once (waiting, deciding or supervising) is an exec denied, saying so.
* optionally the seccomp backstop (:mod:`.backstop`, ``seccomp_launcher``): the shell is started by
  a launcher whose seccomp listener the session serves, so that every exec of its processes reaches
  the policy; the per-exec handler tells it (``on_run``) what the wrapper was just allowed to run.
* notes for the user (``on_note``): why a program a rule would escalate stays in the sandbox, which
  rule sandboxed an escalation that failed; each told once.
* every escalated process group it started: closing the session (``async with`` exit,
  :meth:`Session.close`, or cancellation of the owner) SIGTERMs them, SIGKILLs them after the grace
  period and reaps the leaders.
* its containment scope (:mod:`.containment`, :attr:`Session.scope`): with a cgroup, every process
  spawned for the session (escalated commands, and a shell spawned with
  :attr:`Session.placement`) starts in the session's cgroup, and closing the session kills what is
  left there — daemons that left their process group included — then removes the cgroup; with the
  subreaper, closing kills every orphan reparented to this process.

Caveat: a group whose leader has exited but whose members still run stays tracked until the session
closes; its id is signalled then even if, in between, the last member died and the kernel reused the
id (needs the pid space to wrap around within one session's life).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import shutil
import socket
import struct
import tempfile
import uuid
from typing import Callable, Mapping, Union

from execgate.server import protocol as p
from execgate.server.backstop import Backstop
from execgate.server.escalation import OPEN_TIMEOUT_S, Limits, handle_connection, open_in_thread
from execgate.server.exec_facts import Coverage, learn
from execgate.server.fdpass import close_fds, encode_frame, recv_datagram_nowait, wait_readable
from execgate.server.identity import NotTheCallersDirectory, caller_directory, peer_cred, status_ids
from execgate.server.policy import ExecFacts, Permissions, Policy, SessionContext
from execgate.server.containment import NONE, Containment, Placement, Scope
from execgate.server.session_start import StartPolicy
from execgate.server.spawn import ChildProcess, running_pids, signal_group

log = logging.getLogger(__name__)

#: Extra env-overlay variables: a mapping, or a callable given the session (after its own overlay
#: is set) that returns one. E.g. the preload shim adds ``LD_PRELOAD`` and ``EXECGATE_*`` variables.
ExtraEnv = Union[Mapping[str, str], Callable[["Session"], Mapping[str, str]]]

#: Most different notes (:meth:`Session._note`) told per session; later ones are dropped.
MAX_NOTES = 32

#: Where sessions' private fallback-socket directories are made unless the server names another.
DEFAULT_SOCKET_PARENT = "/tmp"

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;} (unix(7))


class Session:
    """One session; create it with :meth:`EscalateServer.start_session` inside a running loop.

    Attributes:
        context: what the policy sees (session id, labels, sandbox profile).
        env_overlay: variables to add to the shell's environment: ``CODEX_ESCALATE_SOCKET``,
            ``EXEC_WRAPPER``, ``EXECGATE_SOCKET_PATH`` and the server's extras.
        client_fd: the client end of the handshake socketpair (inheritable), or -1 once closed.
        socket_path: the fallback socket path.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        wrapper: str,
        session_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        sandbox: Permissions | None = None,
        extra_env: ExtraEnv | None = None,
        limits: Limits | None = None,
        socket_dir: str | None = None,
        seccomp_launcher: str | None = None,
        on_note: Callable[[str], None] | None = None,
        containment: Containment | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()  # RuntimeError before any resource exists
        #: The policy, wrapped so that the session's own start is not a decision (:mod:`.session_start`).
        self.policy = StartPolicy(policy)
        self.limits = limits or Limits()
        self.context = SessionContext(
            session_id=session_id or uuid.uuid4().hex, labels=dict(labels or {}), sandbox=sandbox
        )
        _check_bounds(self.context)
        self._children: set[ChildProcess] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # listeners and bookkeeping
        self._conns: set[asyncio.Task[None]] = set()  # one per connection being served
        self._supervising: set[asyncio.Task[None]] = set()  # the subset with an escalated child
        self._slots = asyncio.Semaphore(self.limits.max_concurrent)  # decisions in progress
        self._closed = False
        self._loop = loop
        self._on_note = on_note
        self._notes: set[str] = set()
        # Under /tmp, not TMPDIR: a TMPDIR inside the working directory would put the socket in a
        # writable root of the sandbox (and /tmp is short, for AF_UNIX's 108-byte paths).
        self._dir = tempfile.mkdtemp(prefix="execgate-", dir=socket_dir or DEFAULT_SOCKET_PARENT)  # mode 0700
        box = self.context.sandbox
        if box is not None:
            # Every sandboxed escalation binds this directory read-only too. Where the session's
            # /tmp is a host directory shared with its escalations, the directory is a mount point
            # in the session only: an escalation could rename it away there and the session could
            # put a fake server at its path (review round 4).
            self.context = dataclasses.replace(
                self.context, sandbox=dataclasses.replace(box, readable_roots=(*box.readable_roots, self._dir)))
        try:
            #: This session's share of the containment (:mod:`.containment`); an empty cgroup is
            #: left to the process's supervisor should what follows fail.
            self.scope: Scope = (containment or NONE).open_scope()
            self.socket_path = os.path.join(self._dir, "s")
            self._listener = _listen(self.socket_path)
            self._server_sock, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._server_sock.setblocking(False)
        self.client_fd = client.detach()
        os.set_inheritable(self.client_fd, True)
        self.env_overlay: dict[str, str] = {
            p.ESCALATE_SOCKET_ENV_VAR: str(self.client_fd),
            p.EXEC_WRAPPER_ENV_VAR: os.path.abspath(wrapper),
            p.SOCKET_PATH_ENV_VAR: self.socket_path,
        }
        if getattr(self.policy, "answers_queries", False) is True:
            self.env_overlay[p.CACHED_QUERY_ENV_VAR] = "1"  # the shim may ask first (protocol doc)
        self.env_overlay.update(extra_env(self) if callable(extra_env) else (extra_env or {}))
        #: What the session's interception sees (preload ABIs, backstop): for "children unseen".
        self.coverage = Coverage.of_session(self.env_overlay, seccomp=seccomp_launcher is not None)
        #: The seccomp backstop (:mod:`.backstop`) when a launcher was given, else None.
        self.backstop: Backstop | None = None
        if seccomp_launcher is not None:
            self.backstop = Backstop(
                launcher=seccomp_launcher,
                wrapper=self.env_overlay[p.EXEC_WRAPPER_ENV_VAR],  # after the extras: the one the shell gets
                policy=self.policy, context=self.context,
                max_concurrent=self.limits.max_concurrent, max_bytes=self.limits.max_frame_bytes,
                coverage=self.coverage, on_note=self._note,
            )
            if self.backstop.query_token is not None and p.CACHED_QUERY_ENV_VAR in self.env_overlay:
                # The shim's query by exec (protocol doc): no socket work for an answered exec.
                self.env_overlay[p.BACKSTOP_QUERY_ENV_VAR] = str(self.backstop.query_token)
            self._spawn_task(self.backstop.serve())
        self._spawn_task(self._serve_handshakes())
        self._spawn_task(self._serve_fallback())

    @property
    def session_id(self) -> str:
        return self.context.session_id

    @property
    def socket_dir(self) -> str:
        """The private (0700) directory holding the fallback socket; removed when the session closes."""
        return self._dir

    @property
    def placement(self) -> Placement | None:
        """Pass to :func:`~execgate.server.spawn.spawn` for a process of this session (its shell)."""
        return self.scope.placement

    @property
    def children(self) -> frozenset[ChildProcess]:
        """Escalated processes started and still tracked (see the module caveat)."""
        return frozenset(self._children)

    def close_client_socket(self) -> None:
        """Close the server process's copy of the client end (after spawning the shell). Idempotent."""
        if self.client_fd >= 0:
            os.close(self.client_fd)
            self.client_fd = -1

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop serving, kill every escalated process group (TERM, then KILL after
        ``limits.kill_grace_s``), reap their leaders, kill what is left in the session's
        containment (:mod:`.containment`) and remove the fallback socket. Idempotent.

        Children are killed before their connections are dropped, so that each wrapper still gets
        its child's status (e.g. 143) rather than a broken stream.
        """
        if self._closed:
            return
        self._closed = True
        await _cancel(self._tasks)
        if self.backstop is not None:
            await self.backstop.close()
        self._server_sock.close()
        self._listener.close()
        self.close_client_socket()
        shutil.rmtree(self._dir, ignore_errors=True)
        await _cancel(self._conns - self._supervising)
        await self._kill_children()
        await self.scope.close(exclude=running_pids())
        # Let each supervising connection send its child's status; cancel stragglers.
        if self._supervising:
            await asyncio.wait(self._supervising, timeout=1.0)
        await _cancel(self._conns)
        await self._policy_session_closed()

    async def _policy_session_closed(self) -> None:
        """Tell a policy that keeps per-session state (the gRPC client's decision cache, whose
        hits are audited in batches) that this session ended; a failure is logged, not raised."""
        closed = getattr(self.policy, "session_closed", None)
        if closed is None:
            return
        try:
            result = closed(self.session_id)
            if inspect.isawaitable(result):
                await result
        except Exception:  # noqa: BLE001 - the session is closed whatever the policy says
            log.exception("session %s: policy session_closed failed", self.session_id)

    async def _kill_children(self) -> None:
        children = list(self._children)
        self._children.clear()
        await asyncio.gather(*(c.terminate_group(self.limits.kill_grace_s) for c in children))

    def _spawn_task(self, coro: object, tasks: set[asyncio.Task[None]] | None = None) -> None:
        bucket = self._tasks if tasks is None else tasks
        task = self._loop.create_task(coro)  # type: ignore[arg-type]
        bucket.add(task)
        task.add_done_callback(bucket.discard)

    async def _serve_handshakes(self) -> None:
        """Serve handshakes until cancelled (or the socket fails). A reader callback stays
        registered on the datagram socket and takes the datagrams waiting each time it is
        readable: no future, task step or epoll change per exec."""
        fd = self._server_sock.fileno()
        stopped: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(fd, self._take_handshakes, stopped)
        try:
            await stopped
        finally:
            self._loop.remove_reader(fd)

    def _take_handshakes(self, stopped: asyncio.Future[None]) -> None:
        """Reader callback: serve one waiting handshake. The socket is level-triggered: if more
        wait, the next loop iteration calls again (no read that finds nothing per exec)."""
        if stopped.done():
            return
        try:
            _, fds = recv_datagram_nowait(self._server_sock, max_fds=self.limits.max_fds)
        except BlockingIOError:
            return
        except p.ProtocolError as exc:
            log.warning("session %s: handshake dropped: %s", self.session_id, exc)
            return
        except OSError as exc:
            log.error("session %s: handshake socket failed, no more execs served on it: %s", self.session_id, exc)
            stopped.set_result(None)
            return
        if len(fds) != 1:
            close_fds(fds)
            log.warning("session %s: handshake with %d fds dropped", self.session_id, len(fds))
            return
        conn = _stream_socket(fds[0])
        if conn is None:
            log.warning("session %s: handshake fd is not a Unix stream socket", self.session_id)
            return
        self._serve(conn)

    async def _serve_fallback(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                await wait_readable(self._listener)
                continue
            except OSError as exc:  # e.g. EMFILE: back off instead of spinning
                log.error("session %s: accept failed: %s", self.session_id, exc)
                await asyncio.sleep(0.1)
                continue
            uid = _peer_uid(conn)
            if uid not in (os.getuid(), 0):
                log.warning("session %s: fallback peer uid %s refused", self.session_id, uid)
                conn.close()
                continue
            conn.setblocking(False)
            self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        """Serve ``conn`` (owned from here on) in its own task, within the concurrency limit."""
        if self._closed:
            conn.close()
            return
        if len(self._conns) >= self.limits.max_connections:
            log.warning("session %s: %d execs in flight, refusing one", self.session_id, len(self._conns))
            reason = (f"too many execs in flight in this session: {len(self._conns)} waiting, deciding or "
                      f"running escalated (hard cap {self.limits.max_connections})")
            try:
                conn.send(encode_frame(p.EscalateResponse("Deny", reason=reason).to_json()), socket.MSG_NOSIGNAL)
            except OSError:
                pass
            conn.close()
            return
        self._spawn_task(self._serve_in_turn(conn), self._conns)

    async def _serve_in_turn(self, conn: socket.socket) -> None:
        """Serve ``conn`` once one of the ``limits.max_concurrent`` decision slots is free (FIFO:
        asyncio.Semaphore wakes waiters in order). An escalated command gives its slot back as
        soon as it has started, so that commands running in parallel (a build's jobs) never keep
        the session's other execs from being decided."""
        try:
            await self._slots.acquire()
        except BaseException:  # cancelled while waiting: the connection is still ours to close
            conn.close()
            raise
        held = True
        on_run = None
        peer = peer_cred(conn)  # the wrapper: it made the socket, or connected (unix(7))
        pid, uid = (None, None) if peer is None else peer
        if pid is not None and uid != 0 and _holds_root(pid):
            uid = 0  # SO_PEERCRED is the euid when the socket was made: root may have dropped it then
        if self.backstop is not None and pid is not None:
            backstop, caller = self.backstop, pid
            def on_run(program: str, argv: list[str], ident: tuple[int, int, int, int] | None, child: bool = False,
                       judged: tuple[frozenset[str], bool] | None = None) -> None:
                # The kinds are read again at the exec for a file the caller could modify, and for
                # any file of a root caller: root can remount a writable view read-only in its
                # own mount namespace, so that the file looked unmodifiable when judged.
                recheck = judged[0] if judged is not None and (judged[1] or uid == 0) else None
                backstop.expect(caller, program, argv, ident, child=child, kinds=recheck)
        coverage = self.coverage

        async def learn_facts(program: str, fd: int | None, path: str) -> ExecFacts:
            return await learn(pid, program, coverage, uid=uid, fd=fd, path=path)

        async def caller_dir(workdir: bytes) -> int:
            if pid is None:
                raise NotTheCallersDirectory("the caller's process is unknown")
            try:
                return await open_in_thread(caller_directory, pid, workdir)
            except TimeoutError:
                raise NotTheCallersDirectory(f"checking the working directory took over {OPEN_TIMEOUT_S:g} s") from None

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._slots.release()

        def on_spawn(child: ChildProcess) -> None:
            release()
            self._track(child)

        try:
            await handle_connection(conn, policy=self.policy, context=self.context, limits=self.limits,
                                    on_spawn=on_spawn, on_run=on_run, learn=learn_facts, on_note=self._note,
                                    placement=self.scope.placement, caller_dir=caller_dir)
        finally:
            release()

    def _note(self, text: str) -> None:
        """Tell the user ``text`` once per session (at most :data:`MAX_NOTES` different ones): the
        ``on_note`` hook, else a WARNING log line."""
        if text in self._notes or len(self._notes) >= MAX_NOTES:
            return
        self._notes.add(text)
        if self._on_note is not None:
            self._on_note(text)
        else:
            log.warning("session %s: %s", self.session_id, text)

    def _track(self, child: ChildProcess) -> None:
        # Called from the connection's own task right after the spawn, never after close() began:
        # close() cancels every connection without a child before it looks at the children.
        self._children.add(child)
        task = asyncio.current_task()
        if task is not None:
            self._supervising.add(task)
            task.add_done_callback(self._supervising.discard)
        self._spawn_task(self._untrack_when_gone(child))

    async def _untrack_when_gone(self, child: ChildProcess) -> None:
        await child.wait()
        if not signal_group(child.pgid, 0):  # leader reaped and no member left
            self._children.discard(child)


def _check_bounds(context: SessionContext) -> None:
    """Raises ValueError if the session id, labels or sandbox roots exceed their bounds
    (:mod:`execgate.server.protocol`); the policy service would refuse every request otherwise."""
    box = context.sandbox
    roots = () if box is None else (*box.writable_roots, *box.readable_roots, *box.masked_dirs,
                                    *((box.tmp_dir,) if box.tmp_dir else ()))
    violation = p.session_bounds_violation(context.session_id, context.labels, roots)
    if violation is not None:
        raise ValueError(violation)


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _listen(path: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)  # the 0700 directory already keeps others out during the gap
        listener.listen(64)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener


def _peer_uid(conn: socket.socket) -> int | None:
    try:
        _, uid, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return uid


def _stream_socket(fd: int) -> socket.socket | None:
    """Wrap a received fd if it is an ``AF_UNIX SOCK_STREAM`` socket; otherwise close it."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def _holds_root(pid: int) -> bool:
    """True if process ``pid`` has root's power or can take it back: any of its user ids (real,
    effective, saved, file system: ``/proc/PID/status`` ``Uid:``, proc(5)) is 0, or it holds any
    permitted or effective capability (``CapPrm:``, ``CapEff:``: root that set its uids to another
    with ``PR_SET_KEEPCAPS`` keeps ``CAP_SETUID``, ``CAP_DAC_OVERRIDE``…); also when they cannot be
    read. ``SO_PEERCRED`` is only the effective uid when the socket was made (red teams D and E of
    2026-12-02: test_attack_peer_disguise.py)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return status_ids(f.read()).holds_root
    except OSError:
        return True
