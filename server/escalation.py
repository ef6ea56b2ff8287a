"""One intercepted exec on the server side: read the request, ask the policy, answer, and for an
Escalate spawn the prepared command on the caller's fds and report its exit status.

The connection is the ``SOCK_STREAM`` end received in a handshake (or accepted on the session's
fallback socket path; both are handled identically). Every failure here — bad frame, timeout,
broken peer — is logged and closes this connection only; the session keeps serving. A request
past an input bound (:mod:`execgate.server.protocol`, ``MAX_*``) is answered with a Deny naming
the bound before the policy is asked.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Awaitable, Callable

from execgate.server import protocol as p
from execgate.server.fdpass import PeerClosedError, close_fds, recv_frame, send_frame
from execgate.server.policy import Decision, ExecFacts, Execution, Policy, PolicyError, PreparedExec, SessionContext
from execgate.server.containment import Placement
from execgate.server.exec_facts import read_info
from execgate.server.identity import NotTheApprovedFile, NotTheCallersDirectory, reopen_identified
from execgate.server.spawn import DEFAULT_KILL_GRACE_S, ChildProcess, spawn

log = logging.getLogger(__name__)

#: Seconds an escalation waits for the file system (its working directory, its program re-opened).
OPEN_TIMEOUT_S = 2.0


async def open_in_thread(opener: Callable[..., int], *args: object, timeout_s: float = OPEN_TIMEOUT_S) -> int:
    """``opener(*args)`` — file system calls that return an fd, on a path the session chose — in
    a worker thread, bounded by ``timeout_s`` seconds (a path on a stalled mount must not hold the
    event loop). The fd is the caller's; one opened after a timeout or cancellation is closed when
    the thread finishes.

    Raises:
        TimeoutError: past ``timeout_s``; else whatever ``opener`` raises.
    """
    done = asyncio.ensure_future(asyncio.to_thread(opener, *args))
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.shield(done)
    except BaseException:
        done.add_done_callback(_close_result)
        raise


def _close_result(done: asyncio.Future[int]) -> None:
    if not done.cancelled() and done.exception() is None:
        os.close(done.result())

#: Signal numbers the server accepts in ``{"signal": N}`` frames.
FORWARDABLE_SIGNALS = frozenset(int(getattr(signal, name)) for name in p.FORWARDED_SIGNALS)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-session limits (docs/DESIGN.md §2 defaults).

    Attributes:
        max_frame_bytes: largest accepted frame payload, bytes.
        max_fds: most fds accepted on one message.
        request_timeout_s: deadline for the request frame after the handshake (and for the
            SuperExec frame after an Escalate answer), seconds.
        max_concurrent: most decisions a session works on at once (reading the request, asking
            the policy, preparing and starting an escalated command). Further connections wait
            for a slot in arrival order; they are never refused for this. An escalated command
            gives its slot back once started: waiting on it costs no slot.
        kill_grace_s: seconds between SIGTERM and SIGKILL when killing a process group.
        max_connections: hard cap on the connections a session holds at once — waiting for a
            slot, deciding, or supervising a running escalated command; each holds one file
            descriptor of the server. Past it an exec gets a Deny saying so.
    """

    max_frame_bytes: int = p.MAX_FRAME_BYTES
    max_fds: int = p.MAX_FDS_PER_MESSAGE
    request_timeout_s: float = p.REQUEST_READ_TIMEOUT_S
    max_concurrent: int = p.MAX_CONCURRENT_REQUESTS_PER_SESSION
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    max_connections: int = p.MAX_CONNECTIONS_PER_SESSION


def resolve_program(file: str, workdir: str) -> str:
    """Absolute program path: ``file`` resolved lexically against ``workdir`` (no symlinks read).

    Raises:
        ProtocolError: ``workdir`` is not absolute.
        BoundsError: the resolved path is longer than PATH_MAX (both parts were within it).
    """
    if not os.path.isabs(workdir):
        raise p.ProtocolError(f"request.workdir is not absolute: {workdir!r}")
    program = os.path.normpath(os.path.join(workdir, file))
    violation = p.path_bounds_violation({"program path (workdir joined with file)": program})
    if violation is not None:
        raise p.BoundsError(violation)
    return program


