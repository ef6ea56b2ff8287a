"""The escalation server's metrics and spans: what its gRPC policy client saw (docs/DESIGN.md §4).

One :class:`ClientMetrics` per :class:`~execgate.server.grpc_policy.GrpcPolicy` (or shared by
several), each in a :class:`~prometheus_client.CollectorRegistry` of its own unless one is given
(``execgate run`` gives one registry to its client and its embedded service, and serves it on
``--metrics``). A failed call is never counted as a denial: ``execgate_policy_decisions_total``
counts the decisions the service answered, ``execgate_policy_failures_total`` the calls that got
no usable answer (each a fail-closed Deny for DetermineAction, a refused escalation for
PrepareEscalatedExec). Labels are bounded: method, outcome, a cause from :data:`CAUSES` or a gRPC
status code name; never argv, a program path or a session id.

Traces: one span per ``DetermineAction`` (:data:`CLIENT_SPAN`) with the decision id, outcome, rule
id and session id. With a tracer provider given, the channel also carries OpenTelemetry's grpc.aio
client interceptors (checked here: they work with the stream call through which the client reads
the unary method, see :mod:`execgate.server.grpc_policy`): a CLIENT span per call, whose trace
context they send in the request metadata. Without one (no interceptors on the hot path) the
context of the current span is sent by hand (W3C ``traceparent``), so a globally installed SDK
still joins the service's spans to the caller's trace.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import propagate, trace
from prometheus_client import CollectorRegistry, Counter, Histogram

from execgate.server.telemetry import LATENCY_BUCKETS_S

#: Name of the escalation server's span of one DetermineAction call.
CLIENT_SPAN = "execgate.server.decide"
#: The instrumentation scope of this side's spans.
TRACER_NAME = "execgate.server"

#: Failure causes of our own (the rest are gRPC status code names, lower case).
CAUSES = ("timeout", "garbage", "unavailable")


class ClientMetrics:
    """The metric objects of a policy client, and its tracer.

    Args:
        registry: where to register them (default: a new private registry).
        tracer_provider: an OpenTelemetry tracer provider for the client spans (default: the
            global one, a no-op unless an SDK was installed as global).

    Attributes:
        registry: the registry holding every metric below.
        calls: ``execgate_policy_call_seconds{method}`` — seconds each call to the policy service
            took, from sending to the answer or the failure (a prompt's wait included).
        decisions: ``execgate_policy_decisions_total{outcome}`` — decisions the service answered
            (``run``, ``escalate``, ``deny``; a denial here is the policy's).
        failures: ``execgate_policy_failures_total{method,cause}`` — calls that got no usable
            answer and failed closed, by cause: ``timeout`` (no answer before the deadline),
            ``unavailable`` (nobody listening, connection lost), ``garbage`` (an answer breaking
            the contract), or the gRPC status code (``internal``, ``unauthenticated``, …).
        cache_lookups: ``execgate_policy_cache_lookups_total{result}`` — decision-cache lookups,
            ``hit`` (answered without a call) or ``miss`` (:mod:`execgate.server.decision_cache`).
        cache_audit_lost: ``execgate_policy_cache_audit_lost_total`` — cache hits whose audit
            line never reached the service (``RecordCachedDecisions`` kept failing, or the queue
            was full).
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, tracer_provider: Any = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.tracer_provider = tracer_provider
        self._tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        r = self.registry
        self.calls = Histogram("execgate_policy_call_seconds", "Seconds a call to the policy service took "
                               "(answer or failure), by method", ("method",), buckets=LATENCY_BUCKETS_S,
                               registry=r)
        self.decisions = Counter("execgate_policy_decisions", "Decisions answered by the policy service, by "
                                 "outcome (run, escalate, deny)", ("outcome",), registry=r)
        self.failures = Counter("execgate_policy_failures", "Policy calls that got no usable answer and failed "
                                "closed, by method and cause", ("method", "cause"), registry=r)
        self.cache_lookups = Counter("execgate_policy_cache_lookups", "Decision-cache lookups, by result "
                                     "(hit: answered without a call; miss)", ("result",), registry=r)
        self.cache_audit_lost = Counter("execgate_policy_cache_audit_lost", "Cache hits whose audit line never "
                                        "reached the policy service", registry=r)

    def call_span(self, session_id: str) -> Any:
        """A context manager: the span of one DetermineAction, current inside the block."""
        return self._tracer.start_as_current_span(CLIENT_SPAN, record_exception=False, set_status_on_exception=False,
                                                  attributes={"execgate.session_id": session_id})

    def client_interceptors(self) -> list[Any]:
        """OpenTelemetry's grpc.aio client interceptors for this tracer provider; [] without one
        or without ``opentelemetry-instrumentation-grpc`` (the ``otel`` extra)."""
        if self.tracer_provider is None:
            return []
        try:
            from opentelemetry.instrumentation.grpc import aio_client_interceptors
        except ModuleNotFoundError:
            return []
        return list(aio_client_interceptors(tracer_provider=self.tracer_provider))


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC metadata (W3C ``traceparent``/``tracestate`` by default;
    empty when no span is recording)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())


def describe_answer(span: Any, decision_id: str, outcome: str, rule_id: str) -> None:
    """Put the service's answer on the decision span."""
    span.set_attribute("execgate.decision_id", decision_id)
    span.set_attribute("execgate.outcome", outcome)
    span.set_attribute("execgate.rule_id", rule_id)


def describe_failure(span: Any, cause: str, message: str) -> None:
    """Mark a decision span as failed closed (outcome ``error``; the caller gets a Deny)."""
    span.set_attribute("execgate.outcome", "error")
    span.set_attribute("execgate.error", cause)
    span.set_status(trace.Status(trace.StatusCode.ERROR, message))


class RunTelemetry:
    """``execgate run``'s metrics and traces: one registry for its policy client and (when the
    service is embedded) the service itself, served on ``--metrics`` while the script runs.

    Args:
        listen: ``(host, port)`` for ``/metrics``, or None for no endpoint.
        tracing: the configured tracer provider (:func:`~execgate.server.telemetry.options`), or None.
        embedded: also make the embedded policy service's metrics (:attr:`service`).

    Raises:
        OSError: the metrics address cannot be bound.
    """

    def __init__(self, listen: tuple[str, int] | None, tracing: Any, *, embedded: bool) -> None:
        from execgate.server.telemetry import MetricsEndpoint

        provider = tracing.provider if tracing is not None else None
        self.tracing = tracing
        self.client = ClientMetrics(tracer_provider=provider)
        self.service: Any = None
        if embedded:
            from execgate.policy_service.metrics import PolicyMetrics

            self.service = PolicyMetrics(self.client.registry, tracer_provider=provider)
        self.endpoint = MetricsEndpoint(self.client.registry, *listen) if listen is not None else None

    def close(self) -> None:
        """Stop the endpoint and flush the traces (blocking: call it off the event loop)."""
        if self.endpoint is not None:
            self.endpoint.close()
        if self.tracing is not None:
            self.tracing.shutdown()
