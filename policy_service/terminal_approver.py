"""``execgate run``'s own approver: prompts asked on the user's terminal, in-process.

When ``execgate run`` has a terminal and its embedded policy service (docs/DESIGN.md §8), it
subscribes to that service's :class:`~execgate.policy_service.approvals.ApprovalBroker` directly
— no endpoint, no credential, nothing a session could connect to — and asks each pending request
on the terminal. The question is the one ``execgate approve`` shows (:func:`describe`: program,
argv, cwd, session, rule, the environment that will reach the command, the file's facts, seconds
left; every control character escaped, and flagged), asked while the session's output is held
and its pty gets no keys (:meth:`execgate.server.terminal.PtyRelay.held`); keys typed before the
question appeared are dropped, so that nothing typed for the script answers it. Answers:

- ``y`` — approve once; ``s`` — approve for the session (once only for a file the caller can
  change: the question says so, and so does the answer); ``n`` — deny, then a reason line
  (empty: "denied at the terminal");
- ^C or ^D — deny; no answer by the request's deadline (``--approval-timeout``) — the broker
  denies it, saying it timed out;
- answered by another approver meanwhile (``execgate approve`` with ``--approver-wait``): the
  question ends, saying so.

The terminal is duck-typed (:class:`PromptTerminal`) so that this module needs nothing of ptys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncContextManager, AsyncIterator, Protocol

from execgate.policy_service.approvals import (
    ApprovalBroker, ApprovalRequest, UnknownRequest, Verdict, session_grant_refusal,
)
from execgate.policy_service.approver import describe
from execgate.policy_service.servicer import pending_to_pb

log = logging.getLogger(__name__)

#: The approver name recorded in the audit log for answers given here.
APPROVER_NAME = "terminal"
#: Seconds between checks that a request asked here is still pending.
SETTLED_POLL_S = 0.2
_KEYS: dict[str, Verdict] = {"y": "once", "s": "session", "n": "deny"}
_SAID = {"once": "approved once", "session": "approved for this session", "deny": "denied"}


class PromptTerminal(Protocol):
    """What the approver needs of a terminal (:class:`execgate.server.terminal.PtyRelay`)."""

    def held(self) -> AsyncContextManager[object]: ...

    def discard_typeahead(self) -> None: ...

    async def write(self, text: str) -> None: ...

    async def read_line(self) -> str | None: ...


async def serve_terminal_approver(broker: ApprovalBroker, terminal: PromptTerminal, *,
                                  name: str = APPROVER_NAME) -> None:
    """Answer the broker's requests at ``terminal``, one at a time, until cancelled."""
    async with broker.subscribe() as queue:
        while True:
            request = await queue.get()
            if await broker.is_pending(request.request_id):
                await ask(broker, terminal, request, name=name)


async def ask(broker: ApprovalBroker, terminal: PromptTerminal, request: ApprovalRequest, *,
              name: str = APPROVER_NAME) -> None:
    """Ask about one request and resolve it with the answer. A request answered elsewhere (an
    ``execgate approve`` of ``--approver-wait``) or expired meanwhile ends the question, saying so."""
    async with terminal.held():
        await terminal.write("\nexecgate: a command needs your approval\n" + describe(pending_to_pb(request)) + "\n")
        terminal.discard_typeahead()
        answer = asyncio.ensure_future(_answer(terminal))
        gone = asyncio.ensure_future(_settled(broker, request.request_id))
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (answer, gone):
                task.cancel()
            await asyncio.gather(answer, gone, return_exceptions=True)
        if not answer.done() or answer.cancelled():
            timed_out = asyncio.get_running_loop().time() >= request.deadline
            await terminal.write("\n   no answer in time: denied\n" if timed_out
                                 else "\n   answered elsewhere\n")
            return
        verdict, reason = answer.result()
        try:
            await broker.resolve(request.request_id, verdict, reason=reason, approver=name)
        except UnknownRequest:
            await terminal.write("   no longer pending (answered elsewhere, or expired)\n")
            return
        refusal = session_grant_refusal(request.facts) if verdict == "session" else None
        await terminal.write(f"   {_SAID[verdict]}\n" if refusal is None
                             else f"   approved once (no session grant possible: {refusal})\n")


async def _settled(broker: ApprovalBroker, request_id: str) -> None:
    """Return once ``request_id`` is no longer pending (answered elsewhere, or past its deadline)."""
    while await broker.is_pending(request_id):
        await asyncio.sleep(SETTLED_POLL_S)


async def _answer(terminal: PromptTerminal) -> tuple[Verdict, str]:
    """Ask until y, s or n; (verdict, reason). ^C or ^D denies."""
    while True:
        await terminal.write("   [y] once  [s] for session  [n] deny > ")
        line = await terminal.read_line()
        if line is None:
            return "deny", "denied at the terminal"
        key = line.strip().lower()[:1]
        if key in _KEYS:
            break
        await terminal.write("   please answer y, s or n\n")
    if _KEYS[key] != "deny":
        return _KEYS[key], ""
    await terminal.write("   reason (optional) > ")
    reason = await terminal.read_line()
    return "deny", (reason or "").strip() or "denied at the terminal"


@contextlib.asynccontextmanager
async def terminal_approver(broker: ApprovalBroker | None, terminal: PromptTerminal) -> AsyncIterator[None]:
    """Run :func:`serve_terminal_approver` for the ``async with`` block (nothing if ``broker``
    is None); stopped, whatever it was asking, when the block ends. If it fails, that is said
    at once (prompts then find no approver and are denied, saying so)."""
    if broker is None:
        yield
        return
    task = asyncio.ensure_future(serve_terminal_approver(broker, terminal))
    task.add_done_callback(_report)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _report(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("the terminal approver stopped: %r", task.exception(), exc_info=task.exception())
