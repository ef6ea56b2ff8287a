"""Attack: a session answers its own ``prompt`` (issue #9 class 3, docs/DESIGN.md §8).

Each test runs ``execgate run`` for real, as root and as an unprivileged user, with a rules file
whose ``prompt`` rule guards a marker program. The script starts ``tests/e2e/data/self_approve.py``
— which hunts for every policy endpoint and credential it can reach (sockets under /tmp,
$TMPDIR, the working directory and its ancestors' fds; token files; execgate's memory; TCP) and
approves its own pending request wherever it can — then runs the marker. The marker must never
run; a plain command still runs and a denied one is still denied (the decision path works).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from attack_support import Attacker

pytestmark = pytest.mark.e2e

ATTACK = Path(__file__).parent / "data" / "self_approve.py"
#: The interpreter the attack runs with: the real binary (an absolute path a rule can name), with
#: the venv's site-packages (grpc and the execgate stubs) put on sys.path by the script itself.
PYTHON = os.path.realpath(sys.executable)
SITE = str(Path(grpc.__file__).resolve().parent.parent)


def _rules(work: Path, python_execution: str | None) -> Path:
    """A prompt rule for the marker ``pwned``, a deny rule for ``denied``, and optionally an
    over-broad escalation of the attacker's interpreter (``python_execution``)."""
    text = f"""
[[rule]]
id = "ask-marker"
program = "pwned"
decision = "prompt"
execution = "unsandboxed"
justification = "the marker needs a person"

[[rule]]
id = "deny-marker"
program = "denied"
decision = "deny"
justification = "never"
"""
    if python_execution is not None:
        text += f"""
[[rule]]
id = "attacker-code-escalates"
program = "{PYTHON}"
decision = "escalate"
execution = {python_execution}
justification = "an over-broad rule: the attacker's own code runs escalated"
"""
    path = work / "rules.toml"
    path.write_text(text)
    return path


def _script(attack_args: str = "") -> str:
    """Start the attacker, wait until it has connected everywhere, make the prompt, stop it."""
    return (
        f"rm -f ready done; {PYTHON} self_approve.py {SITE} ready done attack.log {attack_args} & "
        "i=0; while [ ! -e ready ] && [ $i -lt 400 ]; do sleep 0.1; i=$((i+1)); done; "
        "./pwned; echo \"pwned=$?\"; touch done; wait; "
        "echo plain-ok; ./denied; echo \"denied=$?\""
    )


def _prepare(attacker: Attacker) -> Path:
    work = attacker.workdir()
    attacker.marker_program(work, "pwned")
    attacker.marker_program(work, "denied")
    # The attack runs from the working directory: the repository may live under the host's /tmp
    # (CI copies it there), which the sandbox hides.
    shutil.copy(ATTACK, work / "self_approve.py")
    return work


def _log(work: Path) -> list[dict[str, object]]:
    path = work / "attack.log"
    assert path.exists(), "the attacker never finished"
    return json.loads(path.read_text())


def _assert_held(attacker: Attacker, done: subprocess.CompletedProcess[str], work: Path) -> list[dict[str, object]]:
    assert not attacker.marker_ran("pwned"), done.stdout + done.stderr
    assert "MARKER pwned RAN" not in done.stdout
    assert "pwned=1" in done.stdout, done.stdout + done.stderr
    # Control: the decision path works (a plain command runs, a denied one is denied).
    assert "plain-ok" in done.stdout and "denied=1" in done.stdout, done.stdout + done.stderr
    assert not attacker.marker_ran("denied")
    log = _log(work)
    assert not [r for r in log if r.get("step") == "resolve" and r.get("ok")], log
    return log


@pytest.mark.parametrize("service", ["in-process", "grpc"])
def test_escalated_command_seeing_host_tmp_cannot_approve(attacker: Attacker, service: str) -> None:
    """(a) bwrap session; an unsandboxed escalated command (host /tmp, host /proc) scans for the
    embedded policy socket, its ancestors' fds and execgate's memory, and calls Approvals. The
    embedded service decides in process by default (no socket at all); ``--metrics`` puts it on
    its private socket behind the gRPC client (docs/DESIGN.md §8)."""
    work = _prepare(attacker)
    rules = _rules(work, '"unsandboxed"')
    extra = ("--metrics", "127.0.0.1:0") if service == "grpc" else ()
    done = attacker.execgate("run", "--sandbox", "bwrap", *extra, "--rules", str(rules), "--cwd", str(work), "--",
                             _script(), cwd=work)
    log = _assert_held(attacker, done, work)
    found = next(r for r in log if r.get("step") == "found")
    if service == "grpc":
        # The attack was real: it found this run's embedded decision socket on the host's /tmp ...
        assert any("/tmp/execgate-" in e for e in found["ours"]), log  # type: ignore[union-attr]
    # (Deciding in process, this run has no policy socket; as the unprivileged user, "ours" still
    # holds the sockets of other runs of that user left under /tmp, which it tries too.)
    # ... and no credential it could find opened Approvals there.
    assert not [r for r in log if r.get("step") == "list" and r.get("ok") and r.get("ours")], log


