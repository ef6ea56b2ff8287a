"""The docker-compose dev stack, checked three ways:

- ``docker-compose config`` accepts the file;
- the services' commands work as local processes (container paths mapped to temp dirs);
- the stack runs for real in Docker (``slow``): images built without a registry by
  scripts/compose_test_images.sh, ``docker-compose up`` of the policy service and the agent.

Each time the policy service becomes healthy by the compose health check, the agent runs
examples/workspace/task.sh gated and sandboxed (its ``su`` denied), the approver connects, and the
audit log records every decision.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from run_support import CLI, audit_records

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
IMAGES_SCRIPT = ROOT / "scripts" / "compose_test_images.sh"
#: What task.sh prints, given the directory it runs in.
TASK_STDOUT = "building in {}\n1\nsu was refused (status 1)\ndone\n"
DENIED_SU = "Execution denied: privilege escalation is not allowed in the dev stack\n"


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
    logs = short_tmp / "log"
    logs.mkdir()
    mapping = {
        "/etc/execgate/rules.toml": str(ROOT / "examples" / "compose-rules.toml"),
        "/run/execgate": str(sockets),
        "/var/log/execgate": str(logs),
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
    assert agent.stdout == TASK_STDOUT.format(workspace)
    assert DENIED_SU in agent.stderr
    assert (workspace / "out.txt").read_text() == "hello from the agent\n"
    assert approver.returncode == 0 and "watching for pending requests" in approver_out, approver_err
    _assert_task_audited(audit_records(logs / "audit.jsonl"))


def _assert_task_audited(records: list[dict[str, Any]]) -> None:
    """The audit log of one run of task.sh: every decision labelled, su denied by its rule."""
    assert {r["labels"].get("agent") for r in records} == {"compose"}
    assert len({r["session_id"] for r in records}) == 1
    decided = [(r["argv"][0], r["decision"], r["rule_id"]) for r in records]
    assert ("su", "deny", "compose-privilege") in decided
    assert ("printf", "run", "") not in decided  # a bash builtin: no exec, no decision
    assert [d for d in decided if d[0] == "wc"] == [("wc", "run", "")]


# --- the stack in Docker -------------------------------------------------------------------------


def _run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None,
         stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=env, stdin=stdin, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def compose_images() -> str:
    """Build execgate:dev on local Debian base images (no registry); returns the script's log.

    A fresh machine runs debootstrap (minutes); later runs take the root filesystems from the
    script's cache (/var/cache/execgate-ci) or the images already in the engine.
    """
    for tool in ("docker", "docker-compose"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup.sh installs it)")
    if _run(["docker", "info"], timeout=60).returncode != 0:
        pytest.skip("no Docker engine answers (.ci/run starts dockerd)")
    done = _run(["bash", str(IMAGES_SCRIPT)], timeout=3000, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def _inspect(container: str, template: str) -> str:
    done = _run(["docker", "inspect", "-f", template, container], timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_compose_stack_runs_in_docker(compose_images: str, short_tmp: Path):
    print(compose_images)  # the image build's steps and timings, shown when the test fails
    workspace = short_tmp / "workspace"
    shutil.copytree(ROOT / "examples" / "workspace", workspace)
    workspace.chmod(0o777)  # the services run as the image's user execgate (uid 1000)
    env = {**os.environ, "EXECGATE_WORKSPACE": str(workspace)}
    compose = ["docker-compose", "-f", str(COMPOSE), "-p", f"egtest{os.getpid()}"]
    try:
        # `up` starts the agent only once the policy service's health check passes.
        up = _run([*compose, "up", "-d", "--no-build", "policy", "agent"], timeout=600, env=env)
        assert up.returncode == 0, up.stderr
        policy, agent = (_run([*compose, "ps", "-q", name], timeout=60, env=env).stdout.strip()
                         for name in ("policy", "agent"))
        assert policy and agent
        waited = _run(["docker", "wait", agent], timeout=300)
        agent_out = _run(["docker", "logs", agent], timeout=60)
        health = json.loads(_inspect(policy, "{{json .State.Health}}"))
        approver = _run([*compose, "run", "--rm", "-T", "approver"], timeout=300, env=env)
        stopped = _run([*compose, "stop", "policy"], timeout=120, env=env)
        assert stopped.returncode == 0, stopped.stderr
        copied = _run(["docker", "cp", f"{policy}:/var/log/execgate/audit.jsonl", str(short_tmp)], timeout=60)
        assert copied.returncode == 0, copied.stderr
    finally:
        _run([*compose, "down", "-v", "--remove-orphans", "-t", "5"], timeout=300, env=env)

    assert waited.stdout.strip() == "0", agent_out.stderr
    assert agent_out.stdout == TASK_STDOUT.format("/workspace")
    assert DENIED_SU in agent_out.stderr
    assert "sandbox: bwrap" in agent_out.stderr  # a real bubblewrap sandbox inside the container
    assert (workspace / "out.txt").read_text() == "hello from the agent\n"
    assert health["Status"] == "healthy", health
    assert health["Log"][-1]["ExitCode"] == 0 and health["Log"][-1]["Output"].strip() == "SERVING", health
    assert approver.returncode == 0 and "watching for pending requests" in approver.stdout, approver.stderr
    _assert_task_audited(audit_records(short_tmp / "audit.jsonl"))
