"""Shared pieces of the harness: figures, statistics, machine facts, the policy-service process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
#: Rules that escalate ``true`` (unsandboxed); everything else runs (the default).
ESCALATE_TRUE_RULES = """\
default = "run"

[[rule]]
id = "bench-escalate-true"
program = "true"
decision = "escalate"
execution = "unsandboxed"
match = ["true"]
"""


@dataclass
class Figure:
    """One published number.

    ``ratio`` is value / baseline (both measured in the same run); ``target`` is a text such as
    "<= 1" in ``unit``; ``met`` is None when there is no target.
    """

    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_what: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    notes: str = ""
    samples: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check(value: float, target: str) -> bool | None:
    """``value`` against ``"<= X"``, ``">= X"`` or ``"== X"``; None for no target."""
    if not target:
        return None
    op, num = target.split()
    bound = float(num)
    return {"<=": value <= bound, ">=": value >= bound, "==": value == bound}[op]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values)


def execgate_cli() -> list[str]:
    """argv prefix running this interpreter's ``execgate`` console script."""
    beside = Path(sys.executable).parent / "execgate"
    found = str(beside) if beside.exists() else shutil.which("execgate")
    if not found:
        raise SystemExit("bench: `execgate` is not installed next to this interpreter")
    return [found]


def timed_run(argv: list[str], *, cwd: str, env: dict[str, str] | None = None) -> float:
    """Wall seconds of one run of ``argv`` (stdout/stderr discarded). Raises on a non-zero status."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]}… exited {proc.returncode}: {proc.stderr.decode()[-400:]}")
    return elapsed


def cpu_run(argv: list[str], *, cwd: str, env: dict[str, str] | None = None) -> float:
    """CPU seconds (user + system) of one run of ``argv`` and of every descendant it reaped
    (getrusage(2) through wait4). Less sensitive to a loaded machine than wall time. Raises on a
    non-zero status."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]}… exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def vm_kib(pid: int | str, key: str) -> int:
    """A ``/proc/PID/status`` field in KiB (``VmHWM`` = peak RSS, ``VmRSS``), see proc(5)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat`` fields 14, 15, proc(5))."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, str]:
    """nproc, CPU model, kernel, Python version, date (UTC), load average at start."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": str(os.cpu_count()),
        "affinity_cpus": str(len(os.sched_getaffinity(0))),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "loadavg_at_start": " ".join(os.getloadavg().__repr__().strip("()").split(", ")),
    }


@contextlib.contextmanager
def workdir() -> Iterator[str]:
    """A short-lived temp directory (short path: AF_UNIX paths are limited to 108 bytes)."""
    path = tempfile.mkdtemp(prefix="egb-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class PolicyProcess:
    """``execgate policy serve`` in its own process on a Unix socket under ``directory``."""

    def __init__(self, directory: str, rules: str | None = None, extra: tuple[str, ...] = ()) -> None:
        self.address = f"unix://{directory}/policy.sock"
        argv = [*execgate_cli(), "policy", "serve", "--listen", self.address, "--grace", "0.5", *extra]
        if rules:
            argv += ["--rules", rules]
        # Its log (one INFO line per decision) goes to a file: an unread pipe would fill and stall it.
        self.log_path = Path(directory) / "policy.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        self._wait_ready(Path(directory) / "policy.sock")

    def _wait_ready(self, sock: Path, timeout_s: float = 20.0) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout_s
        while not sock.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"policy service did not start: {self.log_path.read_text()[-400:]}")
            time.sleep(0.02)
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s, wait_for_ready=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def open_loop(call: Callable[[int], Awaitable[str | None]], rate: float,
                    count: int) -> tuple[list[float], list[str], float]:
    """Start ``call(i)`` at ``t0 + i / rate`` for i < ``count``, whether or not earlier calls have
    finished (open loop: a stall shows up as latency, no coordinated omission). ``call`` returns
    None on success or an error text; an exception it raises counts as an error (its repr).

    Returns:
        ``(latencies, errors, achieved)``: latencies in s from each scheduled start (sorted, the
        successful calls only), the error texts, and the achieved completion rate (/s).
    """
    clock = time.perf_counter  # uvloop's loop.time() has only millisecond resolution
    latencies: list[float] = []
    errors: list[str] = []
    last_done = 0.0

    async def one(i: int, scheduled: float) -> None:
        nonlocal last_done
        try:
            error = await call(i)
        except Exception as exc:  # counted, reported
            errors.append(repr(exc))
            return
        done = clock()
        latencies.append(done - scheduled)
        last_done = max(last_done, done)
        if error is not None:
            errors.append(error)

    tasks = []
    t0 = clock() + 0.01
    for i in range(count):
        scheduled = t0 + i / rate
        delay = scheduled - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i, scheduled)))
    await asyncio.gather(*tasks)
    latencies.sort()
    return latencies, errors, count / (last_done - t0) if last_done > t0 else 0.0
