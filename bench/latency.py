"""Figure 3: decision latency through gRPC at a fixed offered rate, open loop — the "gRPC hop"
path: every decision is a ``DetermineAction`` call (the client's decision cache is off; figure 3b,
:func:`bench.sessions.wire_latency`, measures the cache-hit path through the escalation server).

The client is the escalation server's own :class:`GrpcPolicy` in this process (uvloop); the policy
service is a separate ``execgate policy serve`` process on a Unix socket. Request *i* is started at
``t0 + i / rate`` whether or not earlier ones have finished, and its latency is measured from that
scheduled time (so a stalled client or service shows up as latency: no coordinated omission).
Baseline: a ``grpc.health.v1.Health/Check`` call on its own channel to the same service, at the
same rate (the floor of a unary gRPC round trip through grpc.aio on this machine).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from bench.common import Figure, check, open_loop, percentile


async def _open_loop(call: Callable[[], Awaitable[bool]], rate: float, count: int) -> tuple[list[float], int, float]:
    """Latencies (s, sorted), failures, and achieved completion rate (/s) (:func:`bench.common.open_loop`)."""
    async def one(_i: int) -> str | None:
        return None if await call() else "failed"

    latencies, errors, achieved = await open_loop(one, rate, count)
    return latencies, len(errors), achieved


async def _measure(address: str, rate: float, count: int) -> dict[str, object]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from execgate.server.grpc_policy import GrpcPolicy
    from execgate.server.policy import SessionContext

    policy = GrpcPolicy(address, cache=False)  # the gRPC hop, every time (the service marks this Run cacheable)
    session = SessionContext(session_id="bench-latency", labels={"bench": "latency"})

    async def decide() -> bool:
        decision = await policy.determine_action("/bin/true", ["true"], "/tmp", session)
        return decision.action == "run" and not decision.error

    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def health() -> bool:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            return reply.status == health_pb2.HealthCheckResponse.SERVING

        warm = max(50, count // 10)
        try:
            await _open_loop(decide, rate, warm)  # channel up, caches warm
            await _open_loop(health, rate, warm)
            base, base_fail, base_rate = await _open_loop(health, rate, count)
            lat, fail, achieved = await _open_loop(decide, rate, count)
        finally:
            await policy.aclose()
    return {"lat": lat, "fail": fail, "rate": achieved, "base": base, "base_fail": base_fail, "base_rate": base_rate}


def decision_latency(address: str, rate: float, seconds: float, p99_target: str) -> list[Figure]:
    import uvloop

    count = max(5, int(rate * seconds))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        r = runner.run(_measure(address, rate, count))
    lat, base = r["lat"], r["base"]
    ms = lambda seq, q: percentile(seq, q) * 1000  # noqa: E731
    common = (f"path: gRPC hop per decision (GrpcPolicy.determine_action, cache off); offered {rate:g}/s open loop, "
              f"{count} decisions (Run), Unix socket, separate policy process")
    figs = []
    for q, name, target in ((50, "decision_p50_ms", ""), (99, "decision_p99_ms", p99_target), (100, "decision_max_ms", "")):
        value, b = ms(lat, q), ms(base, q)
        figs.append(Figure(name=name, value=value, unit="ms", baseline=b, baseline_what=f"health Check p{q} ms",
                           ratio=value / b if b else None, target=target, met=check(value, target), notes=common))
    figs.append(Figure(name="decision_rate_achieved", value=r["rate"], unit="decisions/s", baseline=r["base_rate"],
                       baseline_what="health Check achieved /s", ratio=r["rate"] / rate,
                       notes=f"ratio here = achieved / offered; failures {r['fail']} (health {r['base_fail']})",
                       samples={"failures": r["fail"]}))
    return figs
