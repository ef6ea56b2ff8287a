"""Metrics and traces (docs/DESIGN.md §4), for real: a policy service and a GrpcPolicy client on real
gRPC, both ``/metrics`` endpoints scraped over HTTP, spans read from the SDK's in-memory exporter.

Every outcome is made once — run, escalate, deny, a prompt left to time out, a request the service
rejects, and a call to a stopped service (a fail-closed Deny that both sides count as an error,
never as a denial) — and the scraped counters are asserted exactly."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from execgate.policy_service.metrics import DECISION_SPAN, PolicyMetrics
from execgate.server.grpc_policy import GrpcPolicy
from execgate.server.metrics import CLIENT_SPAN, ClientMetrics
from execgate.server.policy import SessionContext
from execgate.server.telemetry import MetricsEndpoint, TelemetryError, parse_metrics_address

from identity_support import system_facts
from policy_fixtures import rules_file, release_grpc_objects, service  # noqa: F401 - fixtures
from test_approvals import Approver

pytestmark = pytest.mark.anyio

SESSION = SessionContext("sess-metrics", {"agent": "a"})
LOOPBACK = ("127.0.0.1", 0)


def scrape(url: str) -> str:
    """GET ``url`` (blocking: call through asyncio.to_thread)."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        return reply.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page: ``(name, sorted labels) → value``."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(page: dict, name: str, **labels: str) -> float:
    return page.get((name, tuple(sorted(labels.items()))), 0.0)


async def scraped(url: str) -> dict:
    return samples(await asyncio.to_thread(scrape, url))


def tracer() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def ask(policy: GrpcPolicy, program: str, *args: str, workdir: str = "/tmp"):
    """Ask as an escalation server would, with the facts it sends for a system file."""
    return await policy.determine_action(program, [program.rsplit("/", 1)[-1], *args], workdir, SESSION,
                                         facts=system_facts(program))


async def test_every_outcome_is_counted_once_on_both_sides_and_traced(service, short_tmp: Path) -> None:
    provider, exporter = tracer()
    audit = short_tmp / "audit.jsonl"
    client = ClientMetrics(tracer_provider=provider)
    client_endpoint = MetricsEndpoint(client.registry, *LOOPBACK)
    policy_metrics = PolicyMetrics(tracer_provider=provider)
    try:
        async with service(audit_log=audit, approval_timeout_s=0.5, metrics=policy_metrics,
                           metrics_listen=LOOPBACK) as server, \
                grpc.aio.insecure_channel(server.addresses[0]) as approvals_channel:
            assert server.metrics_url is not None and server.metrics_url.endswith("/metrics")
            policy = GrpcPolicy(server.addresses[0], metrics=client, timeout_s=2)
            assert (await ask(policy, "/bin/echo", "hi")).action == "run"
            assert (await ask(policy, "/usr/bin/env")).action == "escalate"
            assert (await ask(policy, "/bin/rm", "-rf", "x")).reason == "no deleting"
            # A prompt an approver sees but never answers: pending while it waits, then timed out.
            approver = await Approver(server, approvals_channel).connected()
            asking = asyncio.ensure_future(ask(policy, "/bin/ls", "-l"))
            await approver.next()
            waiting = await scraped(server.metrics_url)
            assert value(waiting, "execgate_pending_approvals") == 1
            assert value(waiting, "execgate_connected_approvers") == 1
            timed_out = await asyncio.wait_for(asking, 10)
            assert timed_out.action == "deny" and "timed out" in (timed_out.reason or "") and not timed_out.error
            await approver.close()
            # A request the service rejects (relative workdir): an error on both sides, not a denial.
            rejected = await ask(policy, "/bin/echo", workdir="relative")
            assert rejected.error and rejected.action == "deny"
            page = await scraped(server.metrics_url)
        # The service is gone: the client fails closed, counted as a failure (unavailable).
        down = await ask(policy, "/bin/echo", "again")
        assert down.error and down.action == "deny"
        await policy.aclose()
        ours = await scraped(client_endpoint.url)
    finally:
        await asyncio.to_thread(client_endpoint.close)

    # The service's side: decisions by outcome and rule, errors apart, latency per outcome.
    assert value(page, "execgate_decisions_total", outcome="run", rule="echo-run") == 1
    assert value(page, "execgate_decisions_total", outcome="escalate", rule="env-escalate") == 1
    assert value(page, "execgate_decisions_total", outcome="deny", rule="rm-deny") == 1
    assert value(page, "execgate_decisions_total", outcome="deny", rule="ls-prompt") == 1
    assert sum(v for (n, _), v in page.items() if n == "execgate_decisions_total") == 4
    assert value(page, "execgate_decision_errors_total", cause="invalid_argument") == 1
    assert sum(v for (n, _), v in page.items() if n == "execgate_decision_errors_total") == 1
    assert value(page, "execgate_prompts_total", result="timeout") == 1
    assert value(page, "execgate_pending_approvals") == 0
    for outcome, count in (("run", 1), ("escalate", 1), ("deny", 2), ("error", 1)):
        assert value(page, "execgate_decision_seconds_count", outcome=outcome) == count
        assert value(page, "execgate_decision_seconds_bucket", outcome=outcome, le="+Inf") == count

    # The client's side: decisions answered, failures by cause, every call's latency.
    assert value(ours, "execgate_policy_decisions_total", outcome="run") == 1
    assert value(ours, "execgate_policy_decisions_total", outcome="escalate") == 1
    assert value(ours, "execgate_policy_decisions_total", outcome="deny") == 2
    assert value(ours, "execgate_policy_failures_total", method="DetermineAction", cause="invalid_argument") == 1
    assert value(ours, "execgate_policy_failures_total", method="DetermineAction", cause="unavailable") == 1
    assert sum(v for (n, _), v in ours.items() if n == "execgate_policy_failures_total") == 2
    assert value(ours, "execgate_policy_call_seconds_count", method="DetermineAction") == 6

    # Traces: one decision span per DetermineAction, its decision id the audit log's, in the
    # client's trace (the context crossed gRPC), under the gRPC server span of the instrumentation.
    audited = [json.loads(line) for line in audit.read_text().splitlines()]
    spans = exporter.get_finished_spans()
    decided = [s for s in spans if s.name == DECISION_SPAN]
    assert len(decided) == 5
    ids = [s.attributes.get("execgate.decision_id") for s in decided]
    assert [i for i in ids if i] == [r["decision_id"] for r in audited]
    assert [s.attributes["execgate.outcome"] for s in decided] == ["run", "escalate", "deny", "deny", "error"]
    assert [s.attributes.get("execgate.rule_id") for s in decided[:4]] == [r["rule_id"] for r in audited]
    assert all(s.attributes.get("execgate.session_id") == SESSION.session_id for s in decided[:4])
    assert decided[4].attributes["execgate.error"] == "invalid_argument"
    for s in decided:
        assert not any("argv" in key or "env" in key for key in s.attributes)
    by_id = {s.context.span_id: s for s in spans}
    client_spans = [s for s in spans if s.name == CLIENT_SPAN]
    assert len(client_spans) == 6
    assert [s.attributes.get("execgate.decision_id") for s in client_spans[:4]] == [r["decision_id"] for r in audited]
    assert [s.attributes["execgate.outcome"] for s in client_spans[4:]] == ["error", "error"]
    for mine, theirs in zip(client_spans, decided):
        assert theirs.context.trace_id == mine.context.trace_id
        rpc_server = by_id[theirs.parent.span_id]
        assert rpc_server.name == "/execgate.v1.EscalationPolicy/DetermineAction"
        assert rpc_server.kind.name == "SERVER"