async def handle_connection(
    conn: socket.socket,
    *,
    policy: Policy,
    context: SessionContext,
    limits: Limits,
    on_spawn: Callable[[ChildProcess], None],
    on_run: Callable[..., None] | None = None,
    learn: Callable[[str, int | None, str], Awaitable[ExecFacts]] | None = None,
    on_note: Callable[[str], None] | None = None,
    placement: Placement | None = None,
    caller_dir: Callable[[bytes], Awaitable[int]] | None = None,
) -> None:
    """Serve one exec on ``conn`` (non-blocking stream socket, owned and closed here).

    Args:
        on_spawn: called with each escalated child right after it starts, so that the session can
            kill its process group when the session closes.
        on_run: called with the program (absolute), argv and the identified file's
            ``(st_dev, st_ino, st_ctime_ns, st_size)`` (or None) just before a Run answer is sent (the seccomp backstop
            lets the wrapper's exec of exactly that through undecided); then whether the Run is
            for the caller's child (a cached-only query for a ``posix_spawn``,
            :data:`~execgate.server.protocol.CACHED_FOR_CHILD_EXTENSION_FIELD`), and the file's
            file's kinds and whether the caller could modify it (:func:`_judged_kinds`).
        learn: given the program (absolute, lexically normalised), the wrapper's target fd
            (owned: ``learn`` closes it; None without one) and the path as the kernel resolves it
            (``file`` joined to ``workdir``, not normalised), what the server learns of the file
            in the caller's view
            (:func:`execgate.server.exec_facts.learn`); sent to a policy that accepts facts.
            None: nothing is learnt (no trust for basename rules, file facts unknown).
        on_note: called with a line for the user: a Run or Escalate decision's ``note`` (why a
            program a rule would escalate stays in the sandbox; which variables the caller set
            for an escalated program it will not get), and, when a sandboxed escalation fails,
            which rule sandboxed it and how (:func:`failure_note`).
        placement: the session's containment, for escalated commands (:mod:`.containment`).
        caller_dir: given the directory an escalated command is to start in (the request's
            ``workdir``, as the bytes it stands for), an fd (owned by the caller of
            ``caller_dir``) on the caller's own working directory, if that path names it where
            the command starts
            (:func:`execgate.server.identity.caller_directory`); raises
            :class:`~execgate.server.identity.NotTheCallersDirectory` or OSError if not: the
            escalation is then refused, saying why. The command starts in that very directory (by
            its fd: a symlink swapped in after the check changes nothing). None: not checked.

    Never raises for peer errors (they are logged); propagates cancellation.
    """
    try:
        request, program, target_fd = await _read_request(conn, limits)
        facts = await _learn(learn, program, target_fd, os.path.join(request.workdir, request.file))
        if request.cached_only:  # the shim's query: a Run given without asking anyone, or nothing
            decision = await query_run(policy, program, list(request.argv), request.workdir, context, facts)
            if decision is None:
                await _send(conn, p.EscalateResponse(p.UNDECIDED_ACTION))
                return
        else:
            decision = await _decide(policy, program, request, context, facts)
        decision = _same_file_outside(decision, program, facts)
        if decision.action == "run":
            if on_run is not None:
                on_run(program, list(request.argv), _dev_ino(facts), request.cached_for_child, _judged_kinds(facts))
            if decision.note and on_note is not None:
                on_note(decision.note)
            await _send(conn, p.EscalateResponse("Run"))
        elif decision.action == "escalate":
            if decision.note and on_note is not None:  # e.g. a variable the caller set that it will not get
                on_note(decision.note)
            status = await _escalate(conn, policy, program, request, decision, context, limits, on_spawn, facts,
                                     placement, caller_dir)
            if status and on_note is not None and (note := failure_note(program, decision, status,
                                                                         context.sandbox is not None)):
                on_note(note)
        else:
            await _send(conn, p.EscalateResponse("Deny", reason=decision.reason))
    except p.BoundsError as exc:  # a ProtocolError, but one the caller should read
        await _refuse(conn, exc, context)
    except TimeoutError:
        log.warning("session %s: peer too slow, connection closed", context.session_id)
    except PeerClosedError as exc:
        log.info("session %s: peer closed the connection: %s", context.session_id, exc)
    except p.ProtocolError as exc:
        log.warning("session %s: protocol error, connection closed: %s", context.session_id, exc)
    except OSError as exc:
        log.warning("session %s: connection failed: %s", context.session_id, exc)
    except Exception:  # a bug here must not take the session down; log it with its traceback
        log.exception("session %s: unexpected error serving a connection", context.session_id)
    finally:
        conn.close()


