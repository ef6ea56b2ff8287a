"""gRPC servicers of ``execgate.v1``: ``EscalationPolicy`` and ``Approvals``.

Thin typed layers over :class:`~execgate.policy_service.decisions.DecisionService` and
:class:`~execgate.policy_service.approvals.ApprovalBroker`: they decode and check requests
(bad input → ``INVALID_ARGUMENT``, never ``UNKNOWN``), call the logic, encode the answer.
Input bounds (path ≤ PATH_MAX, argv, env, labels, session id: the ``MAX_*`` constants of
:mod:`execgate.server.protocol`) are checked first, so that one oversized request cannot occupy
the service (:func:`check_bounds`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Mapping, NoReturn

import grpc

from execgate.policy_service.approvals import ApprovalBroker, ApprovalRequest, UnknownRequest
from execgate.policy_service.decisions import CachedRecord, DecisionService, EscalationRefused
from execgate.policy_service.state import ApprovalState, StateUnavailable
from execgate.policy_service.metrics import ATTR_SESSION_ID, PolicyMetrics, describe_decision, describe_error
from execgate.server import policy_codec as codec
from execgate.server import protocol as p
from execgate.v1 import approvals_pb2 as apb
from execgate.v1 import approvals_pb2_grpc
from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc

log = logging.getLogger(__name__)

#: Initial-metadata key the service sends when DetermineAction waits for an approver; the value
#: is the wait in seconds. A client uses it to extend its ordinary deadline to its prompt deadline.
PROMPT_METADATA_KEY = "execgate-prompt"

_VERDICTS = {
    apb.VERDICT_APPROVE_ONCE: "once",
    apb.VERDICT_APPROVE_FOR_SESSION: "session",
    apb.VERDICT_DENY: "deny",
}


async def _invalid(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    raise AssertionError("unreachable")  # pragma: no cover - abort always raises


async def _internal(context: grpc.aio.ServicerContext, what: str, exc: Exception) -> NoReturn:
    log.exception("%s failed", what)
    await context.abort(grpc.StatusCode.INTERNAL, f"{what} failed: {type(exc).__name__}: {exc}")
    raise AssertionError("unreachable")  # pragma: no cover


def check_bounds(session: pb.SessionContext, target: pb.ExecTarget, env: Mapping[str, str] | None = None) -> None:
    """Check a request's input bounds (the ``MAX_*`` of :mod:`execgate.server.protocol`, shared
    with the escalation server) before any work is done on it. Byte bounds are multiplied by
    ``GRPC_TEXT_EXPANSION``: gRPC text carries each non-UTF-8 byte as the 4 characters ``\\xNN``.

    Raises:
        codec.CodecError: a bound is exceeded; the message names it.
    """
    scale = p.GRPC_TEXT_EXPANSION
    box = session.sandbox
    violation = p.session_bounds_violation(
        session.session_id, session.labels,
        (*box.writable_roots, *box.readable_roots, *box.masked_dirs, *((box.tmp_dir,) if box.tmp_dir else ())),
        scale=scale
    ) or p.exec_bounds_violation(
        {"target.program": target.program, "target.workdir": target.workdir,
         "target.identity.real_path": target.identity.real_path, "target.identity.source": target.identity.source,
         "target.file_problem": target.file_problem, "target.file.interpreter": target.file.interpreter,
         "target.file.problem": target.file.problem,
         "target.file.interpreter_info.interpreter": target.file.interpreter_info.interpreter},
        target.argv, env, scale=scale,
    )
    if violation is not None:
        raise codec.CodecError(f"input bound exceeded: {violation}")


#: The most entries one RecordCachedDecisions call may carry.
MAX_CACHED_PER_CALL = 4096


def _cached_from_pb(entry: pb.CachedDecision) -> CachedRecord:
    """Decode and check one cached decision (bounds as DetermineAction's; Run or Deny only).

    Raises:
        codec.CodecError: out of bounds, or not a Run/Deny with a decision id of 32 hex digits.
    """
    check_bounds(entry.session, entry.target)
    session = codec.session_from_pb(entry.session)
    program, argv, workdir = codec.target_from_pb(entry.target)
    decision = codec.decision_from_pb(entry.decision)
    if decision.action not in ("run", "deny"):
        raise codec.CodecError(f"a cached decision is run or deny, not {decision.action}")
    if len(decision.decision_id) != 32 or any(c not in "0123456789abcdef" for c in decision.decision_id):
        raise codec.CodecError("a cached decision's decision_id is 32 lower-case hex digits")
    bound = p.exec_bounds_violation({"decision.reason": decision.reason or "", "decision.note": decision.note,
                                     "decision.rule_id": decision.rule_id, "cached_from": entry.cached_from},
                                    (), None, scale=p.GRPC_TEXT_EXPANSION)
    if bound is not None:
        raise codec.CodecError(f"input bound exceeded: {bound}")
    return CachedRecord(session=session, program=program, argv=argv, workdir=workdir,
                        facts=codec.facts_from_pb(entry.target), decision=decision, cached_from=entry.cached_from,
                        time_unix_ms=entry.time_unix_ms, latency_ms=max(0.0, entry.latency_ms))


class EscalationPolicyServicer(policy_pb2_grpc.EscalationPolicyServicer):
    """The ``EscalationPolicy`` service.

    Args:
        decisions: the logic that decides and prepares.
        metrics: where decisions, errors and latencies are counted, and the decision spans made
            (default: a private :class:`PolicyMetrics` nobody serves).
    """

    def __init__(self, decisions: DecisionService, metrics: PolicyMetrics | None = None) -> None:
        self.decisions = decisions
        self.metrics = metrics if metrics is not None else PolicyMetrics()

    async def DetermineAction(  # noqa: N802 - gRPC method name
        self, request: pb.DetermineActionRequest, context: grpc.aio.ServicerContext
    ) -> pb.DetermineActionResponse:
        started = time.monotonic()
        with self.metrics.decision_span() as span:
            try:
                check_bounds(request.session, request.target)
                session = codec.session_from_pb(request.session)
                program, argv, workdir = codec.target_from_pb(request.target)
                facts = codec.facts_from_pb(request.target)
            except codec.CodecError as exc:
                self._failed(span, "invalid_argument", exc, started)
                await _invalid(context, exc)
            span.set_attribute(ATTR_SESSION_ID, session.session_id)

            async def on_prompt(wait_s: float) -> None:
                await context.send_initial_metadata(((PROMPT_METADATA_KEY, f"{wait_s:.3f}"),))

            try:
                decision, approver, prompt, cache, fingerprint = await self.decisions.decide(
                    session, program, argv, workdir, budget_s=context.time_remaining(), on_prompt=on_prompt,
                    env=dict(request.env), facts=facts,
                )
            except asyncio.CancelledError as exc:  # the caller went away before an answer
                self._failed(span, "cancelled", exc, started)
                raise
            except Exception as exc:  # a rules-engine bug must reach the client as INTERNAL, not UNKNOWN
                self._failed(span, "internal", exc, started)
                await _internal(context, "DetermineAction", exc)
            if decision.error:  # failed closed (shared state unreachable): an error, not a policy denial
                self._failed(span, "state_unavailable", RuntimeError(decision.reason), started)
                if prompt:
                    self.metrics.prompts.labels(prompt).inc()
            else:
                self.metrics.decided(decision.action, decision.rule_id, time.monotonic() - started, prompt)
            describe_decision(span, decision.decision_id, decision.action, decision.rule_id, prompt)
        message = codec.decision_to_pb(decision)
        message.approver = approver
        response = pb.DetermineActionResponse(decision=message, rules_fingerprint=fingerprint)
        if cache is not None:
            response.cache.CopyFrom(codec.cache_hint_to_pb(cache))
        return response

    async def RecordCachedDecisions(  # noqa: N802
        self, request: pb.RecordCachedDecisionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecordCachedDecisionsResponse:
        """Audit the decisions a client answered from its cache (docs/DESIGN.md §9)."""
        try:
            if len(request.decisions) > MAX_CACHED_PER_CALL:
                raise codec.CodecError(f"{len(request.decisions)} cached decisions in one call, more than "
                                       f"{MAX_CACHED_PER_CALL}")
            records = [_cached_from_pb(entry) for entry in request.decisions]
        except codec.CodecError as exc:
            self.metrics.cached_record_errors.labels("invalid_argument").inc()
            await _invalid(context, exc)
        try:
            written = await self.decisions.record_cached(records)
        except StateUnavailable as exc:
            self.metrics.cached_record_errors.labels("state_unavailable").inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        for record in records:
            self.metrics.cached_decisions.labels(record.decision.action).inc()
        return pb.RecordCachedDecisionsResponse(recorded=written,
                                                rules_fingerprint=self.decisions.rules_fingerprint())

    def _failed(self, span, cause: str, exc: BaseException, started: float) -> None:
        """Count and trace a DetermineAction that ends without a decision."""
        self.metrics.failed(cause, time.monotonic() - started)
        describe_error(span, cause, f"{type(exc).__name__}: {exc}")

    async def PrepareEscalatedExec(  # noqa: N802
        self, request: pb.PrepareEscalatedExecRequest, context: grpc.aio.ServicerContext
    ) -> pb.PrepareEscalatedExecResponse:
        try:
            check_bounds(request.session, request.target, request.env)
            session = codec.session_from_pb(request.session)
            program, argv, workdir = codec.target_from_pb(request.target)
            facts = codec.facts_from_pb(request.target)
            if not request.HasField("execution"):
                raise codec.CodecError("execution is required")
            execution = codec.execution_from_pb(request.execution)
        except codec.CodecError as exc:
            self.metrics.prepare_errors.labels("invalid_argument").inc()
            await _invalid(context, exc)
        try:
            # In a worker thread: prepare evaluates the rules and builds a sandbox command line.
            prepared = await asyncio.to_thread(
                self.decisions.prepare, session, program, argv, workdir, dict(request.env), execution, facts
            )
        except Exception as exc:
            self.metrics.prepare_errors.labels("refused" if isinstance(exc, EscalationRefused) else "internal").inc()
            await _internal(context, "PrepareEscalatedExec", exc)
        return pb.PrepareEscalatedExecResponse(prepared=codec.prepared_to_pb(prepared))


def pending_to_pb(request: ApprovalRequest) -> apb.PendingApproval:
    """Encode a pending request, with the seconds left until its deadline as of now."""
    left = max(0.0, request.deadline - asyncio.get_running_loop().time())
    return apb.PendingApproval(
        request_id=request.request_id,
        session=codec.session_to_pb(request.session),
        target=codec.target_to_pb(request.program, request.argv, request.workdir, request.facts),
        rule_id=request.rule_id,
        reason=request.reason,
        execution=codec.execution_to_pb(request.execution),
        seconds_left=left,
        env=dict(request.env),
    )


class ApprovalsServicer(approvals_pb2_grpc.ApprovalsServicer):
    """The ``Approvals`` service.

    Args:
        broker: holds the pending requests (in this process, or shared through Redis).
    """

    def __init__(self, broker: ApprovalBroker | ApprovalState) -> None:
        self.broker = broker

    async def WatchPending(  # noqa: N802
        self, request: apb.WatchPendingRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[apb.PendingApproval]:
        log.info("approver %r connected", request.approver or context.peer())
        try:
            async with self.broker.subscribe() as queue:
                while True:
                    pending = await queue.get()
                    if await self.broker.is_pending(pending.request_id):
                        yield pending_to_pb(pending)
        except StateUnavailable as exc:  # the shared state went away: the approver reconnects later
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        finally:
            log.info("approver %r disconnected", request.approver or context.peer())

    async def ResolveApproval(  # noqa: N802
        self, request: apb.ResolveApprovalRequest, context: grpc.aio.ServicerContext
    ) -> apb.ResolveApprovalResponse:
        verdict = _VERDICTS.get(request.verdict)
        if verdict is None:
            await _invalid(context, ValueError("verdict must be APPROVE_ONCE, APPROVE_FOR_SESSION or DENY"))
        try:
            await self.broker.resolve(
                request.request_id, verdict, reason=request.reason, approver=request.approver or context.peer()
            )
        except UnknownRequest:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no pending request {request.request_id!r} (answered or expired?)"
            )
        except StateUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return apb.ResolveApprovalResponse()

    async def ListPending(  # noqa: N802
        self, request: apb.ListPendingRequest, context: grpc.aio.ServicerContext
    ) -> apb.ListPendingResponse:
        try:
            pending = await self.broker.pending()
        except StateUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return apb.ListPendingResponse(pending=[pending_to_pb(p) for p in pending])
