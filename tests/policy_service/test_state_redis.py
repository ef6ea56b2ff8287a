"""Shared state in a real redis-server (docs/DESIGN.md §9): two policy services in this process,
each with ``state=redis://…``, over real grpc.aio servers on Unix sockets. A prompt raised on one
is listed and answered on the other; an approve-for-session grant made through one covers the
same request on the other; every decision reaches the shared audit stream and the local file,
with ids unique across both; with Redis gone, health says NOT_SERVING and decisions fail closed,
then both recover by themselves; a Redis password works and is never logged."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from pathlib import Path
from typing import AsyncIterator

import grpc
import pytest

from execgate.server import policy_codec as codec
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from execgate.policy_service import rules as rules_api
from execgate.policy_service.server import PolicyServer, running_service
from execgate.v1 import approvals_pb2 as apb
from execgate.v1 import approvals_pb2_grpc
from execgate.v1 import policy_pb2 as pb

from policy_fixtures import rules_file, release_grpc_objects  # noqa: F401 - fixtures
from identity_support import system_facts
from redis_support import RedisServer
from test_approvals import Approver, determine, ls_request

pytestmark = pytest.mark.anyio


def echo_request(session_id: str = "s-1") -> pb.DetermineActionRequest:
    return pb.DetermineActionRequest(
        session=pb.SessionContext(session_id=session_id),
        # With the facts a server sends for a root-owned system file: basename rules trust only those.
        target=codec.target_to_pb("/usr/bin/echo", ["echo", "hi"], "/tmp", system_facts("/usr/bin/echo")),
    )


@pytest.fixture
def replicas(short_tmp: Path, rules_file: Path):
    """Factory: ``async with replicas(url, n, **kw) as servers`` — n services sharing ``url``."""

    @contextlib.asynccontextmanager
    async def start(url: str, n: int = 2, **kw) -> AsyncIterator[list[PolicyServer]]:
        async with contextlib.AsyncExitStack() as stack:
            servers = []
            for i in range(n):
                store = rules_api.RulesStore([rules_file])
                servers.append(await stack.enter_async_context(running_service(
                    store, address=f"unix://{short_tmp / f'p{i}.sock'}", state=url,
                    audit_log=short_tmp / f"audit{i}.jsonl", grace_s=0.2, **kw)))
            yield servers

    return start


async def until(predicate, what: str, timeout_s: float = 15.0) -> None:
    """Wait (polling every 0.05 s) until ``await predicate()`` is true, or fail naming ``what``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def health(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    return reply.status


async def test_prompt_raised_on_a_is_listed_and_answered_on_b(replicas, redis_server: RedisServer) -> None:
    async with replicas(redis_server.url) as (a, b), \
            grpc.aio.insecure_channel(a.addresses[0]) as on_a, grpc.aio.insecure_channel(b.addresses[0]) as on_b:
        approver = await Approver(b, on_b, "bob").connected()
        asking = asyncio.ensure_future(determine(on_a, ls_request("s-1", "-l")))
        pending = await approver.next()
        assert list(pending.target.argv) == ["ls", "-l"] and pending.session.session_id == "s-1"
        assert pending.rule_id == "ls-prompt" and pending.seconds_left > 0
        listed = await approvals_pb2_grpc.ApprovalsStub(on_a).ListPending(apb.ListPendingRequest(), timeout=5)
        assert [p.request_id for p in listed.pending] == [pending.request_id]
        assert a.decisions.approvals.pending_count() == 1 and b.decisions.approvals.pending_count() == 0
        await approver.resolve(pending, apb.VERDICT_APPROVE_ONCE)
        decision = await asyncio.wait_for(asking, 10)
        assert decision.WhichOneof("action") == "escalate" and decision.approver == "bob"
        # Answered: gone everywhere, and a second answer is refused on either replica.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await approver.resolve(pending, apb.VERDICT_DENY)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        listed = await approvals_pb2_grpc.ApprovalsStub(on_a).ListPending(apb.ListPendingRequest(), timeout=5)
        assert list(listed.pending) == []
        await approver.close()


async def test_session_grant_made_on_b_covers_the_request_on_a(replicas, redis_server: RedisServer) -> None:
    async with replicas(redis_server.url) as (a, b), \
            grpc.aio.insecure_channel(a.addresses[0]) as on_a, grpc.aio.insecure_channel(b.addresses[0]) as on_b:
        approver = await Approver(a, on_a, "alice").connected()
        asking = asyncio.ensure_future(determine(on_b, ls_request("s-9", "-a")))
        await approver.resolve(await approver.next(), apb.VERDICT_APPROVE_FOR_SESSION)
        assert (await asyncio.wait_for(asking, 10)).WhichOneof("action") == "escalate"
        await approver.close()
        await until(lambda: _no_approvers(a), "the approver to leave")
        # No approver anywhere now: only the shared grant can escalate these.
        again = await determine(on_a, ls_request("s-9", "-a"))
        assert again.WhichOneof("action") == "escalate" and again.approver == "alice"
        other_session = await determine(on_b, ls_request("s-10", "-a"))
        assert other_session.WhichOneof("action") == "deny" and "no approver" in other_session.deny.reason


async def _no_approvers(server: PolicyServer) -> bool:
    return await server.decisions.approvals.approvers_anywhere() == 0


async def test_audit_stream_shared_and_decision_ids_unique(replicas, redis_server: RedisServer,
                                                           short_tmp: Path) -> None:
    async with replicas(redis_server.url) as (a, b), \
            grpc.aio.insecure_channel(a.addresses[0]) as on_a, grpc.aio.insecure_channel(b.addresses[0]) as on_b:
        ids = [(await determine(channel, echo_request(f"s-{i}"))).decision_id
               for i in range(10) for channel in (on_a, on_b)]
    assert len(set(ids)) == 20
    client = aioredis.from_url(redis_server.url)
    try:
        entries = await client.xrange("execgate:audit", "-", "+")
    finally:
        await client.aclose()
    shared = [json.loads(fields[b"record"]) for _, fields in entries]
    assert [r["decision_id"] for r in shared] == ids  # one entry each, in the order decided
    assert {r["decision"] for r in shared} == {"run"} and {r["rule_id"] for r in shared} == {"echo-run"}
    local = [json.loads(line)["decision_id"]
             for i in (0, 1) for line in (short_tmp / f"audit{i}.jsonl").read_text().splitlines()]
    assert sorted(local) == sorted(ids)


async def test_expired_prompt_is_denied_and_not_found_elsewhere(replicas, redis_server: RedisServer) -> None:
    async with replicas(redis_server.url, approval_timeout_s=0.6) as (a, b), \
            grpc.aio.insecure_channel(a.addresses[0]) as on_a, grpc.aio.insecure_channel(b.addresses[0]) as on_b:
        approver = await Approver(b, on_b, "bob").connected()
        asking = asyncio.ensure_future(determine(on_a, ls_request("s-1", "-R")))
        pending = await approver.next()
        decision = await asyncio.wait_for(asking, 10)
        assert decision.WhichOneof("action") == "deny" and "timed out" in decision.deny.reason
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await approver.resolve(pending, apb.VERDICT_APPROVE_ONCE)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        await approver.close()


async def test_redis_gone_fails_closed_then_recovers(replicas, redis_server: RedisServer) -> None:
    async with replicas(redis_server.url, n=1) as (a,), grpc.aio.insecure_channel(a.addresses[0]) as channel:
        assert await health(channel) == health_pb2.HealthCheckResponse.SERVING
        redis_server.kill()
        await until(lambda: _status_is(channel, health_pb2.HealthCheckResponse.NOT_SERVING), "NOT_SERVING")
        denied = await determine(channel, echo_request())
        assert denied.WhichOneof("action") == "deny"
        assert "Redis at redis://127.0.0.1" in denied.deny.reason and "failing closed" in denied.deny.reason
        redis_server.start()
        await until(lambda: _status_is(channel, health_pb2.HealthCheckResponse.SERVING), "SERVING again")
        assert (await determine(channel, echo_request())).WhichOneof("action") == "run"


async def _status_is(channel: grpc.aio.Channel, status: int) -> bool:
    return await health(channel) == status


async def test_password_works_and_is_never_logged(replicas, short_tmp: Path, caplog) -> None:
    secret = "s3cret-Pa55word-xyz"
    server = RedisServer(short_tmp, password=secret)
    server.start()
    caplog.set_level(logging.DEBUG)
    try:
        async with replicas(server.url, n=1) as (a,), grpc.aio.insecure_channel(a.addresses[0]) as channel:
            assert await health(channel) == health_pb2.HealthCheckResponse.SERVING
            assert (await determine(channel, echo_request())).WhichOneof("action") == "run"
        wrong = server.url.replace(secret, "wrong-" + secret[::-1])
        async with replicas(wrong, n=1) as (a,), grpc.aio.insecure_channel(a.addresses[0]) as channel:
            assert await health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
            denied = await determine(channel, echo_request())
            assert denied.WhichOneof("action") == "deny" and "Redis at redis://127.0.0.1" in denied.deny.reason
            assert secret[::-1] not in denied.deny.reason
    finally:
        server.kill()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Redis at redis://127.0.0.1" in logged
    assert secret not in logged and secret[::-1] not in logged


CLI = (sys.executable, "-m", "execgate.server.cli")


async def test_cli_state_password_file_serves_and_never_prints_it(short_tmp: Path, rules_file: Path) -> None:
    secret = "file-Pa55word-abc"
    server = RedisServer(short_tmp, password=secret)
    server.start()
    password_file = short_tmp / "redis.password"
    password_file.write_text(secret + "\n")
    address = f"unix://{short_tmp / 'cli.sock'}"
    url = f"redis://127.0.0.1:{server.port}/0"
    proc = await asyncio.create_subprocess_exec(
        *CLI, "policy", "serve", "--listen", address, "--rules", str(rules_file), "--state", url,
        "--state-password-file", str(password_file), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            await until(lambda: _answers(channel), "the service to answer SERVING", timeout_s=30)
            assert (await determine(channel, echo_request())).WhichOneof("action") == "run"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        server.kill()
    assert proc.returncode == 0
    assert f"shared state: Redis at {url}".encode() in err and secret.encode() not in err


async def _answers(channel: grpc.aio.Channel) -> bool:
    try:
        return await health(channel) == health_pb2.HealthCheckResponse.SERVING
    except grpc.aio.AioRpcError:
        return False


@pytest.mark.parametrize("args, message", [
    (("--state", "http://127.0.0.1:6379"), b"is not a redis://, rediss:// or unix:// URL"),
    (("--state-password-file", "/nonexistent"), b"--state-password-file needs --state"),
    (("--state", "redis://127.0.0.1:1/0", "--audit-stream-maxlen", "0"), b"--audit-stream-maxlen must be at least 1"),
])
async def test_cli_refuses_bad_state_options(short_tmp: Path, rules_file: Path, args, message) -> None:
    proc = await asyncio.create_subprocess_exec(
        *CLI, "policy", "serve", "--listen", f"unix://{short_tmp / 'x.sock'}", "--rules", str(rules_file), *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and message in err, err


async def test_a_prompt_whose_caller_left_is_withdrawn_everywhere(replicas, redis_server: RedisServer) -> None:
    async with replicas(redis_server.url) as (a, b), \
            grpc.aio.insecure_channel(a.addresses[0]) as on_a, grpc.aio.insecure_channel(b.addresses[0]) as on_b:
        approver = await Approver(b, on_b, "bob").connected()
        asking = asyncio.ensure_future(determine(on_a, ls_request("s-1", "-t")))
        pending = await approver.next()
        asking.cancel()
        stub = approvals_pb2_grpc.ApprovalsStub(on_b)

        async def withdrawn() -> bool:
            return not (await stub.ListPending(apb.ListPendingRequest(), timeout=5)).pending

        await until(withdrawn, "the request to leave ListPending")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await approver.resolve(pending, apb.VERDICT_APPROVE_ONCE)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        await approver.close()
