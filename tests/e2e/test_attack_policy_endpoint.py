"""Attack: a session reaches the decision endpoint of the policy service its server uses
(docs/DESIGN.md §8: the decision endpoint is the escalation server's, never the session's).

``execgate run --policy unix:///…/policy.sock --token-file …`` with the socket and the token file
somewhere the read-only root shows (not under /tmp or /run, which the sandbox replaces). The script
inside tries to read the token and to call ``DetermineAction`` itself. Both must fail, while the
session's own execs are still decided (a denied marker is denied, a plain command runs). The same
from a command the service escalates into a sandbox of its own (network on): it hides what the
session's hides. And a token file replaced on the host mid-session (``mv token.new token``) stays
out of sight: the sandboxes mask its directory, not just the file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from attack_support import Attacker

pytestmark = pytest.mark.e2e

SITE = str(Path(grpc.__file__).resolve().parent.parent)
PYTHON = os.path.realpath(sys.executable)

PROBE = """
import sys
sys.path.insert(0, {site!r})
import grpc
from execgate.v1 import policy_pb2, policy_pb2_grpc
try:
    token = open({token!r}).read().strip()
except OSError as exc:
    token = ""
    print("token-error=%s" % type(exc).__name__)
print("token-read=%d" % len(token))
channel = grpc.insecure_channel("unix://" + {sock!r})
stub = policy_pb2_grpc.EscalationPolicyStub(channel)
try:
    target = policy_pb2.ExecTarget(program="/bin/true", argv=["true"], workdir="/")
    stub.DetermineAction(policy_pb2.DetermineActionRequest(target=target),
                         metadata=[("authorization", "Bearer " + token)], timeout=5)
    print("decision-endpoint=reached")
except grpc.RpcError as exc:
    print("decision-endpoint=%s" % exc.code().name)
"""


@pytest.fixture
def remote_policy(attacker: Attacker):
    """A real ``policy serve`` run by the attacker's own account, its socket and token file in a
    directory under /var/tmp (visible through the sandbox's read-only root)."""
    home = Path(tempfile.mkdtemp(prefix="eg-pol-", dir="/var/tmp"))
    os.chown(home, attacker.uid, attacker.gid)
    token = home / "decision.token"
    token.write_text("decision-token-of-the-server-only\n")
    token.chmod(0o600)
    os.chown(token, attacker.uid, attacker.gid)
    rules = home / "rules.toml"
    rules.write_text('[[rule]]\nid = "deny-marker"\nprogram = "denied"\ndecision = "deny"\n'
                     'justification = "never"\n\n'
                     '[[rule]]\nid = "dash-escalated"\nprogram = "dash"\ndecision = "escalate"\n'
                     'execution = { network = true }\njustification = "a sandbox of its own"\n')
    sock = home / "policy.sock"
    proc = subprocess.Popen(
        attacker.command([sys.executable, "-m", "execgate.server.cli", "policy", "serve",
                          "--listen", f"unix://{sock}", "--token-file", str(token), "--rules", str(rules)]),
        env=attacker.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        for _ in range(600):
            if sock.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert sock.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no socket"
        yield sock, token
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()
        shutil.rmtree(home, ignore_errors=True)


def test_session_cannot_reach_the_decision_endpoint(attacker: Attacker, remote_policy):
    sock, token = remote_policy
    work = attacker.workdir()
    attacker.marker_program(work, "denied")
    probe = work / "probe.py"
    probe.write_text(PROBE.format(site=SITE, token=str(token), sock=str(sock)))
    script = f"{PYTHON} {probe}; ./denied; echo denied=$?; echo plain-ok"
    done = attacker.execgate("run", "--sandbox", "bwrap", "--policy", f"unix://{sock}", "--token-file", str(token),
                             "--", script, cwd=work)
    out = done.stdout + done.stderr
    assert "token-read=0" in done.stdout, out
    assert "decision-endpoint=reached" not in done.stdout, out
    assert "decision-endpoint=UNAVAILABLE" in done.stdout, out
    # Control: the session's own execs are decided through that endpoint.
    assert not attacker.marker_ran("denied"), out
    assert "denied=1" in done.stdout and "plain-ok" in done.stdout, out


#: Prints the pid namespace: an escalated command (a bwrap of its own) is in another one.
PIDNS = "echo pidns-$(readlink /proc/self/ns/pid)"


def test_escalated_command_cannot_reach_the_decision_endpoint(attacker: Attacker, remote_policy):
    # Default rule git-network does this with `git fetch --upload-pack="python3 probe.py"`: a
    # command the service escalates into a sandbox with network runs what the session chose.
    sock, token = remote_policy
    work = attacker.workdir()
    probe = work / "probe.py"
    probe.write_text(PROBE.format(site=SITE, token=str(token), sock=str(sock)))
    script = f"{PIDNS}; dash -c '{PIDNS}; {PYTHON} {probe}; echo escalated=$?'"
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--policy", f"unix://{sock}", "--token-file",
                             str(token), "--", script, cwd=work)
    out = done.stdout + done.stderr
    assert "escalated=" in done.stdout, out
    spaces = {line for line in done.stdout.splitlines() if line.startswith("pidns-")}
    assert len(spaces) == 2, out  # control: the probe ran in the escalated sandbox, not the session's
    assert "token-read=0" in done.stdout and "decision-token" not in out, out
    assert "decision-endpoint=reached" not in done.stdout, out
    assert "decision-endpoint=UNAVAILABLE" in done.stdout, out


def test_token_replaced_on_the_host_stays_hidden(attacker: Attacker, remote_policy):
    sock, token = remote_policy
    work = attacker.workdir()
    ready, go = work / "ready", work / "go"
    script = (f"touch {ready}; while [ ! -e {go} ]; do sleep 0.1; done; cat {token}; echo shell-read=$?; "
              f"dash -c 'cat {token}; echo escalated-read=$?'")
    argv = [sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "bwrap", "--policy",
            f"unix://{sock}", "--token-file", str(token), "--", script]
    proc = subprocess.Popen(attacker.command(argv), cwd=work, env=attacker.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        # Re-deployed on the host as tools do it: a new file renamed over the old one.
        fresh = token.with_name("decision.token.new")
        fresh.write_text(token.read_text())
        fresh.chmod(0o600)
        os.chown(fresh, attacker.uid, attacker.gid)
        os.rename(fresh, token)
        go.touch()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "shell-read=" in out and "escalated-read=" in out, out + err
    assert "decision-token" not in out + err, out + err
    assert "shell-read=0" not in out and "escalated-read=0" not in out, out + err