async def _read_request(conn: socket.socket, limits: Limits) -> tuple[p.EscalateRequest, str, int | None]:
    """Read the request frame.

    Returns:
        ``(request, program, target_fd)``: ``program`` is ``file`` resolved lexically against
        ``workdir`` (what the policy names and an escalation spawns); ``target_fd`` the wrapper's
        target fd (owned by the caller of this function), or None.

    Raises:
        TimeoutError: no frame within ``limits.request_timeout_s``.
        ProtocolError, BoundsError, OSError: as :func:`recv_frame` and ``EscalateRequest.from_payload``;
            also a target-fd field without exactly one fd, or an fd without the field. Any fd
            received is closed then.
    """
    # The deadline is armed only if the frame is not there yet (usually it is: the wrapper sends
    # it right after the handshake). The wrapper then waits for the answer: one read (sole).
    payload, fds = await recv_frame(conn, max_bytes=limits.max_frame_bytes, max_fds=1,
                                    timeout_s=limits.request_timeout_s, sole=True)
    try:
        request = p.EscalateRequest.from_payload(payload)
        if request.target_fd != (len(fds) == 1):
            raise p.ProtocolError(f"request has {p.TARGET_FD_EXTENSION_FIELD}={request.target_fd} "
                                  f"but {len(fds)} fds attached")
        program = resolve_program(request.file, request.workdir)
    except BaseException:
        close_fds(fds)
        raise
    return request, program, (fds[0] if fds else None)


async def _learn(learn: Callable[[str, int | None, str], Awaitable[ExecFacts]] | None, program: str,
                 fd: int | None, path: str) -> ExecFacts | None:
    """What ``learn`` says of the file (it owns ``fd``); None, with ``fd`` closed, without it."""
    if learn is None:
        close_fds([] if fd is None else [fd])
        return None
    return await learn(program, fd, path)


def _same_file_outside(decision: Decision, program: str, facts: ExecFacts | None) -> Decision:
    """``decision``, or a Deny when it escalates a program whose path, in the server's own view
    (where an escalated command is spawned), names another file than the caller would run."""
    identity = None if facts is None else facts.identity
    if decision.action != "escalate" or identity is None or identity.same_for_server:
        return decision
    return Decision.deny(
        f"{program} is not the same file outside the sandbox (where an escalated command "
        f"runs) as the one the caller would run ({identity.real_path or 'unnamed'})",
        rule_id=decision.rule_id, decision_id=decision.decision_id)


def _judged_kinds(facts: ExecFacts | None) -> tuple[frozenset[str], bool] | None:
    """``(kinds, caller_can_modify)`` of the identified file, or None: where the caller could
    change the file, its contents may be rewritten between this Run and the exec, even keeping
    its change time, so the backstop reads its kinds again (the session also does so for a root
    caller, who can remount what looked read-only)."""
    identity = None if facts is None else facts.identity
    return None if identity is None or facts is None else (facts.kinds, identity.caller_can_modify)


def _dev_ino(facts: ExecFacts | None) -> tuple[int, int, int, int] | None:
    """``(st_dev, st_ino, st_ctime_ns, st_size)`` of the identified file, or None."""
    identity = None if facts is None else facts.identity
    return None if identity is None else (identity.device, identity.inode, identity.changed_ns, identity.size)


async def _send(conn: socket.socket, message: Any) -> None:
    await send_frame(conn, message.to_json())


async def _refuse(conn: socket.socket, exc: p.BoundsError, context: SessionContext) -> None:
    """Deny a request that exceeds an input bound, naming the bound. INFO, not WARNING: the
    caller's stderr gets the Deny already, and a flood must not also flood the terminal."""
    log.info("session %s: request refused: %s", context.session_id, exc)
    try:  # a Deny frame is small: the socket's send buffer takes it without waiting on the peer
        await _send(conn, p.EscalateResponse("Deny", reason=f"request refused: {exc}"))
    except (OSError, p.ProtocolError) as send_exc:  # PeerClosedError is a ProtocolError
        log.info("session %s: could not send the refusal: %s", context.session_id, send_exc)


def facts_kw(policy: Policy, facts: ExecFacts | None) -> dict[str, Any]:
    """``{"facts": facts}`` for a policy that opts in (``accepts_facts``, Policy doc) when there
    are facts, else {}."""
    return {"facts": facts} if facts is not None and getattr(policy, "accepts_facts", False) else {}


