"""Approvals end to end: a real approver client on the Approvals stream resolves prompts that
DetermineAction callers wait on, all over a real grpc.aio server on a Unix socket."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest

from execgate.policy_service.server import PolicyServer
from execgate.server import policy_codec as codec
from execgate.v1 import approvals_pb2 as apb
from execgate.v1 import approvals_pb2_grpc
from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc

from identity_support import system_facts
from policy_fixtures import rules_file, release_grpc_objects, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.anyio


def ls_request(session_id: str = "s-1", *args: str, program: str = "/usr/bin/ls", workdir: str = "/tmp",
               **identity: object) -> pb.DetermineActionRequest:
    """A request for ``program`` (an ``ls``, which the rules prompt for) with the facts a server
    sends for it (:func:`system_facts`: root-owned in a system directory, the caller's own under
    /tmp; ``identity`` overrides single fields, ``identity=None`` sends none)."""
    facts = None if identity.get("identity", True) is None else system_facts(program, **identity)
    return pb.DetermineActionRequest(
        session=pb.SessionContext(session_id=session_id, labels={"agent": "a"}),
        target=codec.target_to_pb(program, ["ls", *args], workdir, facts),
    )


class Approver:
    """A real approver: one WatchPending stream plus ResolveApproval calls."""

    def __init__(self, server: PolicyServer, channel: grpc.aio.Channel, name: str = "alice") -> None:
        self.server, self.name = server, name
        self.stub = approvals_pb2_grpc.ApprovalsStub(channel)
        self.stream = self.stub.WatchPending(apb.WatchPendingRequest(approver=name))
        # Cancelling a read cancels the whole call in grpc.aio, so a task drains the stream.
        self.queue: asyncio.Queue[apb.PendingApproval] = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        async for pending in self.stream:
            self.queue.put_nowait(pending)

    async def close(self) -> None:
        self.stream.cancel()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)

    async def connected(self) -> "Approver":
        for _ in range(200):
            if self.server.decisions.approvals.approvers:
                return self
            await asyncio.sleep(0.01)
        raise AssertionError("approver never subscribed")

    async def next(self, timeout: float = 5.0) -> apb.PendingApproval:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def resolve(self, pending: apb.PendingApproval, verdict: int, reason: str = "") -> None:
        await self.stub.ResolveApproval(
            apb.ResolveApprovalRequest(request_id=pending.request_id, verdict=verdict, reason=reason, approver=self.name),
            timeout=5,
        )


async def determine(channel: grpc.aio.Channel, request: pb.DetermineActionRequest) -> pb.Decision:
    stub = policy_pb2_grpc.EscalationPolicyStub(channel)
    return (await stub.DetermineAction(request, timeout=30)).decision


async def test_approve_once_then_deny_with_reason(service, short_tmp: Path) -> None:
    audit = short_tmp / "audit.jsonl"
    async with service(audit_log=audit) as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        approver = await Approver(server, channel).connected()
        asking = asyncio.ensure_future(determine(channel, ls_request("s-1", "-l")))
        pending = await approver.next()
        assert pending.target.program == "/usr/bin/ls" and list(pending.target.argv) == ["ls", "-l"]
        assert pending.session.labels["agent"] == "a" and pending.rule_id == "ls-prompt"
        assert pending.reason == "listing needs a look" and 0 < pending.seconds_left <= 60
        listed = await approver.stub.ListPending(apb.ListPendingRequest(), timeout=5)
        assert [p.request_id for p in listed.pending] == [pending.request_id]
        await approver.resolve(pending, apb.VERDICT_APPROVE_ONCE)
        approved = await asking
        assert approved.WhichOneof("action") == "escalate" and approved.rule_id == "ls-prompt"

        # Approve-once grants nothing for later requests: the same command asks again.
        asking = asyncio.ensure_future(determine(channel, ls_request("s-1", "-l")))
        pending = await approver.next()
        await approver.resolve(pending, apb.VERDICT_DENY, "not now")
        denied = await asking
        assert denied.WhichOneof("action") == "deny" and denied.deny.reason == "not now"
        # Answering twice is NOT_FOUND.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await approver.resolve(pending, apb.VERDICT_APPROVE_ONCE)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        await approver.close()
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(line["decision"], line["approver"]) for line in lines] == [("escalate", "alice"), ("deny", "alice")]


async def test_silence_times_out(service) -> None:
    async with service(approval_timeout_s=0.5) as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        approver = await Approver(server, channel).connected()
        started = time.monotonic()
        asking = asyncio.ensure_future(determine(channel, ls_request()))
        await approver.next()
        decision = await asking
        elapsed = time.monotonic() - started
        await approver.close()
    assert decision.WhichOneof("action") == "deny" and "timed out" in decision.deny.reason
    assert 0.45 <= elapsed < 3.0


async def test_client_deadline_caps_the_wait(service) -> None:
    """A caller with a short deadline gets the timed-out denial before its deadline expires."""
    async with service(approval_timeout_s=60) as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        approver = await Approver(server, channel).connected()
        stub = policy_pb2_grpc.EscalationPolicyStub(channel)
        response = await stub.DetermineAction(ls_request(), timeout=1.0)
        await approver.close()
    assert "timed out" in response.decision.deny.reason


async def test_approve_for_session(service) -> None:
    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        approver = await Approver(server, channel).connected()
        asking = asyncio.ensure_future(determine(channel, ls_request("s-1", "/etc")))
        await approver.resolve(await approver.next(), apb.VERDICT_APPROVE_FOR_SESSION)
        assert (await asking).WhichOneof("action") == "escalate"

        again = await determine(channel, ls_request("s-1", "/etc"))
        assert again.WhichOneof("action") == "escalate" and again.approver == "alice"
        assert again.reason == "approved earlier for this session"
        assert not (await approver.stub.ListPending(apb.ListPendingRequest(), timeout=5)).pending
        with pytest.raises(asyncio.TimeoutError):
            await approver.next(timeout=0.3)  # no new pending request was published

        # The grant covers only that session, that exact argv and that working directory.
        for request in (ls_request("s-2", "/etc"), ls_request("s-1", "/root"),
                        ls_request("s-1", "/etc", workdir="/srv")):
            asking = asyncio.ensure_future(determine(channel, request))
            pending = await approver.next()
            assert pending.session.session_id == request.session.session_id
            await approver.resolve(pending, apb.VERDICT_DENY)
            assert (await asking).WhichOneof("action") == "deny"
        await approver.close()


async def test_no_approver_denies_at_once(service) -> None:
    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        started = time.monotonic()
        decision = await determine(channel, ls_request())
        elapsed = time.monotonic() - started
    assert decision.WhichOneof("action") == "deny" and "no approver" in decision.deny.reason
    assert elapsed < 1.0


async def test_approver_wait_lets_a_late_approver_answer(service) -> None:
    async with service(approver_wait_s=5) as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        asking = asyncio.ensure_future(determine(channel, ls_request()))
        await asyncio.sleep(0.2)
        approver = await Approver(server, channel, name="late").connected()
        await approver.resolve(await approver.next(), apb.VERDICT_APPROVE_ONCE)
        decision = await asking
        await approver.close()
    assert decision.WhichOneof("action") == "escalate" and decision.approver == "late"


async def test_unspecified_verdict_is_invalid(service) -> None:
    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        stub = approvals_pb2_grpc.ApprovalsStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ResolveApproval(apb.ResolveApprovalRequest(request_id="x"), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_grpc_policy_waits_past_its_ordinary_deadline_for_a_prompt(service) -> None:
    """The service's `execgate-prompt` metadata lets GrpcPolicy wait beyond timeout_s, up to
    prompt_timeout_s; a silent approver then yields a policy denial (not an error) before it."""
    from execgate.server.grpc_policy import GrpcPolicy
    from execgate.server.policy import SessionContext

    session = SessionContext("s-7", {"agent": "slow"})
    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        approver = await Approver(server, channel).connected()
        policy = GrpcPolicy(server.addresses[0], timeout_s=0.3, prompt_timeout_s=10)
        asking = asyncio.ensure_future(policy.determine_action("/usr/bin/ls", ["ls", "-x"], "/tmp", session))
        pending = await approver.next()
        await asyncio.sleep(1.0)  # well past timeout_s
        await approver.resolve(pending, apb.VERDICT_APPROVE_ONCE)
        approved = await asking

        short = GrpcPolicy(server.addresses[0], timeout_s=0.3, prompt_timeout_s=1.5)
        started = time.monotonic()
        silent = await short.determine_action("/usr/bin/ls", ["ls", "-y"], "/tmp", session)
        elapsed = time.monotonic() - started
        await policy.aclose()
        await short.aclose()
        await approver.close()
    assert approved.action == "escalate" and not approved.error
    assert silent.action == "deny" and not silent.error and "timed out" in (silent.reason or "")
    assert 1.0 <= elapsed < 2.5


async def test_session_grant_never_covers_a_file_the_caller_can_modify(service) -> None:
    """Attack D: approved for the session, the caller's own ``./job.sh`` is rewritten in place
    (same device and inode) and run again. The approval must not cover it: "for the session"
    counts as once, the approver is told so with the request, and the next exec asks again."""
    from execgate.policy_service.approver import describe

    own = {"program": "/tmp/w/ls", "workdir": "/tmp/w"}  # caller_can_modify (identity_support)
    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        approver = await Approver(server, channel).connected()
        asking = asyncio.ensure_future(determine(channel, ls_request("s-1", "job", **own)))
        pending = await approver.next()
        assert pending.target.identity.caller_can_modify
        shown = describe(pending)
        assert "no session grant possible (the caller can change this file" in shown, shown
        assert "[s] approves this request once" in shown
        await approver.resolve(pending, apb.VERDICT_APPROVE_FOR_SESSION)
        first = await asking
        assert first.WhichOneof("action") == "escalate" and first.approver == "alice"
        assert "approved once: no session grant, the caller can change this file" in first.reason

        # The very same request (same device and inode: a rewrite in place) asks again.
        asking = asyncio.ensure_future(determine(channel, ls_request("s-1", "job", **own)))
        again = await approver.next()
        assert list(again.target.argv) == ["ls", "job"]
        await approver.resolve(again, apb.VERDICT_DENY, "rewritten")
        denied = await asking
        assert denied.WhichOneof("action") == "deny" and denied.deny.reason == "rewritten"

        # No identity at all (an older server): no grant either.
        asking = asyncio.ensure_future(determine(channel, ls_request("s-1", "x", identity=None)))
        pending = await approver.next()
        assert "no session grant possible (the file was not identified)" in describe(pending)
        await approver.resolve(pending, apb.VERDICT_APPROVE_FOR_SESSION)
        assert (await asking).WhichOneof("action") == "escalate"
        asking = asyncio.ensure_future(determine(channel, ls_request("s-1", "x", identity=None)))
        await approver.resolve(await approver.next(), apb.VERDICT_DENY)
        assert (await asking).WhichOneof("action") == "deny"
        await approver.close()


async def test_session_grant_covers_a_root_owned_file_in_that_directory_only(service, short_tmp: Path) -> None:
    """A root-owned system file the caller cannot change keeps its grant (no note shown); the same
    command in another working directory asks again (an escalation's effect depends on it)."""
    from execgate.policy_service.approver import describe

    audit = short_tmp / "audit.jsonl"
    async with service(audit_log=audit) as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        approver = await Approver(server, channel).connected()
        asking = asyncio.ensure_future(determine(channel, ls_request("s-1", "-R", workdir="/srv/a")))
        pending = await approver.next()
        assert not pending.target.identity.caller_can_modify and "no session grant" not in describe(pending)
        await approver.resolve(pending, apb.VERDICT_APPROVE_FOR_SESSION)
        assert (await asking).reason == "approved for this session"
        granted = await determine(channel, ls_request("s-1", "-R", workdir="/srv/a"))
        assert granted.WhichOneof("action") == "escalate" and granted.reason == "approved earlier for this session"
        assert approver.queue.empty()

        elsewhere = asyncio.ensure_future(determine(channel, ls_request("s-1", "-R", workdir="/srv/b")))
        pending = await approver.next()
        assert pending.target.workdir == "/srv/b"
        await approver.resolve(pending, apb.VERDICT_DENY, "not there")
        assert (await elsewhere).deny.reason == "not there"
        await approver.close()
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [line["decision"] for line in lines] == ["escalate", "escalate", "deny"]
