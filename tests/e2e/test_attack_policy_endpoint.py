"""Attack: a session reaches the decision endpoint of the policy service its server uses
(docs/DESIGN.md §8: the decision endpoint is the escalation server's, never the session's).

``execgate run --policy unix:///…/policy.sock --token-file …`` with the socket and the token file
somewhere the read-only root shows (not under /tmp or /run, which the sandbox replaces). The script
inside tries to read the token and to call ``DetermineAction`` itself. Both must fail, while the
session's own execs are still decided (a denied marker is denied, a plain command runs).
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
                     'justification = "never"\n')
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
