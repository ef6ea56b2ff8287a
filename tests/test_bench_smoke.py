"""The benchmark harness runs end to end on tiny counts (``--smoke``). No timing is asserted:
benchmarks report numbers, they do not pass or fail on them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: Every figure the harness publishes (bench/run.py FIGURE_NAMES), in order.
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


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_smoke_prints_every_figure_and_exits_0(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--json", str(out_json)],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = proc.stdout.split("\n\n")[-2]  # the final table, after the live lines
    for name in FIGURE_NAMES:
        assert name in table, f"{name} missing from the final table:\n{proc.stdout}"
    saved = json.loads(out_json.read_text())
    assert [f["name"] for f in saved["figures"]] == list(FIGURE_NAMES)
    assert {"nproc", "cpu_model", "kernel", "python", "date_utc"} <= saved["machine"].keys()
    errors = next(f for f in saved["figures"] if f["name"] == "throughput_errors")
    assert errors["value"] == 0, errors["notes"]
