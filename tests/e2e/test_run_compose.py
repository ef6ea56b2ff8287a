"""The docker-compose dev stack (docker-compose.yml), checked three ways:

- ``docker-compose config`` accepts the file;
- the services' commands work as local processes (container paths, host names and ports mapped to
  local ones; a local redis-server);
- the stack runs for real in Docker (``slow``): images built without a registry by
  scripts/compose_test_images.sh, ``docker-compose up`` of Redis, two policy replicas sharing
  their state through it, the web approver and the agent.

Both runs go the same way: the agent runs examples/workspace/task.sh gated and sandboxed (its ``su``
denied) with its decisions balanced over both replicas, then asks for ``apt-get install
--simulate``, a ``prompt`` of the compose rules; the test answers it as the approval page does —
log in with the token, listen to ``/events``, POST ``/api/resolve`` — and the approved command
runs. The audit stream in Redis holds every decision of both replicas.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from run_support import CLI, audit_records

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
IMAGES_SCRIPT = ROOT / "scripts" / "compose_test_images.sh"
#: The stack's Redis image when no registry is reachable (scripts/compose_test_images.sh).
LOCAL_REDIS_IMAGE = "execgate-redis:bookworm"
#: What task.sh prints, given the directory it runs in.
TASK_STDOUT = "building in {}\n1\nsu was refused (status 1)\ndone\n"
DENIED_SU = "Execution denied: privilege escalation is not allowed in the dev stack\n"
#: What the approved ``apt-get install --simulate bubblewrap`` prints (bubblewrap is installed;
#: on a host whose package lists hold a newer one, the simulated upgrade).
APT_SIMULATED = re.compile(r"^(bubblewrap is already the newest version \(.+\)\.|Inst bubblewrap .+)$", re.M)
AUDIT_STREAM = "execgate:audit"  # policy_service/state_redis.py
WAIT_S = 240  # upper bounds for slow machines, never measured times


def test_docker_compose_accepts_the_file():
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose is not installed")
    done = subprocess.run([tool, "-f", str(COMPOSE), "config", "-q"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


# --- the approval page, driven over HTTP as its own script does ----------------------------------


class Page:
    """A client of ``execgate approve --web``: the page's login and its endpoints."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port, self.cookie = host, port, ""

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            sent = {"Cookie": self.cookie} if self.cookie else {}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                sent["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers={**sent, **(headers or {})})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def log_in(self, token: str) -> None:
        """``GET /?token=T``: 303 to ``/`` with the session cookie; the page then loads."""
        status, headers, _ = self.request("GET", f"/?token={token}")
        assert status == 303 and headers["Location"] == "/", (status, headers)
        self.cookie = headers["Set-Cookie"].split(";", 1)[0]
        status, _, body = self.request("GET", "/")
        assert status == 200 and b"execgate approvals" in body

    def resolve(self, request_id: str, verdict: str, *, reason: str = "",
                header: bool = True) -> tuple[int, dict[str, Any] | bytes]:
        status, _, body = self.request("POST", "/api/resolve", {"id": request_id, "verdict": verdict, "reason": reason},
                                       {"X-Execgate": "1"} if header else {})
        return status, json.loads(body) if status == 200 else body

    @contextlib.contextmanager
    def events(self) -> Iterator[queue.Queue[tuple[str, Any]]]:
        """The page's server-sent events, as (event, data) pairs, while inside.

        While a page listens, the web approver watches the service's pending requests: it is then
        an approver the service counts.
        """
        conn = http.client.HTTPConnection(self.host, self.port, timeout=None)
        conn.request("GET", "/events", headers={"Cookie": self.cookie})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
        events: queue.Queue[tuple[str, Any]] = queue.Queue()

        def read() -> None:
            event = ""
            for raw in response:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[len("event: "):]
                elif line.startswith("data: "):
                    events.put((event, json.loads(line[len("data: "):])))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            yield events
        finally:
            with contextlib.suppress(OSError):  # the server may have closed it already
                assert conn.sock is not None
                conn.sock.shutdown(socket.SHUT_RDWR)  # ends the reader's blocking read
            reader.join(10)
            conn.close()


def _next_event(events: queue.Queue[tuple[str, Any]], name: str, timeout: float = WAIT_S) -> Any:
    deadline, seen = time.monotonic() + timeout, []
    while True:
        try:
            event, data = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {name!r} event within {timeout} s; events before: {seen}") from None
        if event == name:
            return data
        seen.append((event, data))


def _approve_the_agents_request(page: Page, token: str) -> dict[str, Any]:
    """Log in, wait for the agent's ``apt-get install`` to appear, approve it once; returns it."""
    status, _, _ = page.request("GET", "/api/pending")
    assert status == 401  # not logged in
    page.log_in(token)
    with page.events() as events:
        pending = _next_event(events, "pending")
        assert page.resolve(pending["id"], "once", header=False)[0] == 403  # what a cross-site form sends
        assert page.resolve(pending["id"], "once") == (200, {"message": "approved once"})
        assert _next_event(events, "gone", 30) == {"id": pending["id"], "why": "approved once"}
    return pending


def _assert_request_shown(pending: dict[str, Any], workdir: str) -> None:
    """What the page showed: the agent's request with its session, rule and environment."""
    assert pending["argv"] == ["apt-get", "install", "--simulate", "bubblewrap"]
    assert pending["program"].endswith("/apt-get") and pending["cwd"] == workdir
    assert pending["labels"] == {"agent": "compose"} and pending["sandboxed"] is True
    assert pending["rule"] == "compose-system-packages"
    assert pending["justification"].startswith("system packages change the image")
    assert pending["execution"] == "unsandboxed"
    assert "PATH" in pending["env"]


# --- the audit ---------------------------------------------------------------------------------


def _stream_records(xrange_raw: str) -> list[dict[str, Any]]:
    """The audit records of ``redis-cli --raw XRANGE execgate:audit - +`` (entry id, field, value)."""
    lines = xrange_raw.splitlines()
    records = [json.loads(value) for field, value in zip(lines, lines[1:]) if field == "record"]
    assert records, xrange_raw
    return records


def _assert_audit(stream: list[dict[str, Any]], xlen: int, replicas: dict[str, list[dict[str, Any]]]) -> str:
    """One run of the stack's agent: every decision in the shared stream, each made by one replica.

    Returns the name of the replica that raised the prompt.
    """
    assert xlen == len(stream)
    ids = [r["decision_id"] for r in stream]
    assert len(set(ids)) == len(ids)
    # Balanced: both replicas decided some of the session's execs; the stream has them all.
    assert all(replicas.values()), {name: len(records) for name, records in replicas.items()}
    assert sorted(ids) == sorted(r["decision_id"] for records in replicas.values() for r in records)
    assert {r["labels"].get("agent") for r in stream} == {"compose"}
    assert len({r["session_id"] for r in stream}) == 1
    decided = [(r["argv"][0], r["decision"], r["rule_id"]) for r in stream]
    assert ("su", "deny", "compose-privilege") in decided
    assert ("printf", "run", "") not in decided  # a bash builtin: no exec, no decision
    assert [d for d in decided if d[0] == "wc"] == [("wc", "run", "")]
    prompted = [r for r in stream if r["argv"][0] == "apt-get"]
    assert [(r["decision"], r["rule_id"], r["approver"]) for r in prompted] == [
        ("escalate", "compose-system-packages", "operator (web)")]
    return next(name for name, records in replicas.items()
                if prompted[0]["decision_id"] in {r["decision_id"] for r in records})


# --- the services as local processes -----------------------------------------------------------


def _local(argv: list[str], mapping: dict[str, str]) -> list[str]:
    """A service's arguments with container paths, names and ports replaced by local ones."""
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
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(check: list[str], proc: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + 60
    while subprocess.run(check, capture_output=True, timeout=30, check=False).returncode != 0:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"the health check {check} never passed"
        time.sleep(0.2)


def test_compose_services_run_as_local_processes(short_tmp: Path, redis_server):
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    workspace = short_tmp / "workspace"
    shutil.copytree(ROOT / "examples" / "workspace", workspace)
    (short_tmp / "run").mkdir()
    (short_tmp / "log").mkdir()
    ports = {"policy-1": _free_port(), "policy-2": _free_port(), "web": _free_port()}
    mapping = {
        "/etc/execgate/rules.toml": str(ROOT / "examples" / "compose-rules.toml"),
        "/run/execgate": str(short_tmp / "run"),
        "/var/log/execgate": str(short_tmp / "log"),
        "/workspace": str(workspace),
        "redis://redis:6379/0": redis_server.url,
        "dns:///policy:7000": f"ipv4:127.0.0.1:{ports['policy-1']},127.0.0.1:{ports['policy-2']}",
    }
    # Every mounted file the stack needs is in the repository.
    for volume in services["policy-1"]["volumes"]:
        source = volume.split(":")[0]
        if source.startswith("./"):
            assert (ROOT / source).exists(), volume

    procs: list[subprocess.Popen[str]] = []
    try:
        for name in ("policy-1", "policy-2"):
            here = f"127.0.0.1:{ports[name]}"
            local = {**mapping, "0.0.0.0:7000": here, "127.0.0.1:7000": here}
            log = short_tmp / f"{name}.log"
            with log.open("w") as err:
                procs.append(subprocess.Popen([*CLI, *_local(services[name]["command"], local)],
                                              stdout=subprocess.DEVNULL, stderr=err, text=True))
            health = services[name]["healthcheck"]["test"]
            assert health[:2] == ["CMD", "execgate"]
            _wait_for([*CLI, *_local(health[2:], local)], procs[-1], log)
        here = f"127.0.0.1:{ports['web']}"
        web_local = {**mapping, "0.0.0.0:8080": here, "127.0.0.1:8080": here}
        web = subprocess.Popen([*CLI, *_local(services["web"]["command"], web_local)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        procs.append(web)
        assert web.stdout is not None
        url = web.stdout.readline()  # execgate approve: approval page at http://…/?token=T
        assert "approval page at" in url, web.stderr.read() if web.poll() is not None else url
        token = url.strip().rsplit("?token=", 1)[1]
        health = services["web"]["healthcheck"]["test"]
        assert health[:2] == ["CMD", "python3"]
        assert subprocess.run([sys.executable, *_local(health[2:], web_local)], capture_output=True, text=True,
                              timeout=30, check=False).stdout == "200\n"

        agent = subprocess.Popen([*CLI, *_local(services["agent"]["command"], mapping)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        procs.append(agent)
        pending = _approve_the_agents_request(Page("127.0.0.1", ports["web"]), token)
        agent_out, agent_err = agent.communicate(timeout=WAIT_S)
        xrange = subprocess.run(["redis-cli", "-p", str(redis_server.port), "--raw", "XRANGE", AUDIT_STREAM, "-", "+"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
        xlen = subprocess.run(["redis-cli", "-p", str(redis_server.port), "XLEN", AUDIT_STREAM],
                              capture_output=True, text=True, timeout=30, check=True).stdout
    finally:
        for proc in reversed(procs):
            _stop(proc)

    assert agent.returncode == 0, agent_err
    assert agent_out.startswith(TASK_STDOUT.format(workspace)) and APT_SIMULATED.search(agent_out), agent_out
    assert DENIED_SU in agent_err
    assert (workspace / "out.txt").read_text() == "hello from the agent\n"
    _assert_request_shown(pending, str(workspace))
    replicas = {name: audit_records(short_tmp / "log" / f"{name}.jsonl") for name in ("policy-1", "policy-2")}
    _assert_audit(_stream_records(xrange), int(xlen), replicas)


# --- the stack in Docker -------------------------------------------------------------------------


def _run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None,
         stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=env, stdin=stdin, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def compose_images() -> str:
    """Build execgate:dev and the Redis image on local Debian base images (no registry); returns
    the script's log.

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


#: The last health check output of each service (docker-compose.yml's healthchecks).
HEALTHY_OUTPUT = {"redis": "PONG", "policy-1": "SERVING", "policy-2": "SERVING", "web": "200"}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_compose_stack_runs_in_docker(compose_images: str, short_tmp: Path):
    print(compose_images)  # the image build's steps and timings, shown when the test fails
    started = time.monotonic()
    # The final image carries no compiler (the Dockerfile's build stage has it).
    no_gcc = _run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", "execgate:dev", "-c",
                   "! command -v gcc && ! command -v cc && ! [ -e /usr/include/stdio.h ]"], timeout=120)
    assert no_gcc.returncode == 0, no_gcc.stdout + no_gcc.stderr
    workspace = short_tmp / "workspace"
    shutil.copytree(ROOT / "examples" / "workspace", workspace)
    workspace.chmod(0o777)  # the services run as the image's user execgate (uid 1000)
    web_port = _free_port()
    env = {**os.environ, "EXECGATE_WORKSPACE": str(workspace), "EXECGATE_REDIS_IMAGE": LOCAL_REDIS_IMAGE,
           "EXECGATE_WEB_PORT": str(web_port)}
    compose = ["docker-compose", "-f", str(COMPOSE), "-p", f"egtest{os.getpid()}"]
    names = ("redis", "policy-1", "policy-2", "web", "agent")
    logs = ""
    try:
        # `up` starts each service once those it depends on pass their health checks: Redis, then
        # the replicas, then the web approver, then the agent (which runs its task at once).
        up = _run([*compose, "up", "-d", "--no-build"], timeout=600, env=env)
        assert up.returncode == 0, up.stderr
        ids = {name: _run([*compose, "ps", "-q", name], timeout=60, env=env).stdout.strip() for name in names}
        assert all(ids.values()), ids
        up_s = time.monotonic() - started
        printed = _run(["docker", "logs", ids["web"]], timeout=60).stdout
        token = re.search(r"approval page at http://0\.0\.0\.0:8080/\?token=(\S+)", printed)
        assert token, printed
        pending = _approve_the_agents_request(Page("127.0.0.1", web_port), token[1])
        waited = _run(["docker", "wait", ids["agent"]], timeout=WAIT_S)
        agent_out = _run(["docker", "logs", ids["agent"]], timeout=60)
        health = {name: json.loads(_inspect(ids[name], "{{json .State.Health}}")) for name in HEALTHY_OUTPUT}
        redis_cli = [*compose, "exec", "-T", "redis", "redis-cli"]
        xlen = _run([*redis_cli, "XLEN", AUDIT_STREAM], timeout=60, env=env)
        xrange = _run([*redis_cli, "--raw", "XRANGE", AUDIT_STREAM, "-", "+"], timeout=60, env=env)
        for name in ("policy-1", "policy-2"):
            copied = _run(["docker", "cp", f"{ids[name]}:/var/log/execgate/{name}.jsonl", str(short_tmp)], timeout=60)
            assert copied.returncode == 0, copied.stderr
    finally:
        logs = _run([*compose, "logs", "--no-color"], timeout=120, env=env).stdout
        _run([*compose, "down", "-v", "--remove-orphans", "-t", "5"], timeout=300, env=env)
        print(logs[-20000:])  # every service's output, shown when the test fails

    assert waited.stdout.strip() == "0", agent_out.stderr
    assert agent_out.stdout.startswith(TASK_STDOUT.format("/workspace")), agent_out.stdout
    assert APT_SIMULATED.search(agent_out.stdout), agent_out.stdout  # the approved command ran
    assert DENIED_SU in agent_out.stderr
    assert "sandbox: bwrap" in agent_out.stderr  # a real bubblewrap sandbox inside the container
    assert "rules: those of the policy service at dns:///policy:7000" in agent_out.stderr
    assert (workspace / "out.txt").read_text() == "hello from the agent\n"
    _assert_request_shown(pending, "/workspace")
    for name, want in HEALTHY_OUTPUT.items():
        assert health[name]["Status"] == "healthy", (name, health[name])
        last = health[name]["Log"][-1]
        assert last["ExitCode"] == 0 and last["Output"].strip() == want, (name, health[name])
    assert xlen.returncode == 0 and xrange.returncode == 0, xlen.stderr + xrange.stderr
    replicas = {name: audit_records(short_tmp / f"{name}.jsonl") for name in ("policy-1", "policy-2")}
    prompted_on = _assert_audit(_stream_records(xrange.stdout), int(xlen.stdout), replicas)
    print(f"stack up in {up_s:.0f} s; the prompt was raised on {prompted_on}, approved through the web "
          f"approver on policy-1; decisions: { {name: len(r) for name, r in replicas.items()} }")
