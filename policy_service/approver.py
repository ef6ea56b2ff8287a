"""``execgate approve``: a terminal approver on the ``Approvals`` stream.

It shows each pending request (program, argv, working directory, session id and labels, the
rule and its justification, the environment the command will get, seconds left; every field
with its control characters escaped, :func:`visible`, and flagged when it had any) and reads one
answer line:

- ``y`` — approve once;
- ``s`` — approve for the session (later identical requests in that session, with the same
  working directory and environment reaching the command, of the same file, escalate unasked);
  for a file the caller can change no grant is possible, and ``s`` approves once (said under
  the request, :func:`grant_note`);
- ``n`` — deny; a second line gives an optional reason (empty: none).

Lines come from stdin, so scripted use works with piped input: ``printf 'y\\nn\\nnot now\\n' |
execgate approve --policy unix:///run/execgate/policy.sock``. End of input stops the approver.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import threading
from typing import TextIO

import grpc

from execgate.policy_service.approvals import session_grant_refusal
from execgate.server import policy_codec as codec
from execgate.server.printable import visible
from execgate.v1 import approvals_pb2 as apb
from execgate.v1 import approvals_pb2_grpc

_KEYS = {
    "y": apb.VERDICT_APPROVE_ONCE,
    "s": apb.VERDICT_APPROVE_FOR_SESSION,
    "n": apb.VERDICT_DENY,
}


class LineReader:
    """Reads lines of a blocking text stream in a daemon thread, for the event loop.

    A daemon thread (not the loop's executor) so that a pending ``readline`` on a terminal never
    keeps the process from exiting.
    """

    def __init__(self, stream: TextIO) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._eof = asyncio.Event()
        self._ended = False  # the end of input was read: every later readline answers None at once
        threading.Thread(target=self._pump, args=(stream,), daemon=True, name="execgate-approve-stdin").start()

    def _pump(self, stream: TextIO) -> None:
        for line in stream:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, line.rstrip("\n"))
        self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
        self._loop.call_soon_threadsafe(self._eof.set)

    @property
    def exhausted(self) -> bool:
        """True when input has ended and every line before the end has been read."""
        return self._eof.is_set() and self._queue.qsize() <= 1

    async def readline(self) -> str | None:
        """The next line without its newline, or None at (and after) the end of input."""
        if self._ended:
            return None
        line = await self._queue.get()
        self._ended = line is None
        return line


#: Shown on a line of its own under the header when any field of a request held a character
#: that :func:`visible` escaped.
CONTROLS_FLAG = "   WARNING: this request contains control characters, shown escaped (\\xNN, \\uNNNN)"


def has_hidden(*texts: str) -> bool:
    """True if any of ``texts`` holds a character :func:`visible` escapes."""
    return any(visible(t) != t for t in texts)


def raw_fields(pending: apb.PendingApproval) -> list[str]:
    """Every text of the request an approver is shown, raw (for :func:`has_hidden`)."""
    target, session = pending.target, pending.session
    texts = [pending.request_id, target.program, *target.argv, target.workdir, session.session_id,
             pending.rule_id, pending.reason, target.file_problem, target.identity.real_path,
             target.file.interpreter, target.file.problem]
    texts += [t for kv in session.labels.items() for t in kv]
    texts += [t for kv in pending.env.items() for t in kv]
    kind = pending.execution.WhichOneof("kind")
    if kind == "permissions":
        p = pending.execution.permissions
        texts += [*p.writable_roots, *p.readable_roots]
    return texts


def grant_note(pending: apb.PendingApproval) -> str | None:
    """Why "approve for the session" will approve this request once only
    (:func:`~execgate.policy_service.approvals.session_grant_refusal` of the request's file facts),
    or None when a session grant is possible. Unreadable facts count as no identity."""
    try:
        facts = codec.facts_from_pb(pending.target)
    except codec.CodecError:
        facts = None
    return session_grant_refusal(facts)


#: Most characters of one field a question shows (argv, cwd, env, …); the rest is counted, not
#: shown. A field of its own length is the session's choice: unbounded, a long argv (spaces,
#: then text drawn like a question of its own) scrolled the real header and program off the
#: screen and left a fake question above the prompt (tests/e2e/test_attack_terminal_scrolloff.py).
MAX_SHOWN = 400


def shown(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` (already :func:`visible`) cut to ``limit`` characters, saying how many were left out."""
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit:,} more characters not shown]"


