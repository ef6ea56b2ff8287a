"""Approvals: pending exec requests that wait for a person or a bot (docs/DESIGN.md §4).

A ``prompt`` rule turns a request into an :class:`ApprovalRequest` that every connected approver
(a subscriber of :meth:`ApprovalBroker.subscribe`) sees. The first answer wins:

- approve once: this request escalates;
- approve for the session: this request and every later identical one (same session, program,
  argv, working directory, environment reaching the command and the very same file) escalate
  without asking again; a later request that differs in any of these is asked again. A session
  grant needs a file the caller cannot change (:func:`session_grant_refusal`): for any other
  file (the caller's own script, a file in a directory it can write, or one the server could not
  identify) "for the session" counts as approve once (:func:`settle`), since a rewrite in place
  keeps device and inode and the grant would cover whatever the file says next; approvers are
  told so with the request;
- deny: denied with the approver's reason.

No answer by the deadline: denied, saying it timed out. No approver connected (after waiting
``approver_wait_s`` for one): denied at once, saying so. A broker made with ``refuse_reason``
(a service whose approvers the session could reach, e.g. ``execgate run --sandbox none``)
denies every prompt at once with that reason. This module knows nothing of gRPC; the
``Approvals`` servicer is a thin layer over it.

:class:`ApprovalBroker` keeps everything in this process (a single service). Replicas share
their approvals through Redis instead (:class:`~execgate.policy_service.approvals_redis.RedisApprovalBroker`,
the same methods); :func:`outcome_for` is the one place a verdict becomes an outcome for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Literal, Mapping, Sequence

from execgate.server.policy import ExecFacts, Execution, SessionContext

log = logging.getLogger(__name__)

Verdict = Literal["once", "session", "deny"]

#: The reason of an approval for the session given without one (:func:`outcome_for`).
SESSION_APPROVED = "approved for this session"

#: How a prompt can end (:attr:`ApprovalOutcome.result`): approved once or for the session by an
#: approver, covered by an earlier grant, denied by an approver, unanswered by its deadline, no
#: approver connected, or refused outright (a broker made with ``refuse_reason``).
#: ``unavailable``: the shared state (Redis, :mod:`.state_redis`) failed while the prompt waited.
RESULTS = ("approved", "approved_session", "granted", "denied", "timeout", "no_approver", "refused", "unavailable")


class UnknownRequest(KeyError):
    """Raised by :meth:`ApprovalBroker.resolve` for an id that is not pending (unknown, answered, expired)."""


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One exec waiting for an approver.

    Attributes:
        request_id: unique id to resolve it by.
        session: the session asking.
        program: absolute program path.
        argv: full argv, argv[0] included.
        workdir: absolute working directory.
        rule_id: the rule that asked for a prompt ("" for the default).
        reason: the rule's justification.
        execution: how the command runs if approved.
        deadline: ``loop.time()`` (seconds) after which it is denied for lack of an answer.
        env: the environment that will reach the command if approved, as sorted (name, value)
            pairs (shown to approvers; part of what an approve-for-session grant covers).
        facts: what the server learnt of the file (kind, children unseen), shown to approvers and
            part of what a grant covers; None when the request carried none.
    """

    request_id: str
    session: SessionContext
    program: str
    argv: tuple[str, ...]
    workdir: str
    rule_id: str
    reason: str
    execution: Execution
    deadline: float
    env: tuple[tuple[str, str], ...] = ()
    facts: ExecFacts | None = None


@dataclass(frozen=True, slots=True)
class ApprovalOutcome:
    """How a prompt ended.

    Attributes:
        approved: True to escalate.
        reason: the approver's reason, or why nobody answered.
        approver: who answered ("" if nobody).
        for_session: approved for the rest of the session (or by such an earlier approval).
        result: how it ended, one of :data:`RESULTS` (the label of the prompt metrics).
    """

    approved: bool
    reason: str
    approver: str = ""
    for_session: bool = False
    result: str = ""


@dataclass(slots=True)
class _Pending:
    request: ApprovalRequest
    future: asyncio.Future[ApprovalOutcome]


@dataclass(slots=True, eq=False)
class _Subscriber:
    queue: asyncio.Queue[ApprovalRequest] = field(default_factory=asyncio.Queue)


