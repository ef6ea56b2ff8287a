"""The policy service's logic, free of gRPC: decide an exec, prepare an escalated one.

:class:`DecisionService` asks the rules engine (:class:`~execgate.policy_service.rules.RulesStore`),
turns ``prompt`` into an approval (:mod:`execgate.policy_service.approvals`), writes the audit log
(:mod:`execgate.policy_service.audit`), and builds what an escalated command spawns: the plain
program, or a bubblewrap command line from the granted profile
(:func:`execgate.server.sandbox.bwrap_argv`), always with a cleaned environment
(:mod:`execgate.policy_service.envclean`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import hashlib
import logging
import os
import time
import uuid
from collections import OrderedDict
from typing import Awaitable, Callable, Mapping, NamedTuple, Protocol, Sequence

from execgate.policy_service.approvals import ApprovalBroker
from execgate.policy_service.audit import AuditLog, AuditRecord, AuditWriteError
from execgate.policy_service.envclean import clean_env, withheld_note
from execgate.policy_service.state import ApprovalState, InProcessState, SharedState, StateUnavailable
from execgate.server.policy import CacheHint, Decision, ExecFacts, Execution, Permissions, PreparedExec, SessionContext
from execgate.server.sandbox import bwrap_argv, find_bwrap, in_session_tmp, under, visible_inside

log = logging.getLogger(__name__)

#: Called once, before waiting, when a decision needs an approver; gets the wait in seconds.
PromptHook = Callable[[float], Awaitable[None]]

#: A prompt that times out is answered this long (seconds) before the caller's own deadline.
_ANSWER_MARGIN_S = 0.25


class EscalationRefused(ValueError):
    """Raised by :meth:`DecisionService.prepare` when an escalated exec cannot be built safely; the
    message (shown to the caller in its denial) says why and what to do."""


class Decided(NamedTuple):
    """A decision, who approved it ("" when no approver was asked), for a prompt how it ended
    (:data:`~execgate.policy_service.approvals.RESULTS`; "" when the rule did not prompt), whether
    the client may cache it (:class:`~execgate.server.policy.CacheHint`, None: ask again) and the
    fingerprint of the rules that decided ("" when unknown)."""

    decision: Decision
    approver: str
    prompt: str = ""
    cache: CacheHint | None = None
    fingerprint: str = ""


class CachedRecord(NamedTuple):
    """One decision an escalation server answered from its cache (``CachedDecision`` message):
    what :meth:`DecisionService.record_cached` writes to the audit log."""

    session: SessionContext
    program: str
    argv: Sequence[str]
    workdir: str
    facts: ExecFacts | None
    decision: Decision
    cached_from: str
    time_unix_ms: int
    latency_ms: float


#: How many cacheable answers the service remembers to verify the cached lines that cite them.
ISSUED_MEMORY = 65536
#: A cached line may cite an answer this long (seconds) after its TTL ran out (flush and retries).
_ISSUED_SLACK_S = 60.0
#: A cached line's time is the client's when within this many seconds of the service's clock.
_CLOCK_SKEW_S = 600.0


class _Evaluation(Protocol):
    decision: str
    rule: object | None
    execution: Execution | None
    reason: str
    allow_env: tuple[str, ...]


class _RuleSet(Protocol):
    def evaluate(self, program: str, argv: Sequence[str], facts: ExecFacts | None = None) -> _Evaluation: ...


class RulesSource(Protocol):
    """What the service needs of :class:`~execgate.policy_service.rules.RulesStore`."""

    @property
    def current(self) -> _RuleSet: ...


class DecisionService:
    """Decides and prepares execs for the ``EscalationPolicy`` servicer.

    Args:
        rules: the rules store (its ``current`` rule set is read per request, so reloads apply
            at once).
        approvals: the broker that runs prompts (default: ``state``'s).
        audit: the local file each decision is written to, or None for none.
        state: the state replicas share (:mod:`execgate.policy_service.state`; default: in this
            process, around ``approvals``). While :meth:`~.state.SharedState.unavailable` names
            a cause, every decision fails closed with it; every decision is also published to
            its audit stream before it is answered (a failure to publish fails it closed).
        bwrap: absolute path of the bubblewrap named in sandboxed command lines; default: found
            once, here at service start, in root-owned system directories
            (:func:`execgate.server.sandbox.find_bwrap`), never on a caller's PATH. None found: a
            sandboxed escalation is refused (the plain ones still work).
        cache_ttl_s: seconds an escalation server may reuse a cacheable decision
            (:meth:`cache_hint`; docs/DESIGN.md §9); 0 (the default here) marks nothing cacheable.
        inline_evaluation: evaluate the rules on the event loop instead of a worker thread: for
            a service that serves one ``execgate run`` in its own process (an evaluation of the
            shipped rules is ~10 µs; the thread's hand-off ~150 µs of CPU per decision). A
            service shared by many sessions keeps the thread, so that a long rules file never
            holds up the others.

    Raises:
        ValueError: a relative ``bwrap``.
    """

    def __init__(
        self,
        rules: RulesSource,
        *,
        approvals: ApprovalBroker | ApprovalState | None = None,
        audit: AuditLog | None = None,
        bwrap: str | None = None,
        state: SharedState | None = None,
        cache_ttl_s: float = 0.0,
        inline_evaluation: bool = False,
    ) -> None:
        self.inline_evaluation = inline_evaluation
        if bwrap is not None and not os.path.isabs(bwrap):
            raise ValueError(f"bwrap must be an absolute path, got {bwrap!r}")
        if not cache_ttl_s >= 0:
            raise ValueError(f"cache_ttl_s must be >= 0, got {cache_ttl_s!r}")
        self.cache_ttl_s = cache_ttl_s
        # decision id → (key digest, monotonic time it stops verifying), oldest first.
        self._issued: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self.rules = rules
        if state is None:
            state = InProcessState(approvals if isinstance(approvals, ApprovalBroker) else None)
        self.state = state
        self.approvals = approvals if approvals is not None else state.approvals
        self.audit = audit
        self.bwrap = bwrap if bwrap is not None else find_bwrap()

    def rules_fingerprint(self) -> str:
        """The fingerprint of the rules in force now ("" when the rules source has none)."""
        return getattr(self.rules.current, "fingerprint", "") or ""

    async def decide(
        self,
        session: SessionContext,
        program: str,
        argv: Sequence[str],
        workdir: str,
        *,
        budget_s: float | None = None,
        on_prompt: PromptHook | None = None,
        env: Mapping[str, str] | None = None,
        facts: ExecFacts | None = None,
        run_only: bool = False,
    ) -> Decided | None:
        """Decide one exec (``program`` absolute, ``argv`` non-empty) and audit it.

        Args:
            budget_s: seconds the caller will wait (its deadline); a prompt answers before it.
            on_prompt: awaited before waiting for an approver, with the wait in seconds.
            env: the caller's environment; a prompt shows the approver the part of it that
                :meth:`prepare` would give the command (and a session grant covers only that).
            facts: what the escalation server learnt of the file (None: nothing): the rules
                judge trust from its ``identity`` alone (:meth:`RuleSet.is_trusted`) and file-fact
                rules test its file info; the audit line and approvers show them.
            run_only: decide only if the rules say Run (the preload shim's query, answered in
                the calling process: server/protocol.py); else return None, with nothing
                prompted or audited.

        Returns:
            The Decision (with a fresh ``decision_id`` and a ``reason`` for every action) and the
            approver who resolved a prompt ("" if none; for a grant, who granted it). With the
            shared state out of reach (before, during a prompt, or when publishing the audit
            record), a Deny with ``error=True`` whose reason names it: never raises for that.
        """
        started = time.monotonic()
        decision_id = uuid.uuid4().hex
        rules = self.rules.current  # once: the answer and its fingerprint are of the same rules
        fingerprint = getattr(rules, "fingerprint", "") or ""
        why = self.state.unavailable()
        if why is not None and run_only:
            return None
        if why is not None:  # fail closed: no shared audit stream, no shared approvals
            decided = Decided(Decision.deny(why, decision_id=decision_id, error=True), "", "")
        else:
            try:
                by_rules = await self._by_rules(rules, session, program, argv, workdir, decision_id, budget_s,
                                                on_prompt, env, facts, run_only)
                if by_rules is None:
                    return None
                decided = by_rules
            except StateUnavailable as exc:  # the shared state failed while a prompt waited
                decided = Decided(Decision.deny(str(exc), decision_id=decision_id, error=True), "", "unavailable")
        record = self._record(session, program, argv, workdir, decided.decision, decided.approver, started, facts)
        if why is None:
            try:
                await self.state.record(record)
            except StateUnavailable as exc:  # an answer that is not in the shared audit stream is not given
                denied = Decision.deny(str(exc), decision_id=decision_id, rule_id=decided.decision.rule_id, error=True)
                decided = Decided(denied, decided.approver, decided.prompt)
                record = self._record(session, program, argv, workdir, denied, decided.approver, started, facts)
        if self.audit is not None:
            try:
                self.audit.write(record)
            except AuditWriteError as exc:  # an answer that is not in the audit log is not given
                denied = Decision.deny(str(exc), decision_id=decision_id, rule_id=decided.decision.rule_id, error=True)
                decided = Decided(denied, decided.approver, decided.prompt)
                with contextlib.suppress(AuditWriteError):
                    self.audit.write(self._record(session, program, argv, workdir, denied, decided.approver,
                                                  started, facts))
        if decided.cache is not None and fingerprint:
            self._remember(decided.decision, decided.cache, session, program, argv, workdir, facts)
        else:
            decided = decided._replace(cache=None)
        return decided._replace(fingerprint=fingerprint)

    def _remember(self, decision: Decision, hint: CacheHint, session: SessionContext, program: str,
                  argv: Sequence[str], workdir: str, facts: ExecFacts | None) -> None:
        """Keep a cacheable answer's key, so that the cached lines citing it can be verified."""
        digest = _key_digest(hint.scope, session, program, argv, workdir, facts, decision)
        self._issued[decision.decision_id] = (hint.scope.encode() + digest,
                                              time.monotonic() + hint.ttl_s + _ISSUED_SLACK_S)
        while len(self._issued) > ISSUED_MEMORY:
            self._issued.popitem(last=False)

    def _verified(self, record: CachedRecord) -> bool:
        """True when this service issued ``record.cached_from`` as cacheable for its key."""
        issued = self._issued.get(record.cached_from)
        if issued is None or time.monotonic() > issued[1]:
            return False
        scope = issued[0][:-32].decode()
        digest = _key_digest(scope, record.session, record.program, record.argv, record.workdir, record.facts,
                             record.decision)
        return issued[0][-32:] == digest

    async def record_cached(self, records: Sequence[CachedRecord]) -> int:
        """Write decisions an escalation server answered from its cache to the audit log, marked
        ``cached`` (with ``cached_from`` and ``cache_verified``), and publish them to the shared
        audit stream first (as :meth:`decide` does). Returns how many were written.

        Raises:
            StateUnavailable: the shared state is out of reach (nothing is written then: the
                client counts the lines as lost; a line written locally but not to the shared
                stream would make the replicas' records disagree).
        """
        why = self.state.unavailable()
        if why is not None:
            raise StateUnavailable(why)
        now = time.time()
        written = 0
        for item in records:
            decision = item.decision
            sent_at = item.time_unix_ms / 1000.0
            when = sent_at if abs(sent_at - now) <= _CLOCK_SKEW_S else now
            record = AuditRecord(
                decision_id=decision.decision_id, session_id=item.session.session_id,
                labels=dict(item.session.labels), program=item.program, argv=tuple(item.argv),
                workdir=item.workdir, decision=decision.action, rule_id=decision.rule_id,
                reason=decision.reason or "", approver="", latency_ms=item.latency_ms, error=False,
                file_kind=None if item.facts is None or item.facts.file is None else tuple(sorted(item.facts.kinds)),
                children_unseen=None if item.facts is None else item.facts.children_unseen,
                real_path=_real_path(item.facts),
                time=dt.datetime.fromtimestamp(when, dt.timezone.utc),
                cached=True, cached_from=item.cached_from, cache_verified=self._verified(item),
            )
            await self.state.record(record)
            if self.audit is not None:
                try:
                    self.audit.write(record)
                except AuditWriteError as exc:  # the client stops answering from its cache
                    raise StateUnavailable(str(exc)) from exc
            written += 1
        return written

    async def _by_rules(
        self,
        rules: _RuleSet,
        session: SessionContext,
        program: str,
        argv: Sequence[str],
        workdir: str,
        decision_id: str,
        budget_s: float | None,
        on_prompt: PromptHook | None,
        env: Mapping[str, str] | None,
        facts: ExecFacts | None,
        run_only: bool = False,
    ) -> Decided | None:
        """Decide by the rules (and an approver for ``prompt``), without auditing; None when
        ``run_only`` and the rules do not say Run.

        Raises:
            StateUnavailable: the shared state failed while a prompt waited.
        """
        # A worker thread: evaluation of many rules must not hold up the event loop serving every
        # other session (it never touches the filesystem: trust comes from ``facts.identity``).
        evaluation = (rules.evaluate(program, argv, facts) if self.inline_evaluation
                      else await asyncio.to_thread(rules.evaluate, program, argv, facts))
        if run_only and evaluation.decision != "run":
            return None
        rule_id = getattr(evaluation.rule, "id", "") or ""
        reason = evaluation.reason or ""
        execution = evaluation.execution or Execution()
        common = {"rule_id": rule_id, "decision_id": decision_id}
        # An escalation from a directory that exists only in the session's sandbox cannot start
        # where escalated commands run: deny it up front, before any approver is asked.
        stranded = (_stranded_workdir(session, workdir, execution) if evaluation.decision in ("escalate", "prompt")
                    else None)
        if stranded is not None:
            return Decided(Decision.deny(stranded, **common), "")
        if evaluation.decision == "run":
            return Decided(Decision.run(reason=reason, note=untrusted_note(program, evaluation, session), **common), "",
                           cache=self.cache_hint(evaluation))
        if evaluation.decision not in ("escalate", "prompt"):
            return Decided(Decision.deny(reason or "denied by policy", **common), "", cache=self.cache_hint(evaluation))
        set_env = rule_set_env(evaluation)
        # A variable the caller set for this program that will not reach it: say so (once per session).
        note = "" if env is None else withheld_note(env, program, evaluation.allow_env, set_env, rule_id)
        if evaluation.decision == "escalate":
            return Decided(Decision.escalate(execution, reason=reason, note=note, **common), "")
        shown = clean_env(env or {}, evaluation.allow_env, set_env)
        decided = await self._ask(
            session, program, argv, workdir, rule_id, reason, execution, common, budget_s, on_prompt, shown, facts,
        )
        if note and decided.decision.action == "escalate":
            decided = decided._replace(decision=dataclasses.replace(decided.decision, note=note))
        return decided

    def cache_hint(self, evaluation: object) -> CacheHint | None:
        """Whether an escalation server may reuse a Run or Deny the rules alone decided.

        The rules' answer is a function of (program, argv, facts) and of the rules (docs/DESIGN.md
        §5); a Run's note also of the session's sandbox, a fixed part of the session. Neither the
        workdir nor the env nor the labels enter it (the workdir matters only to escalations and
        prompts, never cached). Scope ``program`` when no candidate rule tests argv past argv[0]
        (``Evaluation.argv_free``), else ``exact``. None when caching is off.
        """
        if self.cache_ttl_s <= 0:
            return None
        scope = "program" if getattr(evaluation, "argv_free", False) else "exact"
        return CacheHint(scope=scope, ttl_s=self.cache_ttl_s)

    async def _ask(
        self,
        session: SessionContext,
        program: str,
        argv: Sequence[str],
        workdir: str,
        rule_id: str,
        reason: str,
        execution: Execution,
        common: dict[str, str],
        budget_s: float | None,
        on_prompt: PromptHook | None,
        env: Mapping[str, str],
        facts: ExecFacts | None = None,
    ) -> Decided:
        """Run a prompt through the approvals broker (showing ``env``, the environment that would
        reach the command); approval escalates with ``execution``."""
        wait = self.approvals.timeout_s
        if budget_s is not None:
            # Answer with a timeout denial a little before the caller gives up on us.
            wait = max(0.0, min(wait, budget_s - _ANSWER_MARGIN_S))
        if on_prompt is not None:
            await on_prompt(wait)
        outcome = await self.approvals.request(
            session, program, argv, workdir, rule_id=rule_id, reason=reason, execution=execution, timeout_s=wait,
            env=env, facts=facts,
        )
        if outcome.approved:
            return Decided(Decision.escalate(execution, reason=outcome.reason, **common), outcome.approver,
                           outcome.result)
        return Decided(Decision.deny(outcome.reason, **common), outcome.approver, outcome.result)

    def _record(
        self,
        session: SessionContext,
        program: str,
        argv: Sequence[str],
        workdir: str,
        decision: Decision,
        approver: str,
        started: float,
        facts: ExecFacts | None = None,
    ) -> AuditRecord:
        """The audit record of one decision (``started``: its ``time.monotonic()`` start)."""
        latency_ms = (time.monotonic() - started) * 1000.0
        # DEBUG, not INFO: the audit log is the per-decision record; an INFO line per decision
        # cost ~6 % of the service's CPU at load (BENCHMARKS.md).
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "decision %s session=%s %s %s: %s (rule %s)",
                decision.decision_id, session.session_id, program, list(argv), decision.action,
                decision.rule_id or "default",
            )
        return AuditRecord(
            decision_id=decision.decision_id, session_id=session.session_id,
            labels=dict(session.labels), program=program, argv=tuple(argv), workdir=workdir,
            decision=decision.action, rule_id=decision.rule_id, reason=decision.reason or "",
            approver=approver, latency_ms=latency_ms, error=decision.error,
            file_kind=None if facts is None or facts.file is None else tuple(sorted(facts.kinds)),
            children_unseen=None if facts is None else facts.children_unseen,
            real_path=_real_path(facts),
        )

    def prepare(
        self,
        session: SessionContext,
        program: str,
        argv: Sequence[str],
        workdir: str,
        env: Mapping[str, str],
        execution: Execution,
        facts: ExecFacts | None = None,
    ) -> PreparedExec:
        """Build exactly what the server spawns for an escalated exec (``facts`` as in
        :meth:`decide`, so that the rule that decided, trust included, is the one whose
        ``allow_env`` applies).

        ``unsandboxed`` (and ``session_default`` for a session with no sandbox) gives
        ``[program, *argv[1:]]`` with ``arg0 = argv[0]``; a profile gives a bwrap command line
        (see :func:`execgate.server.sandbox.bwrap_argv`; bwrap cannot set argv[0], so ``arg0`` is
        None and the program sees its path), its ``command[0]`` the absolute bwrap found at
        service start. The environment is built from an allowlist plus the variables that the
        matching rule's ``allow_env`` names, PATH fixed unless allowed, then the rule's
        ``set_env`` (:func:`execgate.policy_service.envclean.clean_env`): the very environment a
        prompt showed. In a session without a sandbox every execution is the plain program
        (:func:`_profile`).

        Raises:
            EscalationRefused: the working directory exists only inside the session's sandbox (its
                private ``/run``, ``/dev`` or ``/proc``, or its private ``/tmp`` for an unsandboxed
                escalation or a session whose ``/tmp`` is a bare tmpfs), a granted root lies in the
                session's own ``/tmp`` directory, or a profile needs bwrap and none was found.
            SandboxError: the bwrap command line cannot be built (see ``bwrap_argv``).
        """
        _check_workdir(session, workdir, execution)
        evaluation = self.rules.current.evaluate(program, argv, facts)
        cleaned = clean_env(env, evaluation.allow_env, rule_set_env(evaluation))
        profile = _profile(execution, session, workdir)
        if profile is None:
            return PreparedExec(command=(program, *argv[1:]), cwd=workdir, env=cleaned, arg0=argv[0])
        if self.bwrap is None:
            raise EscalationRefused("this escalation runs in a sandbox, but the policy service found no bwrap "
                                    "in its trusted system directories")
        command = bwrap_argv(profile, cwd=workdir, bwrap=self.bwrap) + [program, *argv[1:]]
        # A directory in the session's own /tmp exists at that path only inside the sandbox (bwrap's
        # --chdir goes there): bwrap itself starts in "/" on the host.
        cwd = "/" if in_session_tmp(workdir, profile) else workdir
        return PreparedExec(command=tuple(command), cwd=cwd, env=cleaned, arg0=None)


def _key_digest(scope: str, session: SessionContext, program: str, argv: Sequence[str], workdir: str,
                facts: ExecFacts | None, decision: Decision) -> bytes:
    """SHA-256 of a cache entry's key (as the client forms it for ``scope``) and its answer."""
    part: tuple[object, ...] = (argv[0] if argv else "",) if scope == "program" else (tuple(argv), workdir)
    key = (session.session_id, sorted(session.labels.items()), session.sandbox, program, part, facts,
           decision.action, decision.rule_id, decision.reason or "", decision.note)
    return hashlib.sha256(repr(key).encode("utf-8", "surrogateescape")).digest()


def rule_set_env(evaluation: object) -> dict[str, str]:
    """The winning rule's ``set_env`` as a dict ({} without a rule or without set_env)."""
    return dict(getattr(getattr(evaluation, "rule", None), "set_env", ()) or ())


def untrusted_note(program: str, evaluation: object, session: SessionContext) -> str:
    """The note for a Run that a rule would have escalated had ``program`` been trusted, or "".

    A basename rule that escalates applies only to a trusted path (docs/DESIGN.md §5): a
    virtualenv's ``pip`` then runs in the session's sandbox, without the network its rule would
    give, and fails slowly (DNS retries) without saying why. The note names the rule, why it was
    skipped and how to allow it. None for a session without a sandbox (Run is unconfined there).
    """
    box = session.sandbox
    skipped = [r for r in getattr(evaluation, "skipped", ()) if getattr(r, "decision", "") == "escalate"]
    if box is None or not skipped:
        return ""
    rule = skipped[0]
    perms = getattr(rule.execution, "permissions", None)
    lacks = " without network" if not box.network and (perms is None or perms.network) else ""
    directory = os.path.dirname(program)
    why = f" ({rule.justification})" if rule.justification else ""
    return (f"{program} runs in the session's sandbox{lacks}: rule {rule.id} would escalate it{why}, but a rule "
            f"naming {rule.program} by basename applies only to trusted paths (root-owned system directories, "
            f"or trusted_dirs) and {directory} is not one. To allow it: trusted_dirs = [\"{directory}\"] in a "
            "--rules file (this trusts whatever the session puts there), or a rule with its absolute path, "
            f"or use a trusted {rule.program}")


def _stranded_workdir(session: SessionContext, workdir: str, execution: Execution | None = None) -> str | None:
    """Why an escalation run as ``execution`` cannot start in ``workdir``, or None if it can.

    Outside the session's roots, ``/tmp``, ``/run``, ``/dev``, ``/proc`` and the masked real HOME
    inside a sandboxed shell are the sandbox's own, so the same path outside (where an unsandboxed escalation runs)
    is another directory or none at all. One exception: a directory in the session's own ``/tmp``
    (``sandbox.tmp_dir``, bound at ``/tmp`` in the session's sandbox and in every sandboxed
    escalation of it) is the same for a sandboxed escalation (``permissions`` or
    ``session_default``); an unsandboxed one would run on the host, where ``/tmp`` is the host's,
    and is still refused. ``execution`` None: as an unsandboxed one.
    """
    sandbox = session.sandbox
    if sandbox is None or visible_inside(workdir, sandbox):
        return None
    sandboxed = execution is not None and execution.kind in ("permissions", "session_default")
    if sandboxed and in_session_tmp(workdir, sandbox):
        return None
    instead = sandbox.writable_roots[0] if sandbox.writable_roots else "the session's working directory"
    if in_session_tmp(workdir, sandbox):
        return (f"the working directory {workdir} lies in this session's private /tmp, and this command is "
                "escalated unsandboxed: it would run on the host, where /tmp is the host's own, not the "
                f"session's; cd to {instead} (or another of the session's writable roots) and run it from there")
    return (f"the working directory {workdir} exists only inside this session's sandbox (its private /tmp, "
            f"/run, /dev or /proc, or the empty directory in place of your hidden HOME), not where escalated "
            f"commands start; cd to {instead} (or another of the session's writable roots) and run it from there")


def _check_workdir(session: SessionContext, workdir: str, execution: Execution | None = None) -> None:
    """Raises EscalationRefused with :func:`_stranded_workdir`'s message, if any."""
    if (why := _stranded_workdir(session, workdir, execution)) is not None:
        raise EscalationRefused(why)


def _profile(execution: Execution, session: SessionContext, workdir: str) -> Permissions | None:
    """The sandbox profile an execution asks for, or None for none (the plain program).

    **A session without a sandbox** (``session.sandbox`` None: ``--sandbox none``, or ``auto``
    without bubblewrap): None for every execution. Its shell already has the user's full power —
    the whole file system as the user sees it, the network, the real HOME — and an escalation
    runs as the same user, so a profile could only take away: a private ``/tmp`` hid a sibling
    repository from ``git pull ../a`` and a read-only HOME broke ``npm install``'s ``~/.npm``
    (issue #12 item 8). The escalated command therefore sees what the shell sees, with the
    network on whatever the profile says (the shell has it anyway) and the environment its rule
    builds. This widens nothing: a Run in that session is just as unconfined. Confining
    escalations takes a sandboxed session.

    **A sandboxed session**: a ``permissions`` profile grants more than the session has, never
    less: its writable and readable roots are joined by the session sandbox's own (so that
    ``git clone . ../copy`` escalated with network still writes where the shell could). The
    working directory is the caller's claim, not a grant, and is never bound by itself: it is
    writable only if one of the session's roots covers it.

    What the session cannot see or change, its escalations cannot either: the session's masked
    directories, hidden paths (a remote policy service's socket, the token and key files) and
    protected paths (execgate's own package) are joined to the granted profile's. They come from
    the session's profile, which the escalation server (not the session) sends with every request.
    ``session_default`` is the session's profile itself, those included.

    The session's own ``/tmp`` directory (``tmp_dir``) is the session profile's, never the granted
    one's: a sandboxed escalation sees ``/tmp`` as the session does. A granted root under ``/tmp``
    is then refused (:class:`EscalationRefused`): it would be mounted in that directory, which the
    session writes (a symlink put there could redirect the mount).
    """
    box = session.sandbox
    if box is None:
        return None
    if execution.kind == "permissions":
        granted = execution.permissions or Permissions()
        if box.tmp_dir:
            extra = [r for r in (*granted.writable_roots, *granted.readable_roots, *granted.masked_dirs)
                     if under(r, "/tmp") and r not in (*box.writable_roots, *box.readable_roots, *box.masked_dirs)]
            if extra:
                raise EscalationRefused(f"the rule grants {extra[0]}, which lies in /tmp: in this session /tmp is "
                                        "the session's own directory, where a granted root cannot be mounted "
                                        "safely; grant a directory outside /tmp")
        writable = tuple(dict.fromkeys((*granted.writable_roots, *box.writable_roots)))
        readable = tuple(dict.fromkeys(r for r in (*granted.readable_roots, *box.readable_roots) if r not in writable))
        # What the session cannot see (a real HOME behind a private one), its escalations cannot either.
        masked = tuple(dict.fromkeys((*granted.masked_dirs, *box.masked_dirs)))
        hidden = tuple(dict.fromkeys((*granted.hidden_paths, *box.hidden_paths)))
        protected = tuple(dict.fromkeys((*granted.protected_paths, *box.protected_paths)))
        return Permissions(network=granted.network, writable_roots=writable, readable_roots=readable,
                           masked_dirs=masked, hidden_paths=hidden, protected_paths=protected, tmp_dir=box.tmp_dir)
    if execution.kind == "session_default":
        return box
    return None


def _real_path(facts: ExecFacts | None) -> str | None:
    """The identified file's path for the audit line (None when the server identified none)."""
    identity = None if facts is None else facts.identity
    return None if identity is None else identity.real_path
