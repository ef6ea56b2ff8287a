"""Figures 4 and 5: throughput of one escalation server with many sessions, and memory.

Three processes, as deployed: the escalation server (:mod:`bench.server_worker`, one
:class:`EscalateServer` with its :class:`GrpcPolicy`), the policy service (``execgate policy
serve``), and the clients (:mod:`bench.client_driver`, which speaks the wire protocol directly so
that the figure measures the server and the policy service, not bash and the wrapper). All share
the machine's cores, so the clients' CPU is part of the load.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.common import REPO, Figure, check, cpu_seconds, vm_kib


def _worker(*args: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "bench.server_worker", *args], cwd=str(REPO),
                          capture_output=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"server_worker {args[0]} exited {proc.returncode}: {proc.stderr.decode()[-800:]}")
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


def throughput(address: str, policy_pid: int, sessions: int, execs: int, target: str) -> list[Figure]:
    base = _worker("throughput", "--policy", "inproc", "--sessions", str(sessions), "--execs", str(execs))
    cpu0 = cpu_seconds(policy_pid)
    run = _worker("throughput", "--policy", address, "--sessions", str(sessions), "--execs", str(execs))
    run["policy_cpu_s"] = cpu_seconds(policy_pid) - cpu0
    rate = run["decisions"] / run["wall_s"]
    base_rate = base["decisions"] / base["wall_s"]
    errors = int(run["errors"]) + int(run["policy_stats"].get("error", 0))
    note = (f"{sessions} sessions x {execs} execs, protocol clients in a separate process; "
            f"per-exec p50 {run['p50_ms']:.2f} ms p99 {run['p99_ms']:.2f} ms; CPU s: server {run['server_cpu_s']:.2f}, "
            f"policy {run['policy_cpu_s']:.2f}, clients {run['driver_cpu_s']:.2f}, wall {run['wall_s']:.2f}")
    return [
        Figure(name="throughput_decisions_per_s", value=rate, unit="decisions/s", baseline=base_rate,
               baseline_what="same load, in-process always-Run policy (no gRPC) /s", ratio=rate / base_rate,
               target=target, met=check(rate, target), notes=note, samples={"grpc": run, "inproc": base}),
        Figure(name="throughput_errors", value=errors, unit="errors", baseline=int(base["errors"]),
               baseline_what="errors with the in-process policy", target="== 0", met=errors == 0,
               notes=f"client errors {run['errors']} {run['error_samples']}, policy errors {run['policy_stats'].get('error', 0)}"),
    ]


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
