"""The docker-compose dev stack: ``docker-compose config`` accepts the file, and the services'
commands work as local processes (container paths mapped to temp dirs): the policy service
becomes healthy by the compose health check, the agent runs examples/workspace/task.sh gated
(its ``su`` denied), the approver connects, and the audit log records every decision."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from run_support import CLI, audit_records

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def test_docker_compose_accepts_the_file():
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose is not installed")
    done = subprocess.run([tool, "-f", str(COMPOSE), "config", "-q"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def _local(argv: list[str], mapping: dict[str, str]) -> list[str]:
    """A service's ``execgate`` arguments with container paths replaced by local ones."""
    out = []
    for arg in argv:
        for container, local in mapping.items():
            arg = arg.replace(container, local)
        out.append(arg)
    return out


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_compose_services_run_as_local_processes(short_tmp: Path):
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    workspace = short_tmp / "workspace"
    shutil.copytree(ROOT / "examples" / "workspace", workspace)
    sockets = short_tmp / "run"
    sockets.mkdir()
    mapping = {
        "/etc/execgate/rules.toml": str(ROOT / "examples" / "compose-rules.toml"),
        "/run/execgate": str(sockets),
        "/workspace": str(workspace),
    }
    # Every mounted file the stack needs is in the repository.
    for volume in services["policy"]["volumes"]:
        source = volume.split(":")[0]
        if source.startswith("./"):
            assert (ROOT / source).exists(), volume
    health = services["policy"]["healthcheck"]["test"]
    assert health[:2] == ["CMD", "execgate"]
    health_argv = [*CLI, *_local(health[2:], mapping)]

    serve_log = (short_tmp / "serve.log").open("w")
    policy = subprocess.Popen([*CLI, *_local(services["policy"]["command"], mapping)],
                              stdout=subprocess.DEVNULL, stderr=serve_log, text=True)
    serve_log.close()
    approver = None
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(health_argv, capture_output=True, timeout=10, check=False).returncode != 0:
            assert policy.poll() is None, (short_tmp / "serve.log").read_text()
            assert time.monotonic() < deadline, "the compose health check never passed"
            time.sleep(0.1)
        approver = subprocess.Popen([*CLI, *_local(services["approver"]["command"], mapping)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        agent = subprocess.run([*CLI, *_local(services["agent"]["command"], mapping)],
                               capture_output=True, text=True, timeout=60, check=False)
        approver_out, approver_err = approver.communicate(timeout=30)  # end of input stops it
    finally:
        for proc in (approver, policy):
            if proc is not None:
                _stop(proc)

    assert agent.returncode == 0, agent.stderr
    assert agent.stdout == f"building in {workspace}\n1\nsu was refused (status 1)\ndone\n"
    assert "Execution denied: privilege escalation is not allowed in the dev stack\n" in agent.stderr
    assert (workspace / "out.txt").read_text() == "hello from the agent\n"
    assert approver.returncode == 0 and "watching for pending requests" in approver_out, approver_err

    records = audit_records(sockets / "audit.jsonl")
    assert {r["labels"].get("agent") for r in records} == {"compose"}
    assert len({r["session_id"] for r in records}) == 1
    decided = [(r["argv"][0], r["decision"], r["rule_id"]) for r in records]
    assert ("su", "deny", "compose-privilege") in decided
    assert ("printf", "run", "") not in decided  # a bash builtin: no exec, no decision
    assert [d for d in decided if d[0] == "wc"] == [("wc", "run", "")]
