"""Dogfood: a subset of execgate's own tests, run under ``execgate run --sandbox none``, passes,
every decision has its own id, and every decided program was really exec'd (strace)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from run_support import CLI, audit_records

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# Tests that start real programs (cc, nm, policy services) without a nested session of their own.
# Left out: every test that starts a nested execgate session (all of test_preload_properties.py,
# the gate fixture's tests). A session started inside a gated session is gated by the *outer* one
# (the shim forces the outer session's EXEC_WRAPPER and sockets onto the inner shell, so that an
# inner session with permissive rules cannot escape the outer gate: wrapper/native/README.md), so
# what those tests assert about their own policy, depth and socket cannot hold here. Deselected
# within the subset: what still starts a nested session, and the one that runs strace itself (a
# traced process cannot be traced again).
SUBSET = [
    "tests/wrapper/test_native_artifacts.py",
    "tests/policy_service/test_cli_serve.py",
    "tests/policy_service/test_rules_engine.py",
    "tests/server/test_fdpass_framing.py",
]
NESTED = "not depth_guard and not escalated_marker_runs_through and not decides_once and not under_strace"

def test_execgate_tests_pass_under_execgate(short_tmp: Path):
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    from execgate.wrapper.artifacts import native_wrapper_path

    log, trace = short_tmp / "audit.jsonl", short_tmp / "execve.trace"
    done = subprocess.run(
        [strace, "-f", "-qq", "-e", "trace=execve", "-e", "signal=none", "-o", str(trace),
         *CLI, "run", "-q", "--sandbox", "none", "--audit-log", str(log), "--",
         sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", f"'{NESTED}'", *SUBSET],
        cwd=ROOT, capture_output=True, text=True, timeout=110, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed, \d+ deselected in [\d.]+s", summary), summary

    records = audit_records(log)
    wrapper = re.escape(str(native_wrapper_path()))
    wrapper_execs = len(re.findall(rf'execve\("{wrapper}", .* = 0$', trace.read_text(), flags=re.M))
    # ~70 on this subset: execgate's own tests that exec hundreds of programs do it in nested
    # sessions, which the outer gate does not see (see the module docstring of preload.c).
    assert len(records) >= 60
    # The nested sessions of test_preload_properties exec the same wrapper for their own gates, so
    # the outer audit log can only be bounded by the trace: no decision without a wrapper exec,
    # and every program decided Run was really handed to execve.
    assert len(records) <= wrapper_execs
    # Compared by basename: a caller may exec a relative path that the server resolved.
    execd = {Path(p).name for p in re.findall(r'execve\("([^"]+)"', trace.read_text())}
    assert {Path(r["program"]).name for r in records} <= execd
    assert len({r["decision_id"] for r in records}) == len(records)
    assert {r["decision"] for r in records} == {"run"}
