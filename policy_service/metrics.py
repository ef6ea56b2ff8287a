"""The policy service's metrics and its decision span (docs/DESIGN.md §4).

One :class:`PolicyMetrics` per service instance, each with its own
:class:`~prometheus_client.CollectorRegistry` (never the process-wide default: two services in one
process, or one test after another, count apart). Serve it with
:class:`execgate.server.telemetry.MetricsEndpoint`.

A failed request is an **error**, never a denial: ``execgate_decisions_total`` counts only the
decisions the service made (Run, Escalate, Deny), ``execgate_decision_errors_total`` the
``DetermineAction`` calls that got none. Labels are bounded: ``rule`` is a rule id from the rules
files ("" for the configured default), never argv, a program path or a session id.

Traces: :meth:`PolicyMetrics.decision_span` starts one span per ``DetermineAction`` through the
OpenTelemetry API, with the decision id, outcome, rule id and session id as attributes (never argv
or the environment); without a configured SDK it costs a no-op.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from execgate.server.telemetry import LATENCY_BUCKETS_S

#: Name of the span made for each ``DetermineAction``.
DECISION_SPAN = "execgate.policy.decide"
#: The instrumentation scope of this side's spans.
TRACER_NAME = "execgate.policy_service"

#: Span attribute names (the ``execgate.`` namespace; no argv, env or program path).
ATTR_DECISION_ID = "execgate.decision_id"
ATTR_OUTCOME = "execgate.outcome"
ATTR_RULE_ID = "execgate.rule_id"
ATTR_SESSION_ID = "execgate.session_id"
ATTR_PROMPT = "execgate.prompt"
ATTR_ERROR = "execgate.error"


class PolicyMetrics:
    """The metric objects of one policy service, in a registry of its own.

    Args:
        registry: where to register them (default: a new private registry). ``execgate run``
            passes the registry its own client metrics use, to serve both on one endpoint.
        tracer_provider: an OpenTelemetry tracer provider for the decision spans (default: the
            global one, a no-op unless an SDK was installed as global).

    Attributes:
        registry: the registry holding every metric below.
        decisions: ``execgate_decisions_total{outcome,rule}`` — decisions made, by outcome
            (``run``, ``escalate``, ``deny``) and deciding rule id.
        errors: ``execgate_decision_errors_total{cause}`` — ``DetermineAction`` calls answered
            with an error instead of a decision (``invalid_argument``: a bad or oversized
            request; ``internal``: the rules engine failed).
        latency: ``execgate_decision_seconds{outcome}`` — seconds from request to answer, a
            prompt's wait for an approver included (outcome ``error`` for the errors).
        prompts: ``execgate_prompts_total{result}`` — how prompts ended (one of
            :data:`~execgate.policy_service.approvals.RESULTS`).
        prepare_errors: ``execgate_prepare_errors_total{cause}`` — ``PrepareEscalatedExec`` calls
            that built nothing (``invalid_argument``, ``refused``: no safe command, ``internal``).
        pending: ``execgate_pending_approvals`` — prompts waiting for an answer now (bound to a
            broker by :meth:`watch_approvals`).
        approvers: ``execgate_connected_approvers`` — approvers subscribed now.
        cached_decisions: ``execgate_cached_decisions_total{outcome}`` — decisions escalation
            servers answered from their cache and reported (``RecordCachedDecisions``), by outcome.
        cached_record_errors: ``execgate_cached_record_errors_total{cause}`` —
            ``RecordCachedDecisions`` calls refused (``invalid_argument``, ``state_unavailable``).
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, tracer_provider: Any = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.tracer_provider = tracer_provider
        self._tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        r = self.registry
        self.decisions = Counter("execgate_decisions", "Decisions made by the policy service, by outcome "
                                 "(run, escalate, deny) and deciding rule id (empty: the default)",
                                 ("outcome", "rule"), registry=r)
        self.errors = Counter("execgate_decision_errors", "DetermineAction calls answered with an error "
                              "instead of a decision, by cause", ("cause",), registry=r)
        self.latency = Histogram("execgate_decision_seconds", "Seconds the policy service took to answer "
                                 "DetermineAction (a prompt's wait included), by outcome", ("outcome",),
                                 buckets=LATENCY_BUCKETS_S, registry=r)
        self.prompts = Counter("execgate_prompts", "Prompts by how they ended", ("result",), registry=r)
        self.prepare_errors = Counter("execgate_prepare_errors", "PrepareEscalatedExec calls that "
                                      "prepared nothing, by cause", ("cause",), registry=r)
        self.cached_decisions = Counter("execgate_cached_decisions", "Decisions answered from a client's "
                                        "cache and audited here, by outcome (run, deny)", ("outcome",), registry=r)
        self.cached_record_errors = Counter("execgate_cached_record_errors", "RecordCachedDecisions calls "
                                            "refused, by cause", ("cause",), registry=r)
        self.pending = Gauge("execgate_pending_approvals", "Prompts waiting for an approver's answer now",
                             registry=r)
        self.approvers = Gauge("execgate_connected_approvers", "Approvers subscribed to pending requests now",
                               registry=r)

    def watch_approvals(self, pending: Callable[[], int], approvers: Callable[[], int]) -> None:
        """Report ``pending()`` and ``approvers()`` (called at each scrape, from the HTTP thread:
        they must only read, e.g. a ``len``) as the two gauges."""
        self.pending.set_function(pending)
        self.approvers.set_function(approvers)

    def decided(self, outcome: str, rule_id: str, seconds: float, prompt: str = "") -> None:
        """Count one decision made in ``seconds``; ``prompt`` is how its prompt ended ("": none)."""
        self.decisions.labels(outcome, rule_id).inc()
        self.latency.labels(outcome).observe(seconds)
        if prompt:
            self.prompts.labels(prompt).inc()

    def failed(self, cause: str, seconds: float) -> None:
        """Count one ``DetermineAction`` answered with an error (never a decision)."""
        self.errors.labels(cause).inc()
        self.latency.labels("error").observe(seconds)

    @contextlib.contextmanager
    def decision_span(self) -> Iterator[trace.Span]:
        """The span of one ``DetermineAction`` (a child of the caller's trace when the request
        carried one); set the session id once the request is checked, and the outcome with
        :func:`describe_decision` or :func:`describe_error`."""
        with self._tracer.start_as_current_span(DECISION_SPAN, kind=trace.SpanKind.INTERNAL,
                                                record_exception=False, set_status_on_exception=False) as span:
            yield span