class ApprovalBroker:
    """Holds pending requests, connected approvers and per-session grants.

    Args:
        timeout_s: how long a request waits for an answer, in seconds.
        approver_wait_s: how long a request waits for a first approver to connect when none is
            connected, in seconds (0: deny at once).
        refuse_reason: if set, every request is denied at once with this reason (no approver
            is asked, no grant applies).

    All methods must be called from the event loop that runs the service.
    """

    def __init__(
        self, *, timeout_s: float = 60.0, approver_wait_s: float = 0.0, refuse_reason: str | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.approver_wait_s = approver_wait_s
        self.refuse_reason = refuse_reason
        self._pending: dict[str, _Pending] = {}
        self._subscribers: set[_Subscriber] = set()
        self._grants: dict[str, str] = {}
        self._approver_joined: asyncio.Event | None = None

    @property
    def approvers(self) -> int:
        """Number of connected approvers."""
        return len(self._subscribers)

    def pending_count(self) -> int:
        """Number of requests waiting now (a plain read: safe from a metrics scrape's thread)."""
        return len(self._pending)

    async def is_pending(self, request_id: str) -> bool:
        """True while ``request_id`` waits for an answer."""
        return request_id in self._pending

    async def pending(self) -> list[ApprovalRequest]:
        """Requests waiting now, oldest first."""
        return [p.request for p in self._pending.values()]

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[ApprovalRequest]]:
        """Connect an approver for the duration of the ``async with``.

        Yields:
            A queue that receives every request pending at subscription, then each new one.
        """
        sub = _Subscriber()
        for pending in self._pending.values():
            sub.queue.put_nowait(pending.request)
        self._subscribers.add(sub)
        if self._approver_joined is not None:
            self._approver_joined.set()
        try:
            yield sub.queue
        finally:
            self._subscribers.discard(sub)

    async def request(
        self,
        session: SessionContext,
        program: str,
        argv: Sequence[str],
        workdir: str,
        *,
        rule_id: str,
        reason: str,
        execution: Execution,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        facts: ExecFacts | None = None,
    ) -> ApprovalOutcome:
        """Ask the approvers about one exec and wait for the outcome.

        Args:
            timeout_s: wait at most this long (seconds) instead of the broker's ``timeout_s``
                (the service passes less when its caller's deadline is nearer).
            env: the environment that would reach the command (shown to approvers).
            facts: the file's facts (shown to approvers; a grant covers a file of these facts only,
                and the very file identified, by device and inode; without an identity, or for a
                file the caller can change, no grant is made: :func:`session_grant_refusal`).

        Returns:
            The outcome; never raises for a missing or silent approver.
        """
        if self.refuse_reason is not None:
            return ApprovalOutcome(False, self.refuse_reason, result="refused")
        shown_env = tuple(sorted((env or {}).items()))
        refusal = session_grant_refusal(facts)
        key = grant_key(session, program, argv, workdir, shown_env, facts)
        if refusal is None and key in self._grants:
            return ApprovalOutcome(True, "approved earlier for this session", self._grants[key], True, "granted")
        loop = asyncio.get_running_loop()
        timeout = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        deadline = loop.time() + timeout
        if not self._subscribers and not await self._wait_for_approver(min(self.approver_wait_s, timeout)):
            return ApprovalOutcome(False, "approval required but no approver is connected", result="no_approver")
        request = ApprovalRequest(
            uuid.uuid4().hex, session, program, tuple(argv), workdir, rule_id, reason, execution, deadline, shown_env,
            facts,
        )
        pending = _Pending(request, loop.create_future())
        self._pending[request.request_id] = pending
        for sub in self._subscribers:
            sub.queue.put_nowait(request)
        try:
            async with asyncio.timeout_at(deadline):
                outcome = await pending.future
        except TimeoutError:
            return ApprovalOutcome(False, f"approval timed out after {timeout:g} s with no answer", result="timeout")
        finally:
            self._pending.pop(request.request_id, None)
        outcome = settle(outcome, refusal)
        if outcome.approved and outcome.for_session:
            self._grants[key] = outcome.approver
        return outcome

    async def _wait_for_approver(self, wait_s: float) -> bool:
        if wait_s <= 0:
            return False
        if self._approver_joined is None or self._approver_joined.is_set():
            self._approver_joined = asyncio.Event()
        try:
            async with asyncio.timeout(wait_s):
                await self._approver_joined.wait()
        except TimeoutError:
            return bool(self._subscribers)
        return True

    async def resolve(self, request_id: str, verdict: Verdict, *, reason: str = "", approver: str = "") -> None:
        """Answer one pending request.

        Raises:
            UnknownRequest: no such request is pending (unknown, already answered or expired).
            ValueError: ``verdict`` is not "once", "session" or "deny".
        """
        outcome = outcome_for(verdict, reason, approver)
        pending = self._pending.pop(request_id, None)
        if pending is None or pending.future.done():
            raise UnknownRequest(request_id)
        pending.future.set_result(outcome)
        log.info("approval %s resolved by %s: %s", request_id, approver or "?", verdict)


