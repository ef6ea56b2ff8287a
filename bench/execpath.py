"""Figures 1, 2, 6 and 7: added cost per gated exec on the Run and Escalate paths, cold start, and
the seccomp backstop's share (issue #10).

Every figure is a difference of wall times of whole runs, so the fixed start-up cost cancels: a
script running ``/bin/true`` N times is timed at N and at 0 (a bash arithmetic loop, so that the
loop itself execs nothing), under plain bash and under ``execgate run --sandbox none -q`` (embedded
policy service, preload interception). Per exec = (median T(N) - median T(0)) / N; the runs of the
configurations are interleaved so that background load hits them alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from bench.common import ESCALATE_TRUE_RULES, Figure, check, cpu_run, execgate_cli, median, timed_run


def loop_script(n: int, program: str = "/bin/true") -> str:
    return f"i=0; while [ $i -lt {n} ]; do {program}; i=$((i+1)); done"


def _per_exec(runner: Callable[[int], float], n: int, reps: int, times: dict[str, list[float]], key: str) -> None:
    times.setdefault(f"{key}@0", []).append(runner(0))
    times.setdefault(f"{key}@{n}", []).append(runner(n))


Samples = dict[str, list[float]]


def _per_exec_ms(runners: dict[str, Callable[[int], float]], n: int, reps: int) -> tuple[dict[str, float], Samples]:
    """Interleave the runners ``reps`` times at 0 and N execs; ms per exec of each, and the samples."""
    times: dict[str, list[float]] = {}
    for _ in range(reps):
        for key, runner in runners.items():
            _per_exec(runner, n, reps, times, key)
    return {k: (median(times[f"{k}@{n}"]) - median(times[f"{k}@0"])) / n * 1000 for k in runners}, times


def _env() -> dict[str, str]:
    env = {**os.environ}
    env.pop("LD_PRELOAD", None)
    return env


def measure_gated(
    name: str, *, n: int, reps: int, cwd: str, wrapper: str, rules: str | None, target: str, what: str,
    options: tuple[str, ...] = (),
) -> Figure:
    """Added ms per exec of ``execgate run`` (``wrapper``, optional ``rules``, more ``options``) over
    plain bash."""
    env = _env()
    gate = [*execgate_cli(), "run", "--sandbox", "none", "-q", "--wrapper", wrapper, *options]
    if rules:
        gate += ["--rules", rules]
    runners = {
        "bash": lambda k: timed_run(["bash", "-c", loop_script(k)], cwd=cwd, env=env),
        "gated": lambda k: timed_run([*gate, "--", loop_script(k)], cwd=cwd, env=env),
    }
    per, times = _per_exec_ms(runners, n, reps)
    added = per["gated"] - per["bash"]
    return Figure(
        name=name, value=added, unit="ms/exec added", baseline=per["bash"], baseline_what="plain bash ms/exec",
        ratio=per["gated"] / per["bash"] if per["bash"] > 0 else None, target=target, met=check(added, target),
        notes=f"{what}; N={n}, {reps} reps, median; gated total {per['gated']:.3f} ms/exec",
        samples={k: [round(x, 4) for x in v] for k, v in times.items()},
    )


def run_path(n: int, reps: int, cwd: str, wrapper: str, target: str) -> Figure:
    return measure_gated(
        f"run_{wrapper}_ms_per_exec", n=n, reps=reps, cwd=cwd, wrapper=wrapper, rules=None, target=target,
        what=f"Run decision, {wrapper} wrapper, shipped rules",
    )


def escalate_path(n: int, reps: int, cwd: str, wrapper: str, target: str) -> Figure:
    rules = Path(cwd) / "escalate-true.toml"
    rules.write_text(ESCALATE_TRUE_RULES)
    return measure_gated(
        f"escalate_{wrapper}_ms_per_exec", n=n, reps=reps, cwd=cwd, wrapper=wrapper, rules=str(rules),
        target=target, what=f"Escalate (unsandboxed) decision, {wrapper} wrapper",
    )


def cold_start(reps: int, cwd: str, target: str) -> Figure:
    """Median wall time of ``execgate run --sandbox none -q -- true`` vs ``bash -c true``."""
    env = {**os.environ}
    env.pop("LD_PRELOAD", None)
    gate = [*execgate_cli(), "run", "--sandbox", "none", "-q", "--", "true"]
    times: dict[str, list[float]] = {"bash": [], "gated": []}
    for _ in range(reps):
        times["bash"].append(timed_run(["bash", "-c", "true"], cwd=cwd, env=env))
        times["gated"].append(timed_run(gate, cwd=cwd, env=env))
    bash_ms, gated_ms = median(times["bash"]) * 1000, median(times["gated"]) * 1000
    return Figure(
        name="cold_start_ms", value=gated_ms, unit="ms", baseline=bash_ms, baseline_what="bash -c true ms",
        ratio=gated_ms / bash_ms, target=target, met=check(gated_ms, target),
        notes=f"execgate run --sandbox none -- true; {reps} runs, median; min {min(times['gated'])*1000:.0f} ms",
        samples={k: [round(x, 4) for x in v] for k, v in times.items()},
    )


def backstop_share(n: int, reps: int, cwd: str) -> list[Figure]:
    """Figure 7: the seccomp backstop's cost on the ordinary (shim) Run path, and its own path.

    * ``run_native_backstop_share_ms``: ms per exec of ``execgate run`` (native wrapper) with the
      backstop on minus the same with ``--seccomp off``, interleaved in one measurement; each shim exec
      then passes two notifications (the exec of the wrapper, the wrapper's approved exec), both
      answered without a decision.
    * ``run_native_backstop_cpu_ms``: the same difference in CPU time (user + system of the whole
      run), which a loaded machine disturbs less than wall time.
    * ``backstop_decided_ms_per_exec``: an exec the shim cannot see (a static shell, busybox-static
      ``sh``, running ``/bin/true``), decided by the backstop alone: gated busybox loop minus plain
      busybox loop.
    """
    env = _env()
    gate = [*execgate_cli(), "run", "--sandbox", "none", "-q"]
    busy = f"busybox sh -c '{{}}'"
    runners = {
        "bash": lambda k: timed_run(["bash", "-c", loop_script(k)], cwd=cwd, env=env),
        "off": lambda k: timed_run([*gate, "--seccomp", "off", "--", loop_script(k)], cwd=cwd, env=env),
        "on": lambda k: timed_run([*gate, "--seccomp", "on", "--", loop_script(k)], cwd=cwd, env=env),
        "busybox": lambda k: timed_run(["busybox", "sh", "-c", loop_script(k)], cwd=cwd, env=env),
        "busybox_gated": lambda k: timed_run([*gate, "--seccomp", "on", "--", busy.format(loop_script(k))],
                                             cwd=cwd, env=env),
    }
    per, times = _per_exec_ms(runners, n, reps)
    cpu_runners = {
        "cpu_off": lambda k: cpu_run([*gate, "--seccomp", "off", "--", loop_script(k)], cwd=cwd, env=env),
        "cpu_on": lambda k: cpu_run([*gate, "--seccomp", "on", "--", loop_script(k)], cwd=cwd, env=env),
    }
    cpu, cpu_times = _per_exec_ms(cpu_runners, n, reps)
    times.update(cpu_times)
    samples = {k: [round(x, 4) for x in v] for k, v in times.items()}
    share = per["on"] - per["off"]
    decided = per["busybox_gated"] - per["busybox"]
    how = f"N={n}, {reps} reps, median"
    return [
        Figure(name="run_native_backstop_share_ms", value=share, unit="ms/exec added",
               baseline=per["off"] - per["bash"], baseline_what="Run path added ms/exec, --seccomp off",
               notes=f"backstop on {per['on']:.3f}, off {per['off']:.3f}, bash {per['bash']:.3f} ms/exec; {how}",
               samples=samples),
        Figure(name="run_native_backstop_cpu_ms", value=cpu["cpu_on"] - cpu["cpu_off"], unit="CPU ms/exec added",
               baseline=cpu["cpu_off"], baseline_what="CPU ms/exec of the whole run, --seccomp off",
               notes=f"user+system CPU of execgate run and everything it reaped, backstop on {cpu['cpu_on']:.3f} "
                     f"vs off {cpu['cpu_off']:.3f} ms/exec; {how}"),
        Figure(name="backstop_decided_ms_per_exec", value=decided, unit="ms/exec added", baseline=per["busybox"],
               baseline_what="plain busybox sh ms/exec",
               ratio=per["busybox_gated"] / per["busybox"] if per["busybox"] > 0 else None,
               notes=f"busybox-static sh loop, every exec decided by the backstop; {how}", samples=samples),
    ]
