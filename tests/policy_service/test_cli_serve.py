"""``execgate policy serve`` / ``policy health`` as real processes, and ``serve_embedded``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import stat
import sys
import time
from pathlib import Path
from typing import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from execgate.policy_service.server import serve_embedded
from execgate.policy_service.transport import is_local_address
from execgate.server.grpc_policy import GrpcPolicy
from execgate.server.policy import SessionContext
from identity_support import system_facts

from policy_fixtures import rules_file, release_grpc_objects, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.anyio

SESSION = SessionContext("s-1", {"agent": "cli"})
CLI = (sys.executable, "-m", "execgate.server.cli")


@contextlib.asynccontextmanager
async def serve_process(short_tmp: Path, rules_file: Path, *extra: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    address = f"unix://{short_tmp / 'cli.sock'}"
    proc = await asyncio.create_subprocess_exec(
        *CLI, "policy", "serve", "--listen", address, "--rules", str(rules_file), *extra,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        while b"listening on" not in line:
            assert line, "policy serve exited before listening"
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
        yield proc, address
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_sigterm_reports_not_serving_then_exits(short_tmp: Path, rules_file: Path) -> None:
    async with serve_process(short_tmp, rules_file, "--grace", "1") as (proc, address):
        health = await asyncio.create_subprocess_exec(
            *CLI, "policy", "health", "--policy", address, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await health.communicate()
        assert health.returncode == 0 and out.strip() == b"SERVING"
        assert stat.S_IMODE(os.stat(address[len("unix://"):]).st_mode) == 0o600
        async with grpc.aio.insecure_channel(address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            proc.send_signal(signal.SIGTERM)
            assert (await asyncio.wait_for(watch.read(), 10)).status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
        assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_policy_process_killed_mid_session(short_tmp: Path, rules_file: Path) -> None:
    async with serve_process(short_tmp, rules_file) as (proc, address):
        # A generous deadline: a freshly started service on a loaded machine may answer slowly.
        policy = GrpcPolicy(address, timeout_s=5)
        before = await policy.determine_action("/usr/bin/echo", ["echo", "hi"], "/tmp", SESSION, facts=system_facts("/usr/bin/echo"))
        proc.kill()
        await proc.wait()
        # The Run above is in the client's decision cache, used only while the channel is READY
        # (docs/DESIGN.md §9): a service dead for less than the moment gRPC's poller takes to see
        # its socket close is not known to be dead. Wait for that moment (bounded), then the same
        # exec must be denied like any other.
        for _ in range(100):
            if policy._channel is None or policy._channel.get_state() != grpc.ChannelConnectivity.READY:
                break
            await asyncio.sleep(0.01)
        started = time.monotonic()
        after = await policy.determine_action("/usr/bin/echo", ["echo", "hi"], "/tmp", SESSION, facts=system_facts("/usr/bin/echo"))
        elapsed = time.monotonic() - started
        await policy.aclose()
        # grpc delivers the completion of an interrupted reconnect attempt to this loop shortly
        # after the channel closes; let it arrive before the test's loop is closed.
        await asyncio.sleep(0.5)
    assert before.action == "run" and before.rule_id == "echo-run", before
    assert after.action == "deny" and after.error and "unavailable" in after.reason, after
    assert elapsed < 6


async def test_serve_bad_rules_exits_2(short_tmp: Path) -> None:
    bad = short_tmp / "bad.toml"
    bad.write_text('[[rule]]\nprogram = "x"\ndecision = "maybe"\n')
    proc = await asyncio.create_subprocess_exec(
        *CLI, "policy", "serve", "--listen", f"unix://{short_tmp / 's'}", "--rules", str(bad),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"bad.toml" in err


async def test_serve_missing_socket_directory_is_one_clear_line(short_tmp: Path, rules_file: Path) -> None:
    """Issue #12 item 7: no raw gRPC core log line, one message that names the directory."""
    missing = short_tmp / "no-such-dir"
    proc = await asyncio.create_subprocess_exec(
        *CLI, "policy", "serve", "--listen", f"unix://{missing}/p.sock", "--rules", str(rules_file),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, err
    lines = [line for line in err.decode().splitlines() if " INFO " not in line and " WARNING " not in line]
    assert lines == [f"execgate policy serve: cannot listen on unix://{missing}/p.sock: directory {missing} does "
                     f"not exist (create it first, e.g. mkdir -p -m 0700 {missing})"], err


@pytest.mark.parametrize("listen", ["0.0.0.0:{port}", "[::]:{port}", "192.0.2.1:{port}"])
async def test_serve_refuses_plaintext_beyond_loopback(rules_file: Path, listen: str) -> None:
    """Issue #12 item 7: a TCP listener other hosts may reach needs TLS, or --insecure said aloud."""
    proc = await asyncio.create_subprocess_exec(
        *CLI, "policy", "serve", "--listen", listen.format(port=_free_port()), "--rules", str(rules_file),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, err
    assert b"plaintext on a non-loopback address" in err and b"--insecure" in err


async def test_serve_insecure_listens_beyond_loopback(rules_file: Path) -> None:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        *CLI, "policy", "serve", "--listen", f"0.0.0.0:{port}", "--insecure", "--rules", str(rules_file),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = b""
        while b"listening on" not in line:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert line, "policy serve exited before listening"
        # Served for real: a decision over TCP on the loopback side of the wildcard.
        policy = GrpcPolicy(f"127.0.0.1:{port}")
        try:
            decision = await policy.determine_action("/bin/true", ["true"], "/", SESSION)
        finally:
            await policy.aclose()
        assert decision.action == "run"
    finally:
        proc.kill()
        await proc.wait()


def test_local_addresses() -> None:
    local = ["unix:///run/x.sock", "127.0.0.1:1", "127.8.9.10:1", "localhost:1", "[::1]:1"]
    remote = ["0.0.0.0:1", "[::]:1", "10.0.0.1:1", "example.invalid:1", "[2001:db8::1]:1"]
    assert [is_local_address(a) for a in local] == [True] * len(local)
    assert [is_local_address(a) for a in remote] == [False] * len(remote)
    with pytest.raises(ValueError):
        is_local_address("no-port")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_serve_embedded(rules_file: Path) -> None:
    async with serve_embedded([rules_file]) as embedded:
        path = Path(embedded.address[len("unix://"):])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.parent.parent == Path("/tmp")
        assert embedded.approvals_address is None and embedded.approvals_token_file is None
        assert os.listdir(path.parent) == ["policy.sock"]  # no token file: the token is in memory only
        policy = GrpcPolicy(embedded.address, token=embedded.token)
        decision = await policy.determine_action("/usr/bin/rm", ["rm", "x"], "/tmp", SESSION)
        await policy.aclose()
        tokenless = GrpcPolicy(embedded.address, timeout_s=5)
        refused = await tokenless.determine_action("/usr/bin/rm", ["rm", "x"], "/tmp", SESSION)
        await tokenless.aclose()
    assert decision.action == "deny" and decision.reason == "no deleting"
    assert refused.action == "deny" and "UNAUTHENTICATED" in (refused.reason or "")
    assert not path.parent.exists()


async def test_serve_embedded_ignores_tmpdir(rules_file: Path, short_tmp: Path, monkeypatch) -> None:
    """A TMPDIR the session can see must not receive the sockets: they go under /tmp."""
    monkeypatch.setenv("TMPDIR", str(short_tmp))
    async with serve_embedded([rules_file], approvals=True) as embedded:
        directory = Path(embedded.address[len("unix://"):]).parent
        token_file = Path(embedded.approvals_token_file or "")
        assert directory.parent == Path("/tmp") and token_file.parent == directory
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert embedded.approvals_address == f"unix://{directory / 'approvals.sock'}"
        assert token_file.read_text().strip() != embedded.token
    assert not any(p.name.startswith("execgate-") for p in short_tmp.iterdir())
