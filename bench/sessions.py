"""Figures 3b, 4 and 5: decision latency and throughput of one escalation server with many
sessions through the full system, and memory.

Three processes, as deployed: the escalation server (:mod:`bench.server_worker`, one
:class:`EscalateServer` with its :class:`GrpcPolicy`), the policy service (``execgate policy
serve``, shipped rules, its default cache TTL), and the clients (:mod:`bench.client_driver`,
which speaks the wire protocol directly so that the figure measures the server and the policy
service, not bash and the wrapper). All share the machine's cores, so the clients' CPU is part
of the load.

Two decision paths are measured apart (docs/DESIGN.md §9): **gRPC hop** — the server's
``GrpcPolicy`` without its decision cache, one ``DetermineAction`` per exec; **cache hit** — the
cache on, as deployed: the service marks the Run of ``/bin/true`` cacheable (no shipped rule names
it), so every exec after a session's first is answered in the server's process, no gRPC call (each
hit still audited, in batches). The notes say how many execs were hits.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.common import REPO, Figure, check, cpu_seconds, percentile, vm_kib


def _worker(*args: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "bench.server_worker", *args], cwd=str(REPO),
                          capture_output=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"server_worker {args[0]} exited {proc.returncode}: {proc.stderr.decode()[-800:]}")
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


def _hits(run: dict[str, object]) -> str:
    stats = run["policy_stats"]
    return f"{stats.get('cache_hit', 0)} of {run['decisions']} execs answered from the cache"  # policy_stats: GrpcPolicy.stats


def throughput(address: str, policy_pid: int, sessions: int, execs: int, target: str,
               cached_target: str = "") -> list[Figure]:
    """Figure 4 on both paths: ``throughput_decisions_per_s`` (gRPC hop: cache off) and
    ``throughput_cached_decisions_per_s`` (cache hits), with the same in-process baseline."""
    base = _worker("throughput", "--policy", "inproc", "--sessions", str(sessions), "--execs", str(execs))
    base_rate = base["decisions"] / base["wall_s"]
    runs = {}
    for cache in ("off", "on"):
        cpu0 = cpu_seconds(policy_pid)
        run = _worker("throughput", "--policy", address, "--sessions", str(sessions), "--execs", str(execs),
                      "--cache", cache)
        run["policy_cpu_s"] = cpu_seconds(policy_pid) - cpu0
        runs[cache] = run

    def note(run: dict[str, object], path: str) -> str:
        return (f"path: {path}; {sessions} sessions x {execs} execs, protocol clients in a separate process; "
                f"{_hits(run)}; per-exec p50 {run['p50_ms']:.2f} ms p99 {run['p99_ms']:.2f} ms; CPU s: server "
                f"{run['server_cpu_s']:.2f}, policy {run['policy_cpu_s']:.2f}, clients {run['driver_cpu_s']:.2f}, "
                f"wall {run['wall_s']:.2f}")

    grpc_run, cached_run = runs["off"], runs["on"]
    rate = grpc_run["decisions"] / grpc_run["wall_s"]
    cached_rate = cached_run["decisions"] / cached_run["wall_s"]
    errors = sum(int(r["errors"]) + int(r["policy_stats"].get("error", 0)) for r in runs.values())
    baseline_what = "same load, in-process always-Run policy (no gRPC, no cache) /s"
    return [
        Figure(name="throughput_decisions_per_s", value=rate, unit="decisions/s", baseline=base_rate,
               baseline_what=baseline_what, ratio=rate / base_rate, target=target, met=check(rate, target),
               notes=note(grpc_run, "gRPC hop per decision (GrpcPolicy cache off)"),
               samples={"grpc": grpc_run, "inproc": base}),
        Figure(name="throughput_cached_decisions_per_s", value=cached_rate, unit="decisions/s", baseline=base_rate,
               baseline_what=baseline_what, ratio=cached_rate / base_rate, target=cached_target,
               met=check(cached_rate, cached_target),
               notes=note(cached_run, "cache hits in the escalation server (GrpcPolicy cache on, as deployed)"),
               samples={"cached": cached_run}),
        Figure(name="throughput_errors", value=errors, unit="errors", baseline=int(base["errors"]),
               baseline_what="errors with the in-process policy", target="== 0", met=errors == 0,
               notes="; ".join(f"cache {c}: client errors {r['errors']} {r['error_samples']}, policy errors "
                               f"{r['policy_stats'].get('error', 0)}" for c, r in runs.items())),
    ]


def wire_latency(address: str, rate: float, seconds: float, sessions: int, p99_target: str) -> list[Figure]:
    """Figure 3b: decision latency through the escalation server's wire protocol at ``rate``
    execs/s offered (open loop over ``sessions`` sessions), the cache-hit path; baseline: the same
    load against the same server with an in-process always-Run policy."""
    count = max(5, int(rate * seconds))
    args = ("--sessions", str(sessions), "--rate", f"{rate:g}", "--count", str(count),
            "--warm", str(max(2 * sessions, count // 10)))
    base = _worker("latency", "--policy", "inproc", *args)
    run = _worker("latency", "--policy", address, "--cache", "on", *args)
    lat, base_lat = run["latencies_s"], base["latencies_s"]
    ms = lambda seq, q: percentile(seq, q) * 1000  # noqa: E731
    common = (f"path: cache hits, through the escalation server's wire protocol (handshake, request frame with "
              f"the client's environment, {run['request_bytes']} bytes, answer); offered {rate:g}/s open loop "
              f"over {sessions} sessions, {count} execs measured; {_hits(run)} (warm-up included); "
              f"client errors {run['errors']} {run['error_samples']}, policy errors "
              f"{run['policy_stats'].get('error', 0)}")
    figs = []
    for q, name, target in ((50, "decision_cached_p50_ms", ""), (99, "decision_cached_p99_ms", p99_target),
                            (100, "decision_cached_max_ms", "")):
        value, b = ms(lat, q), ms(base_lat, q)
        figs.append(Figure(name=name, value=value, unit="ms", baseline=b,
                           baseline_what=f"p{q} ms, same load, in-process always-Run policy",
                           ratio=value / b if b else None, target=target, met=check(value, target), notes=common))
    figs.append(Figure(name="decision_cached_rate_achieved", value=run["rate"], unit="decisions/s",
                       baseline=base["rate"], baseline_what="achieved /s with the in-process policy",
                       ratio=run["rate"] / rate, notes="ratio here = achieved / offered; " + common,
                       samples={k: v for k, v in run.items() if k != "latencies_s"}))
    return figs


def server_memory(address: str, sessions: int, target_mb: str) -> Figure:
    r = _worker("idle", "--policy", address, "--sessions", str(sessions))
    after, before = r["after_hwm_kib"] / 1024, r["before_hwm_kib"] / 1024
    return Figure(
        name=f"server_rss_{sessions}_sessions_mb", value=after, unit="MiB (VmHWM)", baseline=before,
        baseline_what="VmHWM of the same process before the sessions (imports + gRPC channel up)",
        ratio=after / before, target=target_mb, met=check(after, target_mb),
        notes=f"{sessions} idle sessions; {(after - before) * 1024 / sessions:.1f} KiB per session; warm-up decision {r['warm_action']}",
        samples=r,
    )


def policy_memory(pid: int, baseline_kib: int) -> Figure:
    after = vm_kib(pid, "VmHWM") / 1024
    before = baseline_kib / 1024
    return Figure(
        name="policy_rss_after_load_mb", value=after, unit="MiB (VmHWM)", baseline=before,
        baseline_what="VmHWM of the policy service right after it became ready", ratio=after / before,
        notes="after the latency and throughput loads", samples={"pid": pid},
    )
