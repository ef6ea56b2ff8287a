"""``python -m bench`` (or ``python bench/run.py``): run execgate's benchmarks and print the figures.

Each figure is printed as soon as it is measured, then all of them in one table with their
baselines (measured in the same run), ratios and targets. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python bench/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cache, execpath, latency, sessions  # noqa: E402
from bench.common import Figure, PolicyProcess, check, machine, vm_kib, workdir  # noqa: E402

#: Targets from issue 11 (value units as in each figure). The decision targets are meant to be
#: reached through cache hits and in-process decisions (the gRPC hop kept for misses), so the
#: cache-hit figures carry them as well as the gRPC-hop figures.
TARGETS = {
    "run_native_ms_per_exec": "<= 0.5",
    "escalate_native_ms_per_exec": "<= 2",
    "decision_p99_ms": "<= 1",
    "decision_cached_p99_ms": "<= 1",
    "throughput_decisions_per_s": ">= 10000",
    "throughput_cached_decisions_per_s": ">= 10000",
    "server_rss_100_sessions_mb": "<= 60",
    "cold_start_ms": "<= 150",
}
#: Intermediate milestones of issue 11, printed beside the target.
MILESTONES = {
    "run_native_ms_per_exec": "<= 1",
}

#: Every figure the harness prints, in order.
FIGURE_NAMES = (
    "cold_start_ms", "run_native_ms_per_exec", "run_python_ms_per_exec", "escalate_native_ms_per_exec",
    "decision_p50_ms", "decision_p99_ms", "decision_max_ms", "decision_rate_achieved",
    "decision_cached_p50_ms", "decision_cached_p99_ms", "decision_cached_max_ms", "decision_cached_rate_achieved",
    "throughput_decisions_per_s", "throughput_cached_decisions_per_s", "throughput_errors", "server_rss_100_sessions_mb", "policy_rss_after_load_mb",
    "run_native_backstop_share_ms", "run_native_backstop_cpu_ms", "backstop_decided_ms_per_exec",
    "run_native_cached_ms_per_exec", "run_native_uncached_ms_per_exec",
    "run_native_separate_cached_ms_per_exec", "run_native_separate_uncached_ms_per_exec",
    "escalate_native_separate_ms_per_exec",
    "build_default_ratio", "build_gated_ratio", "build_uncached_ratio", "build_execs", "build_cache_hit_rate",
)

MODES = {
    #          run N, reps, python N, reps, escalate N, reps, rate/s, seconds, sessions, execs, cold reps
    "smoke": dict(run_n=5, run_reps=1, py_n=5, py_reps=1, esc_n=5, esc_reps=1, rate=100.0, seconds=0.05,
                  sessions=32, execs=5, cold_reps=3, build_files=4, build_reps=1),
    "quick": dict(run_n=100, run_reps=3, py_n=20, py_reps=2, esc_n=50, esc_reps=3, rate=1000.0, seconds=2.0,
                  sessions=32, execs=50, cold_reps=10, build_files=40, build_reps=1),
    "full": dict(run_n=500, run_reps=5, py_n=100, py_reps=3, esc_n=200, esc_reps=5, rate=1000.0, seconds=10.0,
                 sessions=32, execs=200, cold_reps=20, build_files=40, build_reps=3),
}
IDLE_SESSIONS = 100


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmarks of execgate: per-exec cost (Run, Escalate), decision latency and "
                    "throughput with 32 sessions (gRPC hop per decision, and cache hits through the "
                    "escalation server), memory, cold start. Run from the repository root.",
        epilog="figures: " + ", ".join(FIGURE_NAMES),
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small counts, under a minute")
    mode.add_argument("--smoke", action="store_true", help="tiny counts (N=5): checks the harness, numbers meaningless")
    parser.add_argument("--json", metavar="FILE", help="also write machine facts, parameters and figures to FILE")
    return parser


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}g}" if abs(x) < 1 else f"{x:.{max(1, digits - 1)}f}"


def _status(fig: Figure) -> str:
    status = "-" if fig.met is None else ("met" if fig.met else "MISSED")
    milestone = MILESTONES.get(fig.name)
    if milestone and fig.met is not None:
        status += f" (milestone {milestone}: {'met' if check(fig.value, milestone) else 'MISSED'})"
    return status


def live(fig: Figure) -> None:
    print(f"  {fig.name:<30} {_fmt(fig.value):>9} {fig.unit:<16} baseline {_fmt(fig.baseline):>8} "
          f"ratio {_fmt(fig.ratio):>6}  target {fig.target or '-':<8} {_status(fig)}", flush=True)


def table(figs: list[Figure]) -> str:
    rows = [("figure", "value", "unit", "baseline", "ratio", "target", "status")]
    rows += [(f.name, _fmt(f.value), f.unit, _fmt(f.baseline), _fmt(f.ratio), f.target or "-", _status(f)) for f in figs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run(params: dict[str, float]) -> list[Figure]:
    figs: list[Figure] = []

    def add(new: Figure | list[Figure]) -> None:
        for fig in new if isinstance(new, list) else [new]:
            figs.append(fig)
            live(fig)

    with workdir() as cwd:
        add(execpath.cold_start(int(params["cold_reps"]), cwd, TARGETS["cold_start_ms"]))
        add(execpath.run_path(int(params["run_n"]), int(params["run_reps"]), cwd, "native", TARGETS["run_native_ms_per_exec"]))
        add(execpath.run_path(int(params["py_n"]), int(params["py_reps"]), cwd, "python", ""))
        add(execpath.escalate_path(int(params["esc_n"]), int(params["esc_reps"]), cwd, "native",
                                   TARGETS["escalate_native_ms_per_exec"]))
        service = PolicyProcess(cwd)
        try:
            ready_hwm = vm_kib(service.pid, "VmHWM")
            add(latency.decision_latency(service.address, params["rate"], params["seconds"], TARGETS["decision_p99_ms"]))
            add(sessions.wire_latency(service.address, params["rate"], params["seconds"], int(params["sessions"]),
                                      TARGETS["decision_cached_p99_ms"]))
            add(sessions.throughput(service.address, service.pid, int(params["sessions"]), int(params["execs"]),
                                    TARGETS["throughput_decisions_per_s"], TARGETS["throughput_cached_decisions_per_s"]))
            add(sessions.server_memory(service.address, IDLE_SESSIONS, TARGETS["server_rss_100_sessions_mb"]))
            add(sessions.policy_memory(service.pid, ready_hwm))
        finally:
            service.stop()
        add(execpath.backstop_share(int(params["run_n"]), int(params["run_reps"]), cwd))
        add(cache.run_path_cache(int(params["run_n"]), int(params["run_reps"]), cwd))
        add(cache.separate_service(int(params["run_n"]), int(params["run_reps"]), cwd))
        add(cache.build(cwd, int(params["build_files"]), int(params["build_reps"])))
    return figs


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    params = MODES[mode]
    facts = machine()
    print(f"execgate benchmarks, {mode} mode", flush=True)
    print("machine: " + ", ".join(f"{k}={v}" for k, v in facts.items()), flush=True)
    start = time.perf_counter()
    figs = run(params)
    elapsed = time.perf_counter() - start
    print(f"\n{table(figs)}\n\n{mode} mode finished in {elapsed:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"mode": mode, "params": params, "machine": facts, "elapsed_s": elapsed,
             "figures": [f.to_dict() for f in figs]}, indent=2) + "\n")
        print(f"wrote {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
