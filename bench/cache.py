"""Figures 8 and 9: the decision cache (issue 11, docs/DESIGN.md §9).

8. The Run path with the cache (every exec after the first a hit, ``--cache-ttl 60``) and
   without (``--cache-ttl 0``: every exec a DetermineAction call), both through the gRPC client
   (``--cache-ttl`` puts the embedded service behind it; without the option ``execgate run``
   decides in process, figure 1), each as
   ms added per exec over plain bash, measured as figure 1 (a loop of ``/bin/true`` at N and at 0
   execs, medians of interleaved repeats, ``--sandbox none``, native wrapper, shipped rules).
10. Figures 8 and 2 against a separate ``execgate policy serve`` process on a Unix socket
   (``execgate run --policy unix://…``): the Run path with the service's cache on (its default
   ``--cache-ttl 60``) and off (``--cache-ttl 0``), and the Escalate path (unsandboxed).
9. A real build: ``make -j2`` of a C project written here (``files`` .c files, one header, a
   link), from clean, plain and under ``execgate run --sandbox none -q``: its default (the
   in-process service answering the shim's query), and the gRPC service with and without the
   cache; the gated/plain ratio, the count of execs from the audit log (one line per exec,
   cached ones included) and the hit rate (lines marked ``cached`` / all lines).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from bench.common import Figure, PolicyProcess, execgate_cli, median, timed_run
from bench.execpath import ESCALATE_TRUE_RULES, _env, _per_exec_ms, loop_script


def run_path_cache(n: int, reps: int, cwd: str) -> list[Figure]:
    """Figure 8: ms added per exec on the Run path, cache hit vs no cache (same run, interleaved)."""
    env = _env()
    gate = [*execgate_cli(), "run", "--sandbox", "none", "-q", "--wrapper", "native"]
    runners = {
        "bash": lambda k: timed_run(["bash", "-c", loop_script(k)], cwd=cwd, env=env),
        "cached": lambda k: timed_run([*gate, "--cache-ttl", "60", "--", loop_script(k)], cwd=cwd, env=env),
        "uncached": lambda k: timed_run([*gate, "--cache-ttl", "0", "--", loop_script(k)], cwd=cwd, env=env),
    }
    per, times = _per_exec_ms(runners, n, reps)
    samples = {k: [round(x, 4) for x in v] for k, v in times.items()}
    figs = []
    for key, what in (("cached", "cache hit (all but the first exec)"), ("uncached", "no cache (--cache-ttl 0)")):
        added = per[key] - per["bash"]
        figs.append(Figure(
            name=f"run_native_{key}_ms_per_exec", value=added, unit="ms/exec added", baseline=per["bash"],
            baseline_what="plain bash ms/exec", ratio=per[key] / per["bash"] if per["bash"] > 0 else None,
            notes=f"Run path, {what}; N={n}, {reps} reps, median; gated total {per[key]:.3f} ms/exec",
            samples=samples,
        ))
    return figs


def separate_service(n: int, reps: int, cwd: str) -> list[Figure]:
    """Figure 10: ms added per exec with a separate ``policy serve`` (Run: cache hit, no cache;
    Escalate), interleaved with plain bash in one measurement."""
    env = _env()
    rules = Path(cwd) / "escalate-true.toml"
    rules.write_text(ESCALATE_TRUE_RULES)
    services: dict[str, PolicyProcess] = {}
    try:
        for name, r, x in (("cached", None, ()), ("uncached", None, ("--cache-ttl", "0")),
                           ("escalate", str(rules), ())):
            (Path(cwd) / name).mkdir()
            services[name] = PolicyProcess(str(Path(cwd) / name), rules=r, extra=x)

        def gated(name: str):
            argv = [*execgate_cli(), "run", "--sandbox", "none", "-q", "--wrapper", "native",
                    "--policy", services[name].address, "--"]
            return lambda k: timed_run([*argv, loop_script(k)], cwd=cwd, env=env)
        runners = {"bash": lambda k: timed_run(["bash", "-c", loop_script(k)], cwd=cwd, env=env),
                   **{name: gated(name) for name in services}}
        per, times = _per_exec_ms(runners, n, reps)
    finally:
        for service in services.values():
            service.stop()
    samples = {k: [round(x, 4) for x in v] for k, v in times.items()}
    figs = []
    for key, name, what in (
            ("cached", "run_native_separate_cached_ms_per_exec", "Run path, separate policy serve, cache hit"),
            ("uncached", "run_native_separate_uncached_ms_per_exec",
             "Run path, separate policy serve --cache-ttl 0 (a DetermineAction per exec)"),
            ("escalate", "escalate_native_separate_ms_per_exec", "Escalate (unsandboxed), separate policy serve")):
        figs.append(Figure(
            name=name, value=per[key] - per["bash"], unit="ms/exec added", baseline=per["bash"],
            baseline_what="plain bash ms/exec", ratio=per[key] / per["bash"] if per["bash"] > 0 else None,
            notes=f"{what}; N={n}, {reps} reps, median; gated total {per[key]:.3f} ms/exec", samples=samples,
        ))
    return figs


def write_project(root: Path, files: int) -> None:
    """A C project: ``files`` translation units, a header, a Makefile building ``prog``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "common.h").write_text("int f0(int);\n" + "".join(f"int f{i}(int);\n" for i in range(1, files)))
    for i in range(files):
        body = f"int f{i}(int x) {{ return x * {i + 1} + {i}; }}\n"
        if i == 0:
            body = ('#include "common.h"\nint f0(int x) { return x + 1; }\nint main(void) { int s = 0;\n'
                    + "".join(f"  s += f{j}({j});\n" for j in range(1, files)) + "  return s == -1; }\n")
        (root / f"u{i}.c").write_text(f'#include "common.h"\n{body}')
    objs = " ".join(f"u{i}.o" for i in range(files))
    (root / "Makefile").write_text(
        f"CC ?= cc\nCFLAGS ?= -O1\nOBJS = {objs}\n\nprog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\n"
        "%.o: %.c common.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\nclean:\n\trm -f prog $(OBJS)\n\n.PHONY: clean\n")


