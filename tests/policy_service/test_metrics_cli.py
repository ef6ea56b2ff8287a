"""``execgate policy serve --metrics/--otlp-endpoint`` as a real process: ``/metrics`` scraped over
HTTP, spans exported over OTLP to a real receiver (flushed on SIGTERM), non-loopback refused."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from execgate.server.grpc_policy import GrpcPolicy
from execgate.server.policy import SessionContext

from identity_support import system_facts
from otlp_support import otlp_receiver
from policy_fixtures import rules_file, release_grpc_objects  # noqa: F401 - fixtures
from test_metrics import scraped, value

pytestmark = pytest.mark.anyio

CLI = (sys.executable, "-m", "execgate.server.cli")
SESSION = SessionContext("s-cli", {})


async def metrics_url(proc: asyncio.subprocess.Process) -> str:
    """Read ``policy serve``'s log until it names its metrics URL."""
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert line, "policy serve exited before serving metrics"
        if "metrics on " in line:
            return line.rsplit("metrics on ", 1)[1].strip()


async def test_serve_metrics_and_otlp(short_tmp: Path, rules_file: Path) -> None:
    address, audit = f"unix://{short_tmp / 'm.sock'}", short_tmp / "audit.jsonl"
    with otlp_receiver() as (receiver, endpoint):
        proc = await asyncio.create_subprocess_exec(
            *CLI, "policy", "serve", "--listen", address, "--rules", str(rules_file), "--audit-log", str(audit),
            "--metrics", "127.0.0.1:0", "--otlp-endpoint", endpoint,
            "--cache-ttl", "0",  # every exec a DetermineAction: this test counts the service's spans
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            url = await metrics_url(proc)
            policy = GrpcPolicy(address)
            for program in ("/bin/echo", "/bin/echo", "/bin/rm"):
                await policy.determine_action(program, [program.rsplit("/", 1)[-1]], "/tmp", SESSION,
                                              facts=system_facts(program))  # as a server sends for a system file
            await policy.aclose()
            page = await scraped(url)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        spans = receiver.named("execgate.policy.decide")
    assert value(page, "execgate_decisions_total", outcome="run", rule="echo-run") == 2
    assert value(page, "execgate_decisions_total", outcome="deny", rule="rm-deny") == 1
    ids = [json.loads(line)["decision_id"] for line in audit.read_text().splitlines()]
    assert sorted(s["execgate.decision_id"] for s in spans) == sorted(ids)
    assert {s["execgate.session_id"] for s in spans} == {"s-cli"}


@pytest.mark.parametrize("extra, code", [((), 2), (("--metrics-public",), None)])
async def test_serve_metrics_beyond_loopback(short_tmp: Path, rules_file: Path, extra, code) -> None:
    proc = await asyncio.create_subprocess_exec(
        *CLI, "policy", "serve", "--listen", f"unix://{short_tmp / 'w.sock'}", "--rules", str(rules_file),
        "--metrics", "0.0.0.0:0", *extra, stderr=asyncio.subprocess.PIPE,
    )
    try:
        if code is not None:
            err = (await asyncio.wait_for(proc.communicate(), 30))[1].decode()
            assert proc.returncode == code
            assert "--metrics 0.0.0.0:0: not a loopback address" in err
            return
        url = await metrics_url(proc)
        port = url.rsplit(":", 1)[1].split("/")[0]
        page = await scraped(f"http://127.0.0.1:{port}/metrics")
        assert value(page, "execgate_pending_approvals") == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