def describe(pending: apb.PendingApproval) -> str:
    """The request as shown to the approver (several lines, no trailing newline).

    Every field is passed through :func:`visible`, so the text holds no control character at all
    (not even a newline inside a field): a request cannot draw over its own description. If any
    field held one, :data:`CONTROLS_FLAG` follows the header line. Each field shows at most
    :data:`MAX_SHOWN` characters, saying how many more it has, and the last line (``runs:``,
    right above the prompt) names the program again with the size of its argv: whatever the
    fields drew, the lines next to the prompt are the request's own. If no session grant can
    cover the file (:func:`grant_note`), a ``note:`` line says that [s] approves once only.
    """
    labels = ", ".join(f"{visible(k)}={visible(v)}" for k, v in sorted(pending.session.labels.items())) or "-"
    env = " ".join(visible(shlex.quote(f"{k}={v}")) for k, v in sorted(pending.env.items())) or "(empty)"
    program = shown(visible(pending.target.program))
    argv = visible(shlex.join(pending.target.argv))
    lines = [f"── approval {visible(pending.request_id[:12])} ({pending.seconds_left:.0f} s left)"]
    if has_hidden(*raw_fields(pending)):
        lines.append(CONTROLS_FLAG)
    lines += [
        f"   program: {program}",
        f"   argv:    {shown(argv)}",
        f"   cwd:     {shown(visible(pending.target.workdir))}",
        f"   session: {shown(visible(pending.session.session_id))}  labels: {shown(labels)}",
        f"   rule:    {shown(visible(pending.rule_id)) or '(default)'} — "
        f"{shown(visible(pending.reason)) or 'no justification'}",
        "   env:     " + shown(env),
        f"   file:    {shown(file_text(pending))}",
    ]
    note = grant_note(pending)
    if note is not None:
        lines.append(f"   note:    no session grant possible ({note}): [s] approves this request once")
    count = len(pending.target.argv)
    lines.append(f"   runs:    {program} ({count} argument{'s' if count != 1 else ''}, {len(argv):,} characters)")
    return "\n".join(lines)


def file_text(pending: apb.PendingApproval) -> str:
    """What the server learnt of the file (``static elf64 x86_64; children unseen``, then
    ``; real file /usr/bin/sudo`` when the file identified in the caller's view is not the
    program path shown), or a note that it sent nothing; "(unreadable)" if the facts are
    malformed. Shown through :func:`visible` (a real path or interpreter is the caller's choice)."""
    try:
        facts = codec.facts_from_pb(pending.target)
    except codec.CodecError:
        return "(unreadable facts)"
    if facts.file is None and facts.children_unseen is None and facts.problem is None and facts.identity is None:
        return "(nothing learnt of the file)"
    real = "" if facts.identity is None else facts.identity.real_path
    return visible(facts.summary + (f"; real file {real}" if real and real != pending.target.program else ""))


async def _answer(reader: LineReader, out: TextIO) -> tuple[int, str] | None:
    """Ask until a valid key; return (verdict, reason), or None at end of input."""
    while True:
        out.write("   [y] once  [s] for session  [n] deny > ")
        out.flush()
        line = await reader.readline()
        if line is None:
            return None
        key = line.strip().lower()[:1]
        if key in _KEYS:
            break
        out.write("   please answer y, s or n\n")
    reason = ""
    if key == "n":
        out.write("   reason (optional) > ")
        out.flush()
        reason = (await reader.readline() or "").strip()
    return _KEYS[key], reason


async def run_approver(
    channel: grpc.aio.Channel,
    *,
    name: str,
    metadata: tuple[tuple[str, str], ...] = (),
    stdin: TextIO = sys.stdin,
    out: TextIO = sys.stdout,
) -> int:
    """Answer pending requests from ``stdin`` until end of input or the stream ends.

    End of input while idle stops the approver at once; lines read before it are still used
    for the requests they answer.

    The service is asked once (``ListPending``) before anything is read, so that an unreachable
    service or a refused credential is reported as such, whatever stdin holds.

    Returns:
        0 at end of input or when the service closes the stream; 1 if the service could not be
        reached, refused the credential, or the stream failed (the cause on stderr).
    """
    try:
        await approvals_pb2_grpc.ApprovalsStub(channel).ListPending(
            apb.ListPendingRequest(), timeout=10, metadata=metadata)
    except grpc.aio.AioRpcError as exc:
        print(f"execgate approve: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    reader = LineReader(stdin)
    busy = asyncio.Event()  # set while a request is being answered
    serving = asyncio.ensure_future(_serve(channel, reader, busy, name=name, metadata=metadata, out=out))
    try:
        while not serving.done():
            await asyncio.wait({serving}, timeout=0.05)
            if reader.exhausted and not busy.is_set():
                return 0
        return serving.result()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def _serve(
    channel: grpc.aio.Channel,
    reader: LineReader,
    busy: asyncio.Event,
    *,
    name: str,
    metadata: tuple[tuple[str, str], ...],
    out: TextIO,
) -> int:
    stub = approvals_pb2_grpc.ApprovalsStub(channel)
    stream = stub.WatchPending(apb.WatchPendingRequest(approver=name), metadata=metadata)
    out.write(f"execgate approve: watching for pending requests as {name!r}\n")
    out.flush()
    try:
        async for pending in stream:
            busy.set()
            out.write(describe(pending) + "\n")
            answer = await _answer(reader, out)
            if answer is None:
                return 0
            request = apb.ResolveApprovalRequest(
                request_id=pending.request_id, verdict=answer[0], reason=answer[1], approver=name
            )
            try:
                await stub.ResolveApproval(request, timeout=10, metadata=metadata)
                once = answer[0] == apb.VERDICT_APPROVE_FOR_SESSION and grant_note(pending) is not None
                out.write("   sent (approved once: no session grant possible)\n" if once else "   sent\n")
            except grpc.aio.AioRpcError as exc:
                out.write(f"   not sent: {exc.details()}\n")
            out.flush()
            busy.clear()
    except grpc.aio.AioRpcError as exc:
        print(f"execgate approve: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        stream.cancel()
    return 0