def test_no_sandbox_denies_prompts_plainly(attacker: Attacker) -> None:
    """(b) --sandbox none: the shell has the user's power; prompts are denied, naming the fix."""
    work = _prepare(attacker)
    rules = _rules(work, None)
    done = attacker.execgate("run", "--sandbox", "none", "--rules", str(rules), "--cwd", str(work), "--",
                             _script(), cwd=work)
    _assert_held(attacker, done, work)
    assert "no sandbox: prompt rules are denied" in done.stderr
    assert "without a sandbox (--sandbox none)" in done.stderr and "--sandbox bwrap" in done.stderr
    refused = attacker.execgate("run", "--sandbox", "none", "--approver-wait", "5", "--rules", str(rules),
                                "--cwd", str(work), "--", "./pwned", cwd=work)
    assert refused.returncode == 2 and "--approver-wait" in refused.stderr
    assert not attacker.marker_ran("pwned")


def test_tmpdir_inside_the_sandbox_gets_no_socket(attacker: Attacker) -> None:
    """(c) TMPDIR points into the working directory, which the sandbox sees and writes."""
    work = _prepare(attacker)
    rules = _rules(work, None)
    tmpdir = work / "tmp"
    tmpdir.mkdir()
    os.chown(tmpdir, attacker.uid, attacker.gid)
    done = attacker.execgate("run", "--sandbox", "bwrap", "--rules", str(rules), "--cwd", str(work), "--",
                             _script(), cwd=work, env={"TMPDIR": str(tmpdir)})
    _assert_held(attacker, done, work)
    assert not list(tmpdir.iterdir())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(attacker: Attacker, work: Path, listen: str, rules: Path) -> tuple[subprocess.Popen[str], Path]:
    """``policy serve`` as the attacker's user (its escalation server must reach it): the
    decision token in the working directory (readable by the session), the approvals token in
    a directory under the host's /tmp (hidden from every bwrap sandbox)."""
    decision = work / "decision.token"
    decision.write_text("decision-token-the-session-can-read\n")
    hidden = Path(tempfile.mkdtemp(prefix="eg-approver-", dir="/tmp"))
    approvals = hidden / "approvals.token"
    approvals.write_text("approvals-token-kept-from-sessions\n")
    for path in (decision, hidden, approvals):
        os.chown(path, attacker.uid, attacker.gid)
    proc = subprocess.Popen(
        attacker.command([sys.executable, "-m", "execgate.server.cli", "policy", "serve", "--listen", listen,
                          "--rules", str(rules), "--token-file", str(decision),
                          "--approvals-token-file", str(approvals), "--approver-wait", "3"]),
        env=attacker.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line, f"policy serve exited: {proc.wait()}"
        if "listening on" in line:
            return proc, decision
    raise AssertionError("policy serve never listened")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.stderr is not None:
        proc.stderr.close()
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_readable_decision_token_does_not_authorise_approvals(attacker: Attacker) -> None:
    """(d) a policy service whose decision socket and token file lie in the working directory (the
    sandbox covers both) and whose Approvals have a credential of their own."""
    work = _prepare(attacker)
    rules = _rules(work, None)
    address = f"unix://{work}/policy.sock"
    proc, token = _serve(attacker, work, address, rules)
    try:
        # The attacker is told the address and the token file outright (it reads our source).
        done = attacker.execgate("run", "--sandbox", "bwrap", "--policy", address, "--token-file", str(token),
                                 "--cwd", str(work), "--", _script(f"--address {address} --token-file {token}"),
                                 cwd=work)
    finally:
        _stop(proc)
    log = _assert_held(attacker, done, work)
    # Inside the sandbox the token file and the socket are covered: nothing to read, nothing to call.
    reads = [r for r in log if r.get("step") == "token-file" and r.get("path") == str(token)]
    assert reads and not [r for r in reads if r.get("read")], log
    tried = [r for r in log if r.get("step") == "list" and r.get("where") == address]
    assert tried and all(r.get("code") in ("UNAVAILABLE", "UNAUTHENTICATED") for r in tried), log


def test_escalated_command_over_tcp_cannot_approve(attacker: Attacker) -> None:
    """(e) ``policy serve`` on 127.0.0.1 with a token; an escalated command with the network on
    calls Approvals over TCP. It cannot read the decision token either (escalated sandboxes hide
    what the session's hides), and without the approvals credential every call is refused."""
    work = _prepare(attacker)
    rules = _rules(work, "{ network = true }")
    address = f"127.0.0.1:{_free_port()}"
    proc, token = _serve(attacker, work, address, rules)
    try:
        done = attacker.execgate("run", "--sandbox", "bwrap", "--policy", address, "--token-file", str(token),
                                 "--cwd", str(work), "--", _script(f"--tcp {address}"), cwd=work)
    finally:
        _stop(proc)
    log = _assert_held(attacker, done, work)
    tried = [r for r in log if r.get("step") == "list" and r.get("where") == address]
    assert not any(r.get("token") for r in tried), log  # the token file is hidden from escalations too
    assert tried and all(r.get("code") == "UNAUTHENTICATED" for r in tried), log
