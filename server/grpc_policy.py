"""The escalation server's gRPC policy client: :class:`GrpcPolicy` implements :class:`Policy`.

Failure handling (docs/DESIGN.md §4) is fail closed: whatever goes wrong between the server and the
policy service — nobody listening, a crash mid-session, a slow or hanging handler, an exception,
an answer that breaks the contract — ``determine_action`` returns a Deny with ``error=True`` and
a reason naming the cause, and ``prepare_escalated_exec`` raises :class:`PolicyError` (defined in
:mod:`execgate.server.policy`, importable from here too). Nothing hangs: every call has a
deadline.

Deadlines. Ordinary answers must come within ``timeout_s``. A ``prompt`` waits for a person, so
``DetermineAction`` is sent with the longer ``prompt_timeout_s`` as its gRPC deadline, but the
client still requires, within ``timeout_s``, either the answer or the initial metadata
``execgate-prompt`` by which the service says it is waiting for an approver; only then does it
wait on, up to ``prompt_timeout_s``. The service sees that deadline and answers a silent prompt
with a timed-out Deny just before it. So a hung service costs ``timeout_s``, never the prompt time.
grpc.aio delivers a unary call's initial metadata only together with its response, so the client
invokes the (unary) ``DetermineAction`` method through a server-streaming call object, which
reads headers on their own; cardinality is not on the wire, so the service is unaffected.

Replicas (docs/DESIGN.md §9): ``address`` may name several, in any target syntax gRPC resolves
itself — ``ipv4:127.0.0.1:7001,127.0.0.1:7002`` (a list), ``dns:///policy.example:7000`` (every
address of a name, re-resolved as it changes). The channel balances with gRPC's ``round_robin``
and its client-side health checking (``healthCheckConfig``): a replica reporting ``NOT_SERVING``
gets no calls; with none serving, calls fail at once (UNAVAILABLE) and are denied, fail closed.

Retries: only transport unavailability, by gRPC's own retry policy (service config), inside the
same deadline — with several replicas the retry goes to the next one, so a replica that dies
with calls in flight costs at most those calls (a call whose answer had begun is not retried);
``waitForReady`` is false so that a service that is down fails fast.

Metrics and traces (:mod:`execgate.server.metrics`): every call's latency, the decisions answered
by outcome and the failures by cause, kept apart; one CLIENT span per DetermineAction whose trace
context travels in the request metadata; decision-cache lookups by result (hit, miss) and the
audit lines of hits that were lost.

Decision cache (:mod:`execgate.server.decision_cache`, docs/DESIGN.md §9): an answer the service
marks cacheable (a Run or Deny of the rules alone, ``DetermineActionResponse.cache``) is reused
for the same session and file for its TTL, without a call; every reuse is still audited: it gets
a fresh decision id of the client's and is sent to the service with ``RecordCachedDecisions``
in batches (every 0.5 s, 256 at a time, and when a session closes: :meth:`GrpcPolicy.session_closed`).
An answer the service announced as a prompt is never cached, whatever it says. The cache answers
only while the channel is READY and no call has failed since the last success (a failed call
empties it): a service that is down or unhealthy gets every exec denied, fail closed, as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections import Counter
from typing import Any, Mapping, Sequence

import grpc

from execgate.server import policy_codec as codec
from execgate.server import protocol as p
from execgate.server.decision_cache import CachedAudit, DecisionCache, Hit
from execgate.server.metrics import ClientMetrics, describe_answer, describe_failure, trace_metadata
from execgate.server.policy import Decision, ExecFacts, Execution, PolicyError, PreparedExec, SessionContext
from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc

log = logging.getLogger(__name__)

#: Initial-metadata key by which the service announces a prompt (see the module docstring).
PROMPT_METADATA_KEY = "execgate-prompt"

_SERVICE_CONFIG = json.dumps(
    {
        # Several replicas (``ipv4:H1:P1,H2:P2``, a ``dns:`` name with several addresses): spread
        # the calls, and leave out a replica whose health service says NOT_SERVING (a stopping
        # one, or one that lost its shared state) — gRPC's client-side health checking.
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": ""},
        "methodConfig": [
            {
                "name": [{"service": "execgate.v1.EscalationPolicy"}],
                "waitForReady": False,
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "0.5s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

_CHANNEL_OPTIONS = (
    ("grpc.service_config", _SERVICE_CONFIG),
    ("grpc.enable_retries", 1),
    # A restarted service must be reachable again within a deadline, not after gRPC's default
    # reconnect backoff (1 s growing to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_send_message_length", p.GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", p.GRPC_MAX_MESSAGE_BYTES),
)


class _NoAnswer(Exception):
    """The service sent neither an answer nor a prompt notice within ``timeout_s``."""


def _expect(response: object, kind: type) -> Any:
    """``response`` if it is a ``kind`` message; grpc.aio gives None for undecodable bytes."""
    if not isinstance(response, kind):
        raise codec.CodecError(f"undecodable response (expected {kind.__name__})")
    return response


async def _single(call: grpc.aio.UnaryStreamCall) -> object:
    """The one response of a unary method read through a stream call.

    Raises:
        grpc.aio.AioRpcError: the call failed. codec.CodecError: it ended without a response.
    """
    response = await call.read()
    if response is grpc.aio.EOF:
        code = await call.code()
        if code != grpc.StatusCode.OK:
            raise codec.CodecError(f"call ended with {code.name}: {await call.details()}")
        raise codec.CodecError("call ended without a response")
    return response


class GrpcPolicy:
    """A :class:`~execgate.server.policy.Policy` that asks a remote ``execgate.v1`` service.

    Args:
        address: ``unix:///path``, ``host:port``, or several replicas (``ipv4:H:P1,H:P2``,
            ``dns:///name:port``): see the module docstring.
        token: bearer token sent as ``authorization: Bearer <token>``, or None.
        tls: channel credentials for TLS (see ``grpc.ssl_channel_credentials``), or None for a
            plaintext channel (the default for Unix sockets).
        timeout_s: deadline of an ordinary answer, in seconds.
        prompt_timeout_s: deadline of a DetermineAction that waits for an approver, in seconds.
        metrics: where calls, decisions and failures are counted and spans made (default: a
            private :class:`~execgate.server.metrics.ClientMetrics`); see ``self.metrics.registry``.
        cache: the decision cache (module doc) — True for a default
            :class:`~execgate.server.decision_cache.DecisionCache`, an instance, or False/None to
            ask the service about every exec whatever it marks cacheable.
        audit_interval_s, audit_batch: how often, and from how many waiting hits, cached
            decisions are sent to the service's audit log; ``audit_batch`` is also the most
            hits answered before their lines are written (past it, an exec is asked of the
            service, which writes its line before answering).

    The channel is created lazily inside the running event loop on the first call; close it
    with :meth:`aclose`. ``stats`` counts outcomes: run, escalate, deny (policy denials) and
    error (fail-closed denials), kept apart.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls: grpc.ChannelCredentials | None = None,
        timeout_s: float = 5.0,
        prompt_timeout_s: float = 300.0,
        metrics: ClientMetrics | None = None,
        cache: DecisionCache | bool | None = True,
        audit_interval_s: float = 0.5,
        audit_batch: int = 64,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.prompt_timeout_s = max(prompt_timeout_s, timeout_s)
        self._tls = tls
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel: grpc.aio.Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stub: policy_pb2_grpc.EscalationPolicyStub | None = None
        self._determine_call: grpc.aio.UnaryStreamMultiCallable | None = None
        self.stats: Counter[str] = Counter()
        self.metrics = metrics if metrics is not None else ClientMetrics()
        # The counters of every lookup, resolved once (a labels() lookup per exec is ~2 us).
        self._cache_hits = self.metrics.cache_lookups.labels("hit")
        self._cache_misses = self.metrics.cache_lookups.labels("miss")
        self._inject = True
        #: The decision cache, or None when off.
        self.cache: DecisionCache | None = DecisionCache() if cache is True else (cache or None)
        self._record_call: grpc.aio.UnaryUnaryMultiCallable | None = None
        self._cache_ok = True
        #: When a call last succeeded (monotonic s); hits are made only within ``_contact_s`` of it.
        self._last_contact = float("-inf")
        self._contact_s = 3 * audit_interval_s
        #: The audit of cache hits (``cached_audit.lost`` counts lines that never reached the service).
        self.cached_audit = CachedAudit(self._record_cached, on_fingerprint=self._observe_fingerprint,
                                        interval_s=audit_interval_s, batch=audit_batch,
                                        on_lost=self.metrics.cache_audit_lost.inc)

    def _get_stub(self) -> policy_pb2_grpc.EscalationPolicyStub:
        loop = asyncio.get_running_loop()
        if self._stub is None or self._loop is not loop:
            interceptors = self.metrics.client_interceptors() or None
            self._inject = interceptors is None  # the interceptors send the trace context themselves
            if self._tls is not None:
                self._channel = grpc.aio.secure_channel(self.address, self._tls, options=_CHANNEL_OPTIONS,
                                                        interceptors=interceptors)
            else:
                self._channel = grpc.aio.insecure_channel(self.address, options=_CHANNEL_OPTIONS,
                                                          interceptors=interceptors)
            self._loop = loop
            self._stub = policy_pb2_grpc.EscalationPolicyStub(self._channel)
            self._determine_call = self._channel.unary_stream(
                "/execgate.v1.EscalationPolicy/DetermineAction",
                request_serializer=pb.DetermineActionRequest.SerializeToString,
                response_deserializer=pb.DetermineActionResponse.FromString,
            )
            self._record_call = self._stub.RecordCachedDecisions
        return self._stub

    async def aclose(self) -> None:
        """Close the channel (in-flight calls are cancelled). The object may be used again.

        After a connection broke, grpc may still deliver the completion of a reconnect attempt to
        this event loop a few hundred ms after the close; keep the loop running that long if it
        is about to be closed (the escalation server's loop normally outlives its policy).
        """
        if self._channel is not None and self._loop is asyncio.get_running_loop():
            await self.cached_audit.aclose()  # the last hits go to the audit log before the channel closes
        channel, self._channel, self._stub, self._determine_call = self._channel, None, None, None
        self._record_call = None
        if channel is not None:
            await channel.close()

    async def session_closed(self, session_id: str) -> None:
        """A session ended: send its (and every) waiting cache hit to the audit log now and drop
        its cache entries. Never raises (a failed send is logged and counted)."""
        if self.cache is not None:
            self.cache.forget_session(session_id)
        await self.cached_audit.flush(session_id)

    #: The escalation server passes the caller's environment (shown to approvers of a prompt).
    accepts_env = True
    #: The escalation server passes what it learnt of the file (``ExecTarget.identity`` and the
    #: file info, fields 20 and 30-32).
    accepts_facts = True

    async def determine_action(
        self, program: str, argv: Sequence[str], workdir: str, session: SessionContext,
        env: Mapping[str, str] | None = None, facts: ExecFacts | None = None,
    ) -> Decision:
        """Ask the service to decide one exec; never raises except on cancellation.

        Args:
            env: the caller's environment, or None; sent so that a prompt shows the approver
                the variables that would reach the command.
            facts: what the server learnt of the file (identity and file info, ``ExecTarget``
                fields 20 and 30-32), or None to send none (then nothing is trusted).

        Returns:
            The service's decision, or ``Decision.deny(reason, error=True)`` on any failure.
        """
        started = time.monotonic()
        if self.cache is not None:
            entry = self.cache.get(session, program, argv, workdir, facts) if self._cache_usable() else None
            if entry is not None:
                return self._answer_cached(entry.decision, session, program, argv, workdir, facts, started)
            self._cache_misses.inc()
        request = pb.DetermineActionRequest(
            session=codec.session_to_pb(session), target=codec.target_to_pb(program, argv, workdir, facts),
            env={codec.wire_text(k): codec.wire_text(v) for k, v in (env or {}).items()},
        )
        with self.metrics.call_span(session.session_id) as span:
            try:
                response, prompted = await self._determine(request)
                response = _expect(response, pb.DetermineActionResponse)
                decision = codec.decision_from_pb(response.decision)
            except (grpc.aio.AioRpcError, codec.CodecError, _NoAnswer) as exc:
                cause = self._describe(exc)
                self._failed("DetermineAction", exc, started)
                self._cache_fault()
                describe_failure(span, self._classify(exc), cause)
                log.warning("policy error, failing closed (session %s, %s): %s", session.session_id, program, cause)
                return Decision.deny(f"policy service error: {cause}", error=True)
            describe_answer(span, decision.decision_id, decision.action, decision.rule_id)
        if self.cache is not None:
            self._cache_ok = True
            self._last_contact = time.monotonic()
            self._maybe_cache(response, prompted, decision, session, program, argv, workdir, facts)
        self.metrics.calls.labels("DetermineAction").observe(time.monotonic() - started)
        self.metrics.decisions.labels(decision.action).inc()
        self.stats[decision.action] += 1
        if decision.action == "deny":
            log.info("policy denied %s (session %s, rule %s): %s", program, session.session_id,
                     decision.rule_id or "default", decision.reason)
        return decision

    @property
    def answers_queries(self) -> bool:
        """Whether :meth:`query_run` can answer at all (the cache is on): the session then tells
        the preload shim to ask first (server/protocol.py, the cached-only query)."""
        return self.cache is not None

    def query_run(self, program: str, argv: Sequence[str], workdir: str, session: SessionContext,
                  facts: ExecFacts | None) -> Decision | None:
        """The cached Run for this exec, counted and queued for the audit log as every hit is; None
        (nothing counted, nothing audited) when the cache is off or unusable (:meth:`_cache_usable`),
        has no entry, or holds another answer. Never asks the service; never raises. Serves the
        preload shim's cached-only query (:mod:`execgate.server.protocol`)."""
        if self.cache is None or not self._cache_usable():
            return None
        started = time.monotonic()
        entry = self.cache.get(session, program, argv, workdir, facts)
        if entry is None or entry.decision.action != "run":
            return None
        return self._answer_cached(entry.decision, session, program, argv, workdir, facts, started)

    def _maybe_cache(self, response: pb.DetermineActionResponse, prompted: bool, decision: Decision,
                     session: SessionContext, program: str, argv: Sequence[str], workdir: str,
                     facts: ExecFacts | None) -> None:
        """Keep an answer the service marked cacheable (never a prompt's, never an approver's)."""
        assert self.cache is not None
        self._observe_fingerprint(response.rules_fingerprint)
        hint = codec.cache_hint_from_pb(response)
        if hint is None or prompted or response.decision.approver:
            return
        self.cache.put(session, program, tuple(argv), workdir, facts, decision, hint)

    def _cache_usable(self) -> bool:
        """Answer from the cache only while the service is reachable: the last call succeeded, one
        succeeded within the last ``3 × audit_interval_s`` seconds (the audit of hits flushes
        every ``audit_interval_s``, so a steady stream of hits keeps it fresh), and the channel is
        READY (gRPC's own view, health checking included). A service that is down, unhealthy or
        hung (a frozen process keeps its connection READY) gets every exec decided, and so denied,
        as without the cache once that window has passed (fail closed); no hit is made that could
        not be audited, and at most ``audit_batch`` hits wait for their audit lines at once (a
        failure to write them loses no more than those: :class:`CachedAudit` counts them)."""
        channel = self._channel
        return (self._cache_ok and channel is not None and self._loop is asyncio.get_running_loop()
                and self.cached_audit.waiting < self.cached_audit.batch
                and time.monotonic() - self._last_contact <= self._contact_s
                and channel.get_state() == grpc.ChannelConnectivity.READY)

    def _cache_fault(self) -> None:
        """A call failed: empty the cache and use it again only after a call succeeds."""
        self._cache_ok = False
        if self.cache is not None:
            self.cache.clear()

    def _observe_fingerprint(self, fingerprint: str) -> None:
        if self.cache is not None:
            self.cache.observe(fingerprint)

    def _answer_cached(self, cached: Decision, session: SessionContext, program: str, argv: Sequence[str],
                       workdir: str, facts: ExecFacts | None, started: float) -> Decision:
        """A cache hit: the cached answer under a fresh decision id, queued for the audit log."""
        decision = dataclasses.replace(cached, decision_id=uuid.uuid4().hex)
        self._cache_hits.inc()
        self.stats[decision.action] += 1
        self.stats["cache_hit"] += 1
        self.cached_audit.add(Hit(
            session=session, program=program, argv=tuple(argv), workdir=workdir, facts=facts, decision=decision,
            cached_from=cached.decision_id, time_unix_ms=int(time.time() * 1000),
            latency_ms=(time.monotonic() - started) * 1000.0,
        ))
        if decision.action == "deny":
            log.info("policy denied %s (session %s, rule %s, cached): %s", program, session.session_id,
                     decision.rule_id or "default", decision.reason)
        return decision

    async def _record_cached(self, hits: Sequence[Hit]) -> str:
        """``RecordCachedDecisions`` for a batch of hits; returns the service's rules fingerprint.

        Raises:
            grpc.aio.AioRpcError: the call failed (the caller retries or counts the loss).
        """
        # A batch is mostly the same few execs over and over: encode each session and each
        # target once per batch (17 -> 5 us per hit here), the messages are copied into each line.
        sessions: dict[int, pb.SessionContext] = {}  # by id(): the hits keep the objects alive
        targets: dict[tuple[Any, ...], pb.ExecTarget] = {}
        decisions = []
        for hit in hits:
            session = sessions.get(id(hit.session))
            if session is None:
                session = sessions[id(hit.session)] = codec.session_to_pb(hit.session)
            key = (hit.program, hit.argv, hit.workdir, hit.facts)
            target = targets.get(key)
            if target is None:
                target = targets[key] = codec.target_to_pb(hit.program, hit.argv, hit.workdir, hit.facts)
            decisions.append(pb.CachedDecision(
                session=session, target=target,
                decision=codec.decision_to_pb(hit.decision), cached_from=hit.cached_from,
                time_unix_ms=hit.time_unix_ms, latency_ms=hit.latency_ms,
            ))
        request = pb.RecordCachedDecisionsRequest(decisions=decisions)
        self._get_stub()
        assert self._record_call is not None
        started = time.monotonic()
        try:
            response = await self._record_call(request, timeout=self.timeout_s, metadata=self._metadata,
                                               wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            self._failed("RecordCachedDecisions", exc, started, count_error=False)
            self._cache_fault()  # hits that cannot be audited are not made
            raise
        self.metrics.calls.labels("RecordCachedDecisions").observe(time.monotonic() - started)
        self._last_contact = time.monotonic()
        return response.rules_fingerprint

    def _failed(self, method: str, exc: Exception, started: float, *, count_error: bool = True) -> None:
        """Count a call that failed closed (never as a denial)."""
        if count_error:
            self.stats["error"] += 1
        self.metrics.calls.labels(method).observe(time.monotonic() - started)
        self.metrics.failures.labels(method, self._classify(exc)).inc()

    async def _determine(self, request: pb.DetermineActionRequest) -> tuple[object, bool]:
        """The answer, and whether the service announced a prompt first."""
        self._get_stub()
        assert self._determine_call is not None
        metadata = self._metadata + trace_metadata() if self._inject else self._metadata
        call = self._determine_call(request, timeout=self.prompt_timeout_s, metadata=metadata, wait_for_ready=False)
        try:
            try:
                async with asyncio.timeout(self.timeout_s):
                    metadata = await call.initial_metadata()
                    if not any(key == PROMPT_METADATA_KEY for key, _ in metadata or ()):
                        return await _single(call), False
            except TimeoutError:
                raise _NoAnswer(f"no answer within {self.timeout_s:g} s") from None
            return await _single(call), True  # an approver is being asked: the gRPC deadline bounds the wait
        finally:
            if not call.done():
                call.cancel()

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
        """Ask the service what to spawn for an escalated exec (``facts`` as for
        :meth:`determine_action`: the rule that decided, and so its env allowlist, depends on
        them).

        Raises:
            PolicyError: the service failed or answered garbage; the message names the cause.
        """
        request = pb.PrepareEscalatedExecRequest(
            session=codec.session_to_pb(session),
            target=codec.target_to_pb(program, argv, workdir, facts),
            env={codec.wire_text(k): codec.wire_text(v) for k, v in env.items()},
            execution=codec.execution_to_pb(execution),
        )
        started = time.monotonic()
        try:
            response = _expect(
                await self._get_stub().PrepareEscalatedExec(
                    request, timeout=self.timeout_s, metadata=self._metadata, wait_for_ready=False
                ),
                pb.PrepareEscalatedExecResponse,
            )
            if not response.HasField("prepared"):
                raise codec.CodecError("PreparedExec missing from the answer")
            prepared = codec.prepared_from_pb(response.prepared)
            restored = codec.restore_text(prepared, (program, *argv, workdir, *env.keys(), *env.values()))
        except (grpc.aio.AioRpcError, codec.CodecError) as exc:
            cause = self._describe(exc)
            self._failed("PrepareEscalatedExec", exc, started)
            log.warning("policy error preparing %s (session %s): %s", program, session.session_id, cause)
            raise PolicyError(f"policy service error: {cause}") from exc
        self.metrics.calls.labels("PrepareEscalatedExec").observe(time.monotonic() - started)
        return restored

    def _unready(self) -> bool:
        """True when the channel is not connected (a deadline then means unavailable, not slow)."""
        state = self._channel.get_state() if self._channel is not None else None
        return state is not None and state != grpc.ChannelConnectivity.READY

    def _classify(self, exc: Exception) -> str:
        """The bounded label of a failure: ``timeout``, ``unavailable``, ``garbage`` or the gRPC
        status code name in lower case (see :class:`~execgate.server.metrics.ClientMetrics`)."""
        if isinstance(exc, codec.CodecError):
            return "garbage"
        code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else grpc.StatusCode.DEADLINE_EXCEEDED
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "unavailable" if self._unready() else "timeout"
        if code == grpc.StatusCode.INTERNAL and "deserializ" in (exc.details() or "").lower():  # type: ignore[union-attr]
            return "garbage"
        return code.name.lower()

    def _describe(self, exc: Exception) -> str:
        """One line naming the cause of a failed call."""
        if isinstance(exc, _NoAnswer) or (
            isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        ):
            # Still retrying a transport failure when the deadline came? Then say that, not "slow".
            if self._unready():
                assert self._channel is not None
                state = self._channel.get_state().name.lower()
                return f"policy service at {self.address} is unavailable (connection {state}, no answer before the deadline)"
            return f"policy service at {self.address} is not answering (no answer before the deadline)"
        if isinstance(exc, codec.CodecError):
            return f"policy service at {self.address} answered garbage: {exc}"
        assert isinstance(exc, grpc.aio.AioRpcError)
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"policy service at {self.address} is unavailable: {details}"
        if code == grpc.StatusCode.UNKNOWN:
            return f"policy service at {self.address} raised an error: {details}"
        if code == grpc.StatusCode.INTERNAL and "deserializ" in details.lower():
            return f"policy service at {self.address} answered garbage: {details}"
        return f"policy service at {self.address} failed with {code.name}: {details}"
