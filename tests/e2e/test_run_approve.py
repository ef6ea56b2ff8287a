"""A ``prompt`` rule answered by a person: ``execgate policy serve`` and ``execgate approve`` as
processes, ``execgate run --policy unix:///…`` against them. Approved, the command escalates;
denied, the script sees the approver's reason."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import grpc
import pytest

from execgate.v1 import approvals_pb2 as apb
from execgate.v1.approvals_pb2_grpc import ApprovalsStub

from run_support import CLI, audit_records, execgate, write_rules

pytestmark = pytest.mark.e2e

RULES = """
[[rule]]
id = "ask-touch"
program = "touch"
decision = "prompt"
execution = "unsandboxed"
justification = "touching files needs a person"
match = ["touch x"]
"""


def _wait_healthy(address: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"policy serve exited with {proc.returncode}"
        if execgate("policy", "health", "--policy", address, timeout=10).returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"policy service at {address} never became healthy")


def _stop(proc: subprocess.Popen[str]) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_prompt_approved_escalates_and_denied_gives_the_approvers_reason(short_tmp: Path):
    rules = write_rules(short_tmp / "rules.toml", RULES)
    address = f"unix://{short_tmp}/policy.sock"
    log = short_tmp / "audit.jsonl"
    work = short_tmp / "work"
    work.mkdir()
    outside = short_tmp / "outside"  # hidden by the sandbox's private /tmp: only an escalation can create it
    serve_log = (short_tmp / "serve.log").open("w")
    serve = subprocess.Popen(
        [*CLI, "policy", "serve", "--listen", address, "--rules", str(rules), "--audit-log", str(log),
         "--approver-wait", "20", "--approval-timeout", "30"],
        stdout=subprocess.DEVNULL, stderr=serve_log, text=True,
    )
    serve_log.close()
    approver = None
    try:
        _wait_healthy(address, serve)
        approver = subprocess.Popen(
            [*CLI, "approve", "--policy", address, "--name", "e2e-person"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert approver.stdin is not None
        # Answers for the two prompts in order: approve once; deny with a reason.
        approver.stdin.write("y\nn\nnot on a friday\n")
        approver.stdin.flush()

        script = f'touch {outside}; echo "first=$?"; touch {outside}-2; echo "second=$?"'
        done = execgate("run", "--policy", address, "--sandbox", "bwrap", "--cwd", str(work), "-q", "--", script)
        shown, _ = approver.communicate(timeout=30)
    finally:
        for proc in (approver, serve):
            if proc is not None:
                _stop(proc)

    assert done.stdout == "first=0\nsecond=1\n", done.stderr
    assert done.stderr == "Execution denied: not on a friday\n"
    assert done.returncode == 0
    assert outside.exists() and not Path(f"{outside}-2").exists()
    assert shown.count("rule:    ask-touch — touching files needs a person") == 2
    assert shown.count("   env:     ") == 2 and "PATH=/usr/local/sbin:" in shown  # what reaches the command
    assert shown.count("   sent\n") == 2
    touches = [r for r in audit_records(log) if r["argv"][0] == "touch"]
    assert [(r["decision"], r["rule_id"], r["approver"]) for r in touches] == [
        ("escalate", "ask-touch", "e2e-person"), ("deny", "ask-touch", "e2e-person"),
    ]
    assert touches[1]["reason"] == "not on a friday"


def test_embedded_service_approver_endpoint(short_tmp: Path):
    """``execgate run --approver-wait``: the approvals endpoint of the embedded service is printed
    (socket and 0600 token file under /tmp); an ``execgate approve`` given them answers the prompt,
    and without the token file it is refused."""
    rules = write_rules(short_tmp / "rules.toml", RULES)
    work = short_tmp / "work"
    work.mkdir()
    outside = short_tmp / "outside"
    run = subprocess.Popen(
        [*CLI, "run", "--sandbox", "bwrap", "--rules", str(rules), "--approver-wait", "30", "--cwd", str(work),
         "-q", "--", f'touch {outside}; echo "status=$?"'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    approver = None
    try:
        assert run.stderr is not None
        line = run.stderr.readline()
        prefix = "execgate: approvals: execgate approve "
        assert line.startswith(prefix), line
        words = line[len(prefix):].split()
        assert words[0] == "--policy" and words[2] == "--token-file"
        address, token_file = words[1], Path(words[3])
        assert address.startswith("unix:///tmp/execgate-") and token_file.parent == Path(address[7:]).parent
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                ApprovalsStub(channel).ListPending(apb.ListPendingRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        approver = subprocess.Popen(
            [*CLI, "approve", "--policy", address, "--token-file", str(token_file), "--name", "e2e-person"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert approver.stdin is not None
        approver.stdin.write("y\n")
        approver.stdin.flush()
        out, err = run.communicate(timeout=60)
        shown, _ = approver.communicate(timeout=30)
    finally:
        for proc in (approver, run):
            if proc is not None:
                _stop(proc)
    assert out == "status=0\n", err
    assert outside.exists()
    assert "rule:    ask-touch — touching files needs a person" in shown
    assert not token_file.exists()  # the private directory is gone with the run


JOB_RULES = """
[[rule]]
id = "ask-job"
program = "job.sh"
decision = "prompt"
execution = "unsandboxed"
justification = "jobs need a person"
"""


def test_session_grant_does_not_survive_a_rewrite_in_place(short_tmp: Path):
    """Attack D: the session's own ``./job.sh`` is approved for the session ([s]), then rewritten
    in place (``>`` keeps device and inode) to touch a file outside the sandbox, and run again.
    The approver was told no session grant is possible (the caller can change the file); the
    second run is asked again, denied, and the new content never runs."""
    rules = write_rules(short_tmp / "rules.toml", JOB_RULES)
    address = f"unix://{short_tmp}/policy.sock"
    log = short_tmp / "audit.jsonl"
    work = short_tmp / "work"
    work.mkdir()
    outside = short_tmp / "outside"  # hidden by the sandbox's private /tmp: only an escalation can create it
    serve_log = (short_tmp / "serve.log").open("w")
    serve = subprocess.Popen(
        [*CLI, "policy", "serve", "--listen", address, "--rules", str(rules), "--audit-log", str(log),
         "--approver-wait", "20", "--approval-timeout", "30"],
        stdout=subprocess.DEVNULL, stderr=serve_log, text=True,
    )
    serve_log.close()
    approver = None
    try:
        _wait_healthy(address, serve)
        approver = subprocess.Popen(
            [*CLI, "approve", "--policy", address, "--name", "e2e-person"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert approver.stdin is not None
        # For the session; then (asked again) deny with a reason.
        approver.stdin.write("s\nn\nrewritten\n")
        approver.stdin.flush()

        script = ("printf '#!/bin/sh\\necho first-job\\n' > job.sh; chmod +x job.sh; ./job.sh; echo \"first=$?\"; "
                  f"printf '#!/bin/sh\\ntouch {outside}\\necho second-job\\n' > job.sh; ./job.sh; echo \"second=$?\"")
        done = execgate("run", "--policy", address, "--sandbox", "bwrap", "--cwd", str(work), "-q", "--", script)
        try:
            shown, _ = approver.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # answers left unread (nothing asked again): it waits for a request
            approver.kill()
            shown, _ = approver.communicate()
    finally:
        for proc in (approver, serve):
            if proc is not None:
                _stop(proc)

    assert not outside.exists(), (done.stdout, shown)
    assert done.stdout == "first-job\nfirst=0\nsecond=1\n", (done.stdout, done.stderr)
    assert "Execution denied: rewritten\n" in done.stderr
    assert shown.count("rule:    ask-job — jobs need a person") == 2, shown
    assert shown.count("no session grant possible (the caller can change this file") == 2, shown
    assert "   sent (approved once: no session grant possible)\n" in shown
    jobs = [r for r in audit_records(log) if r["rule_id"] == "ask-job"]
    assert [(r["decision"], r["approver"]) for r in jobs] == [("escalate", "e2e-person"), ("deny", "e2e-person")]
    assert "no session grant" in jobs[0]["reason"]
