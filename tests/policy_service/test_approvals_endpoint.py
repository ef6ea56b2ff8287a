"""The approvals endpoint and its own credential (docs/DESIGN.md §8), over real grpc.aio servers:
the decision token never authorises Approvals once an approvals token is set; a separate
approvals listener serves nothing else; a broker that refuses prompts denies them with its reason;
``policy serve`` refuses approvals settings that a decision-token holder could use."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
import pytest

from execgate.policy_service.server import serve_embedded
from execgate.v1 import approvals_pb2 as apb
from execgate.v1 import approvals_pb2_grpc

from policy_fixtures import rules_file, release_grpc_objects, service  # noqa: F401 - fixtures
from test_approvals import Approver, determine, ls_request

pytestmark = pytest.mark.anyio

CLI = (sys.executable, "-m", "execgate.server.cli")


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def list_code(channel: grpc.aio.Channel, metadata: tuple = ()) -> grpc.StatusCode:
    try:
        await approvals_pb2_grpc.ApprovalsStub(channel).ListPending(apb.ListPendingRequest(), metadata=metadata, timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def decide_code(channel: grpc.aio.Channel, metadata: tuple = ()) -> grpc.StatusCode:
    from execgate.v1 import policy_pb2_grpc

    try:
        await policy_pb2_grpc.EscalationPolicyStub(channel).DetermineAction(ls_request("s", "-l"), metadata=metadata,
                                                                             timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_decision_token_never_authorises_approvals_on_one_listener(service) -> None:
    async with service(token="decide", approvals_token="approve") as server, \
            grpc.aio.insecure_channel(server.addresses[0]) as channel:
        assert server.approvals_address == server.addresses[0]
        assert await list_code(channel, bearer("decide")) == grpc.StatusCode.UNAUTHENTICATED
        assert await list_code(channel) == grpc.StatusCode.UNAUTHENTICATED
        assert await list_code(channel, bearer("approve")) == grpc.StatusCode.OK
        assert await decide_code(channel, bearer("approve")) == grpc.StatusCode.UNAUTHENTICATED
        assert await decide_code(channel, bearer("decide")) == grpc.StatusCode.OK


async def test_separate_approvals_listener(service, short_tmp: Path) -> None:
    approvals_address = f"unix://{short_tmp / 'a.sock'}"
    async with service(token="decide", approvals_address=approvals_address, approvals_token="approve") as server, \
            grpc.aio.insecure_channel(server.addresses[0]) as decisions, \
            grpc.aio.insecure_channel(approvals_address) as approvals:
        assert server.approvals_address == approvals_address
        # The decision endpoint does not serve Approvals at all, whatever the token.
        for token in ("decide", "approve"):
            assert await list_code(decisions, bearer(token)) == grpc.StatusCode.UNIMPLEMENTED
        assert await decide_code(approvals, bearer("approve")) == grpc.StatusCode.UNIMPLEMENTED
        assert await list_code(approvals, bearer("decide")) == grpc.StatusCode.UNAUTHENTICATED
        # The real flow across both: a prompt on one, answered on the other.
        stub = approvals_pb2_grpc.ApprovalsStub(approvals)
        stream = stub.WatchPending(apb.WatchPendingRequest(approver="bob"), metadata=bearer("approve"))
        from execgate.v1 import policy_pb2_grpc

        # The stream starts when the service has it, not when the call returns: a prompt asked
        # before that finds no approver and is denied at once (a race CI lost under load).
        async with asyncio.timeout(10):
            while not server.decisions.approvals.approvers:
                await asyncio.sleep(0.01)

        asked = asyncio.ensure_future(policy_pb2_grpc.EscalationPolicyStub(decisions).DetermineAction(
            ls_request("s", "-a"), metadata=bearer("decide"), timeout=30))
        pending = await asyncio.wait_for(stream.read(), 10)
        await stub.ResolveApproval(apb.ResolveApprovalRequest(request_id=pending.request_id,
                                                              verdict=apb.VERDICT_APPROVE_ONCE, approver="bob"),
                                   metadata=bearer("approve"), timeout=5)
        decision = (await asyncio.wait_for(asked, 10)).decision
        stream.cancel()
    assert decision.WhichOneof("action") == "escalate" and decision.approver == "bob"


async def test_refusing_broker_denies_even_with_an_approver(service) -> None:
    async with service(no_approver_reason="no isolation here") as server, \
            grpc.aio.insecure_channel(server.addresses[0]) as channel:
        approver = await Approver(server, channel).connected()
        decision = await determine(channel, ls_request("s", "-R"))
        await approver.close()
    assert decision.WhichOneof("action") == "deny" and decision.reason == "no isolation here"
    assert approver.queue.empty()


async def test_embedded_without_approvals_serves_no_approvals(rules_file: Path) -> None:
    async with serve_embedded([rules_file]) as embedded, grpc.aio.insecure_channel(embedded.address) as channel:
        assert await list_code(channel, bearer(embedded.token)) == grpc.StatusCode.UNIMPLEMENTED
        assert await decide_code(channel) == grpc.StatusCode.UNAUTHENTICATED


async def test_embedded_approvals_token_is_its_own(rules_file: Path) -> None:
    async with serve_embedded([rules_file], approvals=True) as embedded, \
            grpc.aio.insecure_channel(embedded.approvals_address or "") as channel:
        token = Path(embedded.approvals_token_file or "").read_text().strip()
        assert await list_code(channel, bearer(embedded.token)) == grpc.StatusCode.UNAUTHENTICATED
        assert await list_code(channel, bearer(token)) == grpc.StatusCode.OK


@pytest.mark.parametrize("listen, same", [("127.0.0.1:0", False), (None, True)])
async def test_serve_refuses_unsafe_approvals_options(short_tmp: Path, rules_file: Path, listen, same) -> None:
    decision = short_tmp / "d.token"
    decision.write_text("one\n")
    extra = ["--token-file", str(decision)]
    if listen:
        extra += ["--approvals-listen", listen]
    if same:
        extra += ["--approvals-token-file", str(decision)]
    proc = await asyncio.create_subprocess_exec(
        *CLI, "policy", "serve", "--listen", f"unix://{short_tmp / 's'}", "--rules", str(rules_file), *extra,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert (b"must hold a different token" if same else b"needs --approvals-token-file") in err


def ls_with_env(env: dict[str, str]):
    request = ls_request("s-env", "-1")
    request.env.update(env)
    return request


async def test_approver_sees_the_env_and_a_session_grant_covers_only_it(service) -> None:
    from execgate.policy_service.approver import describe
    from execgate.policy_service.envclean import SAFE_PATH

    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        approver = await Approver(server, channel).connected()
        first = asyncio.ensure_future(determine(channel, ls_with_env(
            {"LANG": "C.UTF-8", "HOME": "/x", "LD_PRELOAD": "/x/e.so", "PATH": "/x/bin"})))
        pending = await approver.next()
        assert dict(pending.env) == {"LANG": "C.UTF-8", "PATH": SAFE_PATH}
        assert f"env:     LANG=C.UTF-8 PATH={SAFE_PATH}" in describe(pending)
        await approver.resolve(pending, apb.VERDICT_APPROVE_FOR_SESSION)
        assert (await first).WhichOneof("action") == "escalate"
        # Same env reaching the command (HOME differs, but HOME never reaches it): granted.
        again = await determine(channel, ls_with_env({"LANG": "C.UTF-8", "HOME": "/elsewhere"}))
        assert again.WhichOneof("action") == "escalate" and approver.queue.empty()
        # A variable that reaches the command differs: asked again.
        other = asyncio.ensure_future(determine(channel, ls_with_env({"LANG": "de_DE.UTF-8"})))
        asked = await approver.next()
        assert dict(asked.env) == {"LANG": "de_DE.UTF-8", "PATH": SAFE_PATH}
        await approver.resolve(asked, apb.VERDICT_DENY, "not that one")
        assert (await other).reason == "not that one"
        await approver.close()


async def test_serve_with_a_separate_approvals_listener(short_tmp: Path, rules_file: Path) -> None:
    """``policy serve --approvals-listen … --approvals-token-file …`` as a real process."""
    from test_cli_serve import serve_process

    token_file = short_tmp / "a.token"
    token_file.write_text("approver-secret\n")
    approvals = f"unix://{short_tmp / 'a.sock'}"
    async with serve_process(short_tmp, rules_file, "--approvals-listen", approvals,
                             "--approvals-token-file", str(token_file)) as (_, address):
        async with grpc.aio.insecure_channel(address) as decisions, grpc.aio.insecure_channel(approvals) as channel:
            assert await decide_code(decisions) == grpc.StatusCode.OK
            assert await list_code(decisions, bearer("approver-secret")) == grpc.StatusCode.UNIMPLEMENTED
            assert await list_code(channel) == grpc.StatusCode.UNAUTHENTICATED
            assert await list_code(channel, bearer("approver-secret")) == grpc.StatusCode.OK