def build(cwd: str, files: int, reps: int) -> list[Figure]:
    """Figure 9: ``make -j2`` plain vs gated (cache on, cache off); execs and hit rate from the audit log."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        return [Figure(name=n, value=float("nan"), unit="", notes="make or cc missing")
                for n in ("build_gated_ratio", "build_uncached_ratio", "build_execs", "build_cache_hit_rate")]
    env = _env()
    project = Path(cwd) / "cproject"
    write_project(project, files)
    gate = [*execgate_cli(), "run", "--sandbox", "none", "-q", "--wrapper", "native"]
    times: dict[str, list[float]] = {"plain": [], "default": [], "cached": [], "uncached": []}
    counts: list[tuple[int, int]] = []
    for rep in range(reps):
        for key in times:
            timed_run(["make", "-s", "clean"], cwd=str(project), env=env)
            if key == "plain":
                times[key].append(timed_run(["make", "-s", "-j2"], cwd=str(project), env=env))
                continue
            audit = Path(cwd) / f"build-{key}-{rep}.jsonl"
            mode = [] if key == "default" else ["--cache-ttl", "60" if key == "cached" else "0"]
            times[key].append(timed_run([*gate, *mode, "--audit-log", str(audit), "--",
                                         "make -s -j2"], cwd=str(project), env=env))
            lines = [json.loads(line) for line in audit.read_text().splitlines()]
            if key == "cached":
                counts.append((len(lines), sum(1 for line in lines if line.get("cached"))))
            os.unlink(audit)
    plain = median(times["plain"])
    execs = median([float(c[0]) for c in counts])
    hit_rate = median([c[1] / c[0] if c[0] else 0.0 for c in counts])
    samples = {k: [round(x, 4) for x in v] for k, v in times.items()} | {"execs_hits": counts}
    note = f"make -j2 of {files} .c files + link, from clean; {reps} reps, median"
    return [
        Figure(name="build_default_ratio", value=median(times["default"]) / plain, unit="x plain",
               baseline=plain * 1000, baseline_what="plain make ms",
               notes=f"{note}; gated, execgate run's default (in-process service, the shim's query): "
                     f"{median(times['default']) * 1000:.0f} ms"),
        Figure(name="build_gated_ratio", value=median(times["cached"]) / plain, unit="x plain", baseline=plain * 1000,
               baseline_what="plain make ms", notes=f"{note}; gated with the cache: {median(times['cached']) * 1000:.0f} ms",
               samples=samples),
        Figure(name="build_uncached_ratio", value=median(times["uncached"]) / plain, unit="x plain",
               baseline=plain * 1000, baseline_what="plain make ms",
               notes=f"{note}; gated, --cache-ttl 0: {median(times['uncached']) * 1000:.0f} ms"),
        Figure(name="build_execs", value=execs, unit="execs (audit lines)", notes=f"{note}; every gated exec, "
               "cached ones included"),
        Figure(name="build_cache_hit_rate", value=hit_rate, unit="hits / execs",
               notes=f"{note}; lines marked cached / all lines"),
    ]
