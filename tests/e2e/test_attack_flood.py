"""One request cannot stall the gate (issue #9 class 8).

A hostile session floods worst-case requests over the raw escalation protocol (500,000-component
file paths, 1 MiB of argv, 1 MiB of env, JSON nested a million deep; ``data/flood_client.py``)
while a hostile gRPC client sends the policy service 500,000-component program paths
(``data/grpc_flood.py``). Meanwhile a second session of the same escalation server, asking the
same policy service (a real ``execgate policy serve`` process), runs its commands: every one of
its decisions must come back. Before the input bounds, one such path kept the service's event
loop in ``realpath`` for minutes and every other session was denied (deadline exceeded).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import AsyncIterator

import pytest

from attack_support import attacker  # noqa: F401 - fixture
from execgate.server.escalate_server import EscalateServer
from execgate.server.grpc_policy import GrpcPolicy
from execgate.wrapper.artifacts import native_wrapper_path
from execgate.wrapper.interception import preload_extra_env

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

DATA = Path(__file__).parent / "data"
CLI = (sys.executable, "-m", "execgate.server.cli")
#: Commands the victim session runs while the flood goes on.
VICTIM_EXECS = 10
VICTIM_SCRIPT = f'for i in $(seq {VICTIM_EXECS}); do /bin/true; echo "status $?"; done'

RULES = """
default = "run"

[[rule]]
id = "true-run"
program = "true"
decision = "run"
justification = "a basename rule: the service checks where the program lives"
"""


@pytest.fixture
def anyio_backend():
    return ("asyncio", {"use_uvloop": True})  # the production loop


async def _wait_for(predicate, what: str, limit_s: float = 60.0) -> None:
    """Poll ``predicate`` until true; AssertionError naming ``what`` after ``limit_s`` seconds."""
    try:
        async with asyncio.timeout(limit_s):
            while not predicate():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{what}: not seen within {limit_s} s") from None


@contextlib.asynccontextmanager
async def policy_service(directory: Path) -> AsyncIterator[str]:
    """``execgate policy serve`` on a Unix socket in ``directory``; yields its address."""
    rules = directory / "rules.toml"
    rules.write_text(RULES)
    address = f"unix://{directory / 'p.sock'}"
    log_path = directory / "service.log"
    with open(log_path, "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *CLI, "policy", "serve", "--listen", address, "--rules", str(rules),
            stdout=asyncio.subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    try:
        await _wait_for(lambda: b"listening on" in log_path.read_bytes() or proc.returncode is not None, "serve")
        assert proc.returncode is None, log_path.read_text()
        yield address
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_flooding_session_does_not_starve_another_session(attacker, short_tmp: Path, tmp_path: Path) -> None:
    work = attacker.workdir()
    flood = work / "flood_client.py"
    shutil.copy(DATA / "flood_client.py", flood)
    ready, stop, report, grpc_report = (work / n for n in ("ready", "stop", "report.json", "grpc.json"))
    wrapper = native_wrapper_path()
    async with policy_service(short_tmp) as address:
        policy = GrpcPolicy(address)
        server = EscalateServer("/bin/bash", str(wrapper), policy, extra_env=preload_extra_env(wrapper),
                                socket_dir=str(short_tmp))
        grpc_flood = await asyncio.create_subprocess_exec(
            sys.executable, str(DATA / "grpc_flood.py"), address, str(stop), str(grpc_report)
        )
        hostile_cmd = shlex.join(attacker.command([sys.executable, str(flood), str(ready), str(stop), str(report)]))
        hostile = asyncio.ensure_future(server.exec(hostile_cmd, str(work), timeout_s=900))
        try:
            await _wait_for(lambda: ready.exists() or hostile.done(), "the flood")
            assert ready.exists(), hostile.result()
            victim = await server.exec(VICTIM_SCRIPT, str(tmp_path), timeout_s=900)
            flooded = not hostile.done()  # the flood went on all the while
        finally:
            stop.touch()
            async with asyncio.timeout(300):
                hostile_result = await hostile
                await grpc_flood.wait()
            await policy.aclose()
    assert flooded, hostile_result
    # Every decision of the other session came back (N of N), none denied.
    assert victim.stdout.splitlines() == ["status 0"] * VICTIM_EXECS, (victim.stdout, victim.stderr)
    assert "Execution denied" not in victim.stderr and victim.exit_code == 0
    # What the flood got: oversized paths refused by name, the rest answered or cut off.
    counts = json.loads(report.read_text())
    assert hostile_result.exit_code == 0, hostile_result.stderr
    refusal = "Deny: request refused: request.file is at least 999999 bytes"
    assert all(outcome.startswith(refusal) for outcome in counts["path"]), counts
    assert set(counts["deep"]) == {"closed"}, counts
    assert set(counts["argv"]) == set(counts["env"]) == {"Run"}, counts
    assert all(sum(c.values()) >= 1 for c in counts.values()), counts
    grpc_counts = json.loads(grpc_report.read_text())
    assert set(grpc_counts) == {"INVALID_ARGUMENT"} and grpc_counts["INVALID_ARGUMENT"] >= 1, grpc_counts