async def query_run(policy: Policy, program: str, argv: list[str], workdir: str, context: SessionContext,
                    facts: ExecFacts | None) -> Decision | None:
    """The policy's answer to the shim's query (by socket, or by exec through the seccomp
    backstop: server/protocol.py): a Run it gives without asking anyone
    (``policy.query_run``, an optional method, plain or async: the decision cache's hit in
    :class:`~execgate.server.grpc_policy.GrpcPolicy`, the rules' own Run in
    :class:`~execgate.policy_service.inprocess.InProcessPolicy`), else None: no such method, no
    facts identifying the file, another answer, or any failure (the wrapper then asks)."""
    lookup = getattr(policy, "query_run", None)
    if lookup is None or facts is None or facts.identity is None:
        return None
    try:
        decision = lookup(program, argv, workdir, context, facts)
        if inspect.isawaitable(decision):
            decision = await decision
    except Exception:  # a bug here must cost a full decision, never a Run
        log.exception("session %s: query for %s failed", context.session_id, program)
        return None
    return decision if isinstance(decision, Decision) and decision.action == "run" else None


async def _decide(policy: Policy, program: str, request: p.EscalateRequest, context: SessionContext,
                  facts: ExecFacts | None) -> Decision:
    try:
        # Opt-in (Policy doc): the environment lets a prompt show the approver what reaches the command.
        # A read-only view, not a copy: a cache hit never looks at it.
        extra: dict[str, Any] = ({"env": MappingProxyType(request.env)} if getattr(policy, "accepts_env", False)
                                 else {})
        extra.update(facts_kw(policy, facts))
        decision = await policy.determine_action(program, list(request.argv), request.workdir, context, **extra)
    except Exception as exc:  # fail closed: any policy failure is a Deny naming the cause
        log.error("session %s: policy failed for %s: %r", context.session_id, program, exc)
        return Decision.deny(_failure_reason(exc), error=True)
    if not isinstance(decision, Decision) or decision.action not in ("run", "escalate", "deny"):
        log.error("session %s: policy returned %r", context.session_id, decision)
        return Decision.deny("policy error: malformed decision", error=True)
    return decision