async def test_registries_are_per_instance(service, short_tmp: Path) -> None:
    first, second = PolicyMetrics(), PolicyMetrics()
    async with service(metrics=first, metrics_listen=LOOPBACK) as one, \
            service(metrics=second, metrics_listen=LOOPBACK, address=f"unix://{short_tmp / 'q.sock'}") as two:
        assert one.metrics_url != two.metrics_url
        a, b = GrpcPolicy(one.addresses[0]), GrpcPolicy(two.addresses[0])
        for _ in range(3):
            await ask(a, "/bin/echo")
        await ask(b, "/bin/rm")
        page_one, page_two = await scraped(one.metrics_url), await scraped(two.metrics_url)
        client_one = samples((await asyncio.to_thread(_exposition, a.metrics.registry)))
        await a.aclose()
        await b.aclose()
    assert value(page_one, "execgate_decisions_total", outcome="run", rule="echo-run") == 3
    assert value(page_one, "execgate_decisions_total", outcome="deny", rule="rm-deny") == 0
    assert value(page_two, "execgate_decisions_total", outcome="deny", rule="rm-deny") == 1
    assert value(page_two, "execgate_decisions_total", outcome="run", rule="echo-run") == 0
    assert value(client_one, "execgate_policy_decisions_total", outcome="run") == 3
    assert value(client_one, "execgate_policy_decisions_total", outcome="deny") == 0


def _exposition(registry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


@pytest.mark.parametrize("text, public, expected", [
    ("127.0.0.1:9464", False, ("127.0.0.1", 9464)),
    ("localhost:0", False, ("localhost", 0)),
    ("[::1]:9464", False, ("::1", 9464)),
    ("0.0.0.0:9464", True, ("0.0.0.0", 9464)),
])
def test_metrics_address(text: str, public: bool, expected) -> None:
    assert parse_metrics_address(text, public=public) == expected


@pytest.mark.parametrize("text", ["0.0.0.0:9464", "[::]:1", "10.1.2.3:9464", "example.org:80", "9464", "h:x"])
def test_metrics_address_refused(text: str) -> None:
    with pytest.raises(TelemetryError):
        parse_metrics_address(text)
