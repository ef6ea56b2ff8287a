"""``execgate approve`` as a real process with piped stdin, answering prompts of a real service."""

from __future__ import annotations

import asyncio
import sys

import grpc
import pytest

from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc

from policy_fixtures import rules_file, release_grpc_objects, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.anyio


def ls(*args: str) -> pb.DetermineActionRequest:
    return pb.DetermineActionRequest(
        session=pb.SessionContext(session_id="s-9", labels={"team": "blue"}),
        target=pb.ExecTarget(program="/usr/bin/ls", argv=["ls", *args], workdir="/srv"),
    )



async def _start_approver(server) -> asyncio.subprocess.Process:
    """`execgate approve --name bot` against ``server``, once the service sees it connected."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "execgate.server.cli", "approve", "--policy", server.addresses[0], "--name", "bot",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    for _ in range(500):
        if server.decisions.approvals.approvers:
            break
        await asyncio.sleep(0.02)
    return proc


async def test_piped_approver(service) -> None:
    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        proc = await _start_approver(server)
        try:
            stub = policy_pb2_grpc.EscalationPolicyStub(channel)
            asking = asyncio.ensure_future(stub.DetermineAction(ls("-a"), timeout=20))
            proc.stdin.write(b"maybe\ny\n")
            first = (await asking).decision
            asking = asyncio.ensure_future(stub.DetermineAction(ls("-b"), timeout=20))
            proc.stdin.write(b"n\nnot on friday\n")
            second = (await asking).decision
            proc.stdin.close()
            out, err = await asyncio.wait_for(proc.communicate(), 20)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert first.WhichOneof("action") == "escalate" and first.approver == "bot"
    assert second.WhichOneof("action") == "deny" and second.deny.reason == "not on friday"
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    for shown in ("/usr/bin/ls", "ls -a", "/srv", "s-9", "team=blue", "ls-prompt", "please answer y, s or n"):
        assert shown in text, (shown, text)


async def test_piped_approver_exits_when_input_ends_mid_answer(service) -> None:
    """`printf 'n\\n' | execgate approve` while two prompts come: the first is denied (no reason
    given before the end of input), the approver then exits at once instead of waiting forever on
    the second, which is denied by its own deadline."""
    async with service(approval_timeout_s=3.0) as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        proc = await _start_approver(server)
        try:
            stub = policy_pb2_grpc.EscalationPolicyStub(channel)
            first = asyncio.ensure_future(stub.DetermineAction(ls("-a"), timeout=20))
            second = asyncio.ensure_future(stub.DetermineAction(ls("-b"), timeout=20))
            proc.stdin.write(b"n\n")
            proc.stdin.close()
            out, err = await asyncio.wait_for(proc.communicate(), 15)
            answers = [(await first).decision, (await second).decision]
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert [a.WhichOneof("action") for a in answers] == ["deny", "deny"]
    assert sum(a.approver == "bot" for a in answers) == 1


async def test_unreachable_service_is_an_error_even_with_no_input(short_tmp) -> None:
    """Issue #12 item 7: `execgate approve </dev/null` against no service exits 1 with the cause,
    instead of 0 as though it had finished its work."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "execgate.server.cli", "approve", "--policy", f"unix://{short_tmp}/none.sock",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1, (out, err)
    assert b"execgate approve: UNAVAILABLE" in err and b"watching" not in out


async def test_wrong_credential_is_an_error_even_with_no_input(service, short_tmp) -> None:
    token = short_tmp / "wrong.token"
    token.write_text("not-the-token-of-this-service\n")
    async with service(token="the-real-token-of-this-service") as server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "execgate.server.cli", "approve", "--policy", server.addresses[0],
            "--token-file", str(token),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1, (out, err)
    assert b"UNAUTHENTICATED" in err


async def test_piped_approver_shows_a_spoofing_request_escaped(service) -> None:
    """Attack C through the CLI: the reviewer's working directory (cursor up, erase the line,
    redraw a harmless argv and cwd) and bidi overrides in argv reach a real ``execgate approve``
    over a real service. Its output holds no control character, shows each escaped, flags the
    request, and keeps the real argv on its own line."""
    from test_approvals_display import SPOOF_DIR

    request = pb.DetermineActionRequest(
        session=pb.SessionContext(session_id="s-9", labels={"team": "blue"}),
        target=pb.ExecTarget(program="/usr/bin/ls", argv=["ls", "-exec", "./pwned\u202e;", "\x9b2J"],
                             workdir=f"/srv/{SPOOF_DIR}"),
    )
    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        proc = await _start_approver(server)
        try:
            asking = asyncio.ensure_future(policy_pb2_grpc.EscalationPolicyStub(channel).DetermineAction(
                request, timeout=20))
            proc.stdin.write(b"n\nspoofed\n")
            denied = (await asking).decision
            proc.stdin.close()
            out, err = await asyncio.wait_for(proc.communicate(), 20)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert denied.deny.reason == "spoofed"
    text = out.decode()
    bad = sorted({hex(ord(c)) for c in text if not c.isprintable() and c != "\n"})
    assert not bad, (bad, text)
    assert "   WARNING: this request contains control characters, shown escaped" in text
    assert "   argv:    ls -exec './pwned\\u202e;' '\\x9b2J'\n" in text
    assert ("   cwd:     /srv/\\x1b[1A\\x0d\\x1b[2K   argv:    find . -name '*.log' -mtime +7\\x0a\\x0d\\x1b[2K"
            "   cwd:     /tmp/w4\n") in text