def describe_decision(span: trace.Span, decision_id: str, outcome: str, rule_id: str, prompt: str = "") -> None:
    """Put a decision's id, outcome, rule id and prompt result on its span."""
    span.set_attribute(ATTR_DECISION_ID, decision_id)
    span.set_attribute(ATTR_OUTCOME, outcome)
    span.set_attribute(ATTR_RULE_ID, rule_id)
    if prompt:
        span.set_attribute(ATTR_PROMPT, prompt)


def describe_error(span: trace.Span, cause: str, message: str) -> None:
    """Mark a decision's span as failed with ``cause`` (no decision was made)."""
    span.set_attribute(ATTR_OUTCOME, "error")
    span.set_attribute(ATTR_ERROR, cause)
    span.set_status(trace.Status(trace.StatusCode.ERROR, message))


def server_interceptors(tracer_provider: Any) -> list[Any]:
    """OpenTelemetry's grpc.aio server interceptor (one SERVER span per call, the caller's trace
    context taken from the request metadata), health checks left out; [] without a
    ``tracer_provider`` or without ``opentelemetry-instrumentation-grpc`` (the ``otel`` extra)."""
    if tracer_provider is None:
        return []
    try:
        from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters
    except ModuleNotFoundError:
        return []
    return [aio_server_interceptor(tracer_provider=tracer_provider, filter_=filters.negate(filters.health_check()))]
