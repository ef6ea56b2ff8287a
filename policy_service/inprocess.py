"""The embedded policy service of ``execgate run``, deciding in this process: no gRPC at all.

``execgate run`` without ``--policy`` needs no endpoint for its decisions: the escalation server
and the service's :class:`~execgate.policy_service.decisions.DecisionService` share one event
loop, so :class:`InProcessPolicy` (a :class:`~execgate.server.policy.Policy`) calls the service's
logic directly. The rules, the approvals broker, the audit log and the environment cleaning are
the very objects a gRPC service serves (:mod:`execgate.policy_service.server`); what is left out
is the transport: no socket, no token, no protobuf, no grpc threads, no channel to connect. That
is most of ``execgate run``'s start-up time (BENCHMARKS.md, cold start).

What stays the same as through gRPC (docs/DESIGN.md §4, §8):

- every exec reaching the escalation server is decided by the rules and written to the audit log
  (``--audit-log``), one line per decision; the session's own start is not a decision, as before;
- text: the policy sees a caller's non-UTF-8 bytes as ``\\xNN`` text, as a proto string carries
  them, and an escalated command gets its exact bytes back (:mod:`execgate.server.wiretext`), so
  the rules, the audit lines and the approvers see what a gRPC service would;
- fail closed: a target the gRPC contract forbids (empty argv, a relative program or working
  directory: what the servicer answers with ``INVALID_ARGUMENT``) and an exception of the logic
  are a Deny with ``error=True`` naming it (and a refused or failed preparation a
  :class:`~execgate.server.policy.PolicyError`), never a Run;
- prompts go to the service's broker (:attr:`EmbeddedPolicy.broker`): the terminal approver of
  ``execgate run`` subscribes to it in this process; without a sandbox, or without a terminal,
  every prompt is denied with the reason the caller passed (``no_approver_reason``).

What is not here: the decision cache (a decision costs a rules evaluation here, no round trip to
save) and the ``Approvals`` endpoint, the metrics and the RPC spans. ``execgate run`` uses the
gRPC embedded service (:func:`execgate.policy_service.server.serve_embedded`) instead when
``--approver-wait``, ``--metrics``, tracing or ``--cache-ttl`` asks for them
(:mod:`execgate.server.run_policy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from typing import Any, AsyncIterator, Mapping, Sequence

from execgate.policy_service.approvals import ApprovalBroker
from execgate.policy_service.audit import AuditLog
from execgate.policy_service.decisions import DecisionService, EscalationRefused
from execgate.policy_service.state import InProcessState
from execgate.server.policy import Decision, ExecFacts, Execution, PolicyError, PreparedExec, SessionContext
from execgate.server.wiretext import restore_text, wire_text

log = logging.getLogger(__name__)


def _wired(value: Any) -> Any:
    """``value`` with every string in it as :func:`wire_text` makes it (strings, tuples, lists,
    dicts and frozen dataclasses, recursively); the very object when nothing changes."""
    if isinstance(value, str):
        return wire_text(value)
    if isinstance(value, (tuple, list)):
        items = [_wired(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    if isinstance(value, dict):
        pairs = [(_wired(k), _wired(v)) for k, v in value.items()]
        return value if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items())) else dict(pairs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = _wired(old)
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    return value


def target_problem(program: str, argv: Sequence[str], workdir: str) -> str | None:
    """What the gRPC contract forbids in an exec target (as
    :func:`execgate.server.policy_codec.target_from_pb` checks it), or None."""
    if not argv:
        return "argv is empty (it must include argv[0])"
    if not os.path.isabs(program):
        return f"program {program!r} is not an absolute path"
    if not os.path.isabs(workdir):
        return f"workdir {workdir!r} is not an absolute path"
    return None


class InProcessPolicy:
    """A :class:`~execgate.server.policy.Policy` that asks a
    :class:`~execgate.policy_service.decisions.DecisionService` in this process (see the module doc).

    Args:
        decisions: the service's logic (rules, approvals broker, audit log).
    """

    #: The escalation server passes the caller's environment (a prompt shows what reaches the command).
    accepts_env = True
    #: The escalation server passes what it learnt of the file (trust and file-fact rules rest on it).
    accepts_facts = True

    def __init__(self, decisions: DecisionService) -> None:
        self.decisions = decisions
        #: The wire form of recent sessions, by identity (a SessionContext is frozen, and each
        #: session passes the same one with every exec): its conversion was a tenth of a query.
        self._sessions: dict[int, tuple[SessionContext, SessionContext]] = {}

    def _session(self, session: SessionContext) -> SessionContext:
        """``_wired(session)``, converted once per session object (the object is kept with it,
        so that its id cannot be reused by another while it is cached)."""
        known = self._sessions.get(id(session))
        if known is not None and known[0] is session:
            return known[1]
        if len(self._sessions) >= 256:
            self._sessions.clear()
        wired = _wired(session)
        self._sessions[id(session)] = (session, wired)
        return wired

    async def determine_action(
        self, program: str, argv: Sequence[str], workdir: str, session: SessionContext,
        env: Mapping[str, str] | None = None, facts: ExecFacts | None = None,
    ) -> Decision:
        """Decide one exec and audit it; never raises except on cancellation.

        Returns:
            The service's decision, or ``Decision.deny(reason, error=True)`` if its logic failed.
        """
        problem = target_problem(program, argv, workdir)
        if problem is not None:
            log.warning("embedded policy refused a request (session %s): %s", session.session_id, problem)
            return Decision.deny(f"policy service error: invalid request: {problem}", error=True)
        try:
            decided = await self.decisions.decide(
                self._session(session), wire_text(program), [wire_text(a) for a in argv], wire_text(workdir),
                env=None if env is None else _wired(dict(env)), facts=_wired(facts),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # fail closed: a rules-engine bug is a Deny naming it, never a Run
            log.exception("embedded policy failed deciding %s (session %s)", program, session.session_id)
            return Decision.deny(f"policy service error: DetermineAction failed: {type(exc).__name__}: {exc}",
                                 error=True)
        decision = decided.decision
        if decision.action == "deny":
            log.info("policy denied %s (session %s, rule %s): %s", program, session.session_id,
                     decision.rule_id or "default", decision.reason)
        return decision

    #: The preload shim may ask :meth:`query_run` first (server/protocol.py).
    answers_queries = True

    async def query_run(self, program: str, argv: Sequence[str], workdir: str, session: SessionContext,
                        facts: ExecFacts | None) -> Decision | None:
        """Decide the exec for the preload shim's query only if the rules say Run: then it is
        decided and audited exactly as :meth:`determine_action` would (one line per exec, not a
        cached one: it is a decision), and the shim executes the program in place. Anything else
        (the rules would deny, escalate or prompt; a bad target; a failure) is None — nothing
        decided, prompted or audited — and the wrapper asks with a full request. Never raises
        except on cancellation."""
        if target_problem(program, argv, workdir) is not None:
            return None
        try:
            decided = await self.decisions.decide(
                self._session(session), wire_text(program), [wire_text(a) for a in argv], wire_text(workdir),
                facts=_wired(facts), run_only=True,
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # the wrapper's full request will fail closed on the same bug
            log.exception("embedded policy failed answering a query for %s (session %s)", program, session.session_id)
            return None
        return None if decided is None or decided.decision.action != "run" else decided.decision

    async def prepare_escalated_exec(
        self,
        program: str,
        argv: Sequence[str],
        workdir: str,
        env: Mapping[str, str],
        execution: Execution,
        session: SessionContext,
        facts: ExecFacts | None = None,
    ) -> PreparedExec:
        """Exactly what to spawn for an escalated exec, with the caller's exact bytes.

        Raises:
            PolicyError: the escalation is refused or the preparation failed; the message says why.
        """
        problem = target_problem(program, argv, workdir)
        if problem is not None:
            raise PolicyError(f"policy service error: invalid request: {problem}")
        try:
            # In a worker thread, as the gRPC servicer does: it evaluates the rules and builds a
            # sandbox command line.
            prepared = await asyncio.to_thread(
                self.decisions.prepare, self._session(session), wire_text(program), [wire_text(a) for a in argv],
                wire_text(workdir), _wired(dict(env)), _wired(execution), _wired(facts),
            )
        except Exception as exc:
            if not isinstance(exc, EscalationRefused):
                log.exception("embedded policy failed preparing %s (session %s)", program, session.session_id)
            log.warning("policy error preparing %s (session %s): %s", program, session.session_id, exc)
            raise PolicyError(f"policy service error: PrepareEscalatedExec failed: {type(exc).__name__}: {exc}") \
                from exc
        return restore_text(prepared, (program, *argv, workdir, *env.keys(), *env.values()))

    async def aclose(self) -> None:
        """Nothing to close (the service's audit log is closed by :func:`embedded_policy`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class EmbeddedPolicy:
    """An in-process embedded service (:func:`embedded_policy`).

    Attributes:
        policy: give it to :class:`~execgate.server.escalate_server.EscalateServer`.
        broker: the approvals broker, for an approver in this process (the terminal approver).
        decisions: the service's logic.
    """

    policy: InProcessPolicy
    broker: ApprovalBroker
    decisions: DecisionService


@contextlib.asynccontextmanager
async def embedded_policy(
    rules_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    default: str = "run",
    default_rules: bool = True,
    audit_log: str | os.PathLike[str] | None = None,
    approval_timeout_s: float = 60.0,
    no_approver_reason: str | None = None,
) -> AsyncIterator[EmbeddedPolicy]:
    """The embedded policy service, deciding in this process, for the ``async with``.

    ``rules_paths`` layer on top of the rules shipped in the package unless ``default_rules`` is
    False. They are read once, here, before any session exists, and never reloaded: a session
    must not change the rules that judge it (a rules file in its working directory).

    Args:
        approval_timeout_s: how long a prompt waits for an answer.
        no_approver_reason: deny every prompt with this reason (a session that could reach any
            approver of this process, or a run with no approver at all).

    Raises:
        RulesError: a rules file is bad. OSError: the audit log cannot be opened.
    """
    from execgate.policy_service.rules import RulesStore, layered_paths

    rules = RulesStore(layered_paths(rules_paths, defaults=default_rules), default=default)
    broker = ApprovalBroker(timeout_s=approval_timeout_s, refuse_reason=no_approver_reason)
    audit = AuditLog(audit_log) if audit_log else None
    try:
        decisions = DecisionService(rules, state=InProcessState(broker), audit=audit, inline_evaluation=True)
        yield EmbeddedPolicy(InProcessPolicy(decisions), broker, decisions)
    finally:
        if audit is not None:
            audit.close()