async def _escalate(
    conn: socket.socket,
    policy: Policy,
    program: str,
    request: p.EscalateRequest,
    decision: Decision,
    context: SessionContext,
    limits: Limits,
    on_spawn: Callable[[ChildProcess], None],
    facts: ExecFacts | None = None,
    placement: Placement | None = None,
    caller_dir: Callable[[bytes], Awaitable[int]] | None = None,
) -> int | None:
    """Prepare, spawn and supervise an escalated command; its status, or None if none was
    spawned or nobody is left to tell. A command prepared to start in the request's working
    directory starts there only if that is the caller's own (``caller_dir``, handle_connection)."""
    execution = decision.execution or Execution()
    try:
        prepared = await policy.prepare_escalated_exec(  # the rule that decided may depend on the facts
            program, list(request.argv), request.workdir, dict(request.env), execution, context,
            **facts_kw(policy, facts),
        )
        if not isinstance(prepared, PreparedExec) or not prepared.command:
            raise ValueError(f"malformed prepared exec {prepared!r}")
    except Exception as exc:  # fail closed
        log.error("session %s: prepare_escalated_exec failed for %s: %r", context.session_id, program, exc)
        await _send(conn, p.EscalateResponse("Deny", reason=_failure_reason(exc)))
        return None
    cwd_fd = exe_fd = None
    try:
        if caller_dir is not None and prepared.cwd == request.workdir:
            cwd_fd = await caller_dir(p.wire_bytes(prepared.cwd))
    except (NotTheCallersDirectory, OSError) as exc:
        why = exc if isinstance(exc, NotTheCallersDirectory) else f"the caller's working directory: {exc}"
        log.info("session %s: escalation of %s refused: %s", context.session_id, program, why)
        await _send(conn, p.EscalateResponse("Deny", reason=f"escalation refused: {why}"))
        return None
    try:
        await _send(conn, p.EscalateResponse("Escalate", extensions={p.SIGNALS_EXTENSION_FIELD: True}))
        async with asyncio.timeout(limits.request_timeout_s):
            payload, fds = await recv_frame(conn, max_bytes=limits.max_frame_bytes, max_fds=limits.max_fds)
        try:
            stdio = _stdio_map(payload, fds)
            # Last, right before the start: the caller chose when to send its stdio.
            refused = None
            if facts is None or facts.identity is None:
                # Nothing to hold the start to: the file was not identified in the caller's view
                # (a path that did not resolve there; a client that sent no fd and a name through
                # a missing directory) — whatever the path names by now would run.
                refused = (f"{program} was not identified as a file in the caller's view"
                           + (f" ({facts.problem})" if facts is not None and facts.problem else "")
                           + ", so nothing ties what would start to what was decided")
            else:
                by_fd = prepared.command[0] == program and (facts.file is None or facts.file.format != "script")
                try:
                    exe_fd = await open_in_thread(_pinned, p.wire_bytes(program), facts, by_fd)
                except NotTheApprovedFile as exc:
                    refused = str(exc)
                except TimeoutError:
                    refused = f"re-opening {program} took over {OPEN_TIMEOUT_S:g} s"
            if refused is not None:
                log.info("session %s: escalation of %s refused: %s", context.session_id, program, refused)
                _tell(stdio, f"execgate: escalation refused: {refused}\n")
            child = 126 if refused is not None else _spawn_or_report(prepared, stdio, placement, cwd_fd, exe_fd)
        finally:
            close_fds(fds)  # the server's copies: the child has its own now
    finally:
        for fd in (cwd_fd, exe_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
    if isinstance(child, int):
        await _send(conn, p.SuperExecResult(child))
        return None
    on_spawn(child)
    status = await _supervise(conn, child, limits)
    if status is not None:
        await _send(conn, p.SuperExecResult(status))
    return status


def failure_note(program: str, decision: Decision, status: int, sandboxed: bool = True) -> str:
    """What the user is told when a sandboxed escalation exits with ``status`` != 0: the rule
    that escalated it, why, and the sandbox it ran in (network, writable roots), so that an
    ``EROFS`` or a network error can be traced to the profile. "" for an unsandboxed one, and
    for any escalation of a session without a sandbox (``sandboxed`` False: the policy service
    runs those unconfined, as the shell is; docs/DESIGN.md §7)."""
    execution = decision.execution or Execution()
    if execution.kind == "unsandboxed" or not sandboxed:
        return ""
    perms = execution.permissions
    how = ("in the session's own sandbox" if perms is None else
           f"in a sandbox with network {'on' if perms.network else 'off'}, writable only where the session "
           "can write" + (f" and {', '.join(perms.writable_roots)}" if perms.writable_roots else ""))
    rule = f"rule {decision.rule_id}" if decision.rule_id else "the default decision"
    why = f" ({decision.reason})" if decision.reason and not decision.reason.startswith("rule ") else ""
    return f"{program} exited with status {status}; {rule} escalated it{why} {how}"


def _failure_reason(exc: Exception) -> str:
    """The Deny reason for a failed policy call: a PolicyError already names its cause."""
    return str(exc) if isinstance(exc, PolicyError) else f"policy error: {exc}"


def _stdio_map(payload: bytes, fds: list[int]) -> dict[int, int]:
    message = p.SuperExecMessage.from_obj(p.decode_json(payload))
    if len(message.fds) != len(fds):
        raise p.ProtocolError(f"fds lists {len(message.fds)} destinations but {len(fds)} fds arrived")
    if len(set(message.fds)) != len(message.fds) or set(message.fds) - {0, 1, 2}:
        raise p.ProtocolError(f"fd destinations must be distinct and among 0, 1, 2: {message.fds}")
    return dict(zip(message.fds, fds))


def _pinned(program: bytes, facts: ExecFacts, by_fd: bool) -> int:
    """The approved file, checked right before it starts (in a worker thread): ``program``
    re-opened in this process's view must still be the file identified for the decision
    (:func:`~execgate.server.identity.reopen_identified`: device, inode, change time, size) and
    read as the same kind of file (:func:`~execgate.server.exec_facts.read_info`, a ``#!``
    script's interpreter resolved here: the kernel will resolve it here) — a rewrite through a
    shared mapping keeps the change time and the size, not the header. Returns the fd (owned by
    the caller) when ``by_fd`` (the command executes it), else -1 (closed: a script runs by
    path, its interpreter re-reading it by name; a sandboxed command runs its own path).

    Raises:
        NotTheApprovedFile: it was replaced or changed since.
    """
    assert facts.identity is not None
    fd = reopen_identified(program, facts.identity)
    try:
        if facts.file is not None:
            root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                info, _ = read_info(root, fd)
            finally:
                os.close(root)
            if info != facts.file:
                raise NotTheApprovedFile(f"{os.fsdecode(program)} is not the file that was decided: it now reads as "
                                         f"another kind of file, or its #! interpreter changed")
    except BaseException:
        os.close(fd)
        raise
    if by_fd:
        return fd
    os.close(fd)
    return -1


def _tell(stdio: dict[int, int], line: str) -> None:
    """Write ``line`` to the caller's stderr (fd 2 of ``stdio``), if it gave one; errors ignored."""
    if 2 in stdio:
        try:
            os.write(stdio[2], line.encode("utf-8", "surrogateescape"))
        except (OSError, UnicodeEncodeError):
            pass


def _spawn_or_report(prepared: PreparedExec, stdio: dict[int, int], placement: Placement | None = None,
                     cwd_fd: int | None = None, exe_fd: int | None = None) -> ChildProcess | int:
    """Spawn; on failure write one line to the caller's stderr and return 127/126 like a shell.

    The command, env and cwd are spawned as the exact bytes their strings stand for
    (:func:`protocol.wire_bytes`, non-UTF-8 bytes included), whatever the server's own locale.
    ``cwd_fd`` (borrowed): the directory to start in instead of ``prepared.cwd`` (the child's
    chdir goes through ``/proc/self/fd/N``, before its exec closes the fd). ``exe_fd``
    (borrowed): the file to execute instead of ``prepared.command[0]`` — the one identified and
    approved — as ``/proc/self/fd/N``, N inherited (a ``#!`` script's interpreter opens that
    name: the same file), argv[0] unchanged.
    """
    command = [p.wire_bytes(a) for a in prepared.command]
    arg0 = None if prepared.arg0 is None else p.wire_bytes(prepared.arg0)
    if exe_fd is not None and exe_fd >= 0:
        arg0 = command[0] if arg0 is None else arg0
        command[0] = b"/proc/self/fd/%d" % exe_fd
    try:
        return spawn(
            command,
            env={p.wire_bytes(k): p.wire_bytes(v) for k, v in prepared.env.items()},
            cwd=p.wire_bytes(prepared.cwd) if cwd_fd is None else f"/proc/self/fd/{cwd_fd}",
            arg0=arg0,
            stdio=stdio,
            pass_fds=() if exe_fd is None or exe_fd < 0 else (exe_fd,),
            placement=placement,
        )
    except (OSError, ValueError, p.ProtocolError) as exc:  # ValueError: NUL byte or "=" in a name
        log.warning("escalated spawn of %r failed: %s", prepared.command[0], exc)
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        _tell(stdio, f"execgate: cannot execute {prepared.command[0]}: {reason}\n")
        return 127 if isinstance(exc, FileNotFoundError) else 126


async def _supervise(conn: socket.socket, child: ChildProcess, limits: Limits) -> int | None:
    """Wait for ``child`` while forwarding signal frames. If the stream ends (EOF or a bad frame)
    first, kill the child's group and return None (nobody is left to tell)."""
    waiter = asyncio.ensure_future(child.wait())
    reader = asyncio.ensure_future(_forward_signals(conn, child, limits))
    try:
        await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done():
            return waiter.result()
        log.info("wrapper of escalated pid %d went away; killing its process group", child.pid)
        await child.terminate_group(limits.kill_grace_s)
        return None
    finally:
        for task in (waiter, reader):
            task.cancel()
        await asyncio.gather(waiter, reader, return_exceptions=True)


async def _forward_signals(conn: socket.socket, child: ChildProcess, limits: Limits) -> None:
    """Read ``{"signal": N}`` frames and deliver them to the child's group; return at EOF or on a
    protocol violation."""
    while True:
        try:
            payload, _ = await recv_frame(conn, max_bytes=limits.max_frame_bytes, max_fds=0)
            message = p.SignalMessage.from_obj(p.decode_json(payload))
        except PeerClosedError:
            return
        except (p.ProtocolError, OSError) as exc:
            log.warning("bad frame from the wrapper of pid %d: %s", child.pid, exc)
            return
        if message.signal in FORWARDABLE_SIGNALS:
            child.signal_group(message.signal)
        else:
            log.warning("ignoring forwarded signal %d for pid %d", message.signal, child.pid)