def grant_key(
    session: SessionContext, program: str, argv: Sequence[str], workdir: str, env: Sequence[tuple[str, str]],
    facts: ExecFacts | None,
) -> str:
    """What an approve-for-session grant covers, as one string (a sha256 hex digest): the session,
    program, argv, working directory (an escalation's effect depends on it: relative paths, and
    the roots an escalated sandbox binds), the environment reaching the command (sorted pairs) and
    the file's facts — its kind and, when identified, that very file (device and inode), so that
    swapping the file at the path asks again. A rewrite in place keeps device and inode: that is
    why no grant is made for a file the caller can change (:func:`session_grant_refusal`)."""
    ident = None if facts is None or facts.identity is None else [facts.identity.device, facts.identity.inode]
    shown = None if facts is None else (sorted(facts.kinds), facts.children_unseen, ident)
    text = json.dumps([session.session_id, program, list(argv), workdir, [list(kv) for kv in env], shown],
                      ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def session_grant_refusal(facts: ExecFacts | None) -> str | None:
    """Why an approve-for-session grant cannot cover this file, or None when it can.

    A grant is keyed on the file's device and inode (:func:`grant_key`); content written in place
    keeps both, so a grant is sound only for a file the caller cannot change. None only when the
    server identified the file (``facts.identity``), outside ``/proc`` and ``/dev``, and found that
    the caller can change neither it nor a directory holding it (``caller_can_modify`` false).

    Returns:
        One phrase for people (shown to approvers, and in the outcome's reason), e.g. "the caller
        can change this file or a directory holding it"; None if a grant may be made.
    """
    identity = None if facts is None else facts.identity
    if identity is None:
        return "the file was not identified"
    if identity.pseudo_fs:
        return "the file lies under /proc or /dev"
    if identity.caller_can_modify:
        return "the caller can change this file or a directory holding it"
    return None


def settle(outcome: ApprovalOutcome, refusal: str | None) -> ApprovalOutcome:
    """The outcome as it stands for a request whose :func:`session_grant_refusal` is ``refusal``:
    an approval for the session of a file no grant may cover becomes an approval of this request
    only (``for_session`` false, result "approved"), its reason saying why; anything else as is.
    Both brokers apply it before storing a grant."""
    if refusal is None or not (outcome.approved and outcome.for_session):
        return outcome
    said = "" if outcome.reason == SESSION_APPROVED else f"{outcome.reason}; "
    return dataclasses.replace(outcome, reason=f"{said}approved once: no session grant, {refusal}",
                               for_session=False, result="approved")


def outcome_for(verdict: Verdict, reason: str = "", approver: str = "") -> ApprovalOutcome:
    """The outcome an approver's verdict gives.

    Raises:
        ValueError: ``verdict`` is not "once", "session" or "deny".
    """
    if verdict not in ("once", "session", "deny"):
        raise ValueError(f"unknown verdict {verdict!r}")
    if verdict == "deny":
        return ApprovalOutcome(False, reason or "denied by approver", approver, result="denied")
    text = reason or (SESSION_APPROVED if verdict == "session" else "approved once")
    return ApprovalOutcome(True, text, approver, verdict == "session",
                           "approved_session" if verdict == "session" else "approved")
