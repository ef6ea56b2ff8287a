"""Session grants shared through a real redis-server (docs/DESIGN.md §4, §9) follow the same rules
as in one process (``tests/policy_service/test_approvals.py``): no grant for a file the caller can
change (attack D: rewritten in place, same device and inode), and a grant covers its working
directory only. Two replicas: the prompt is raised on one and answered on the other, and the next
request goes to the replica that did not store the grant."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from execgate.v1 import approvals_pb2 as apb

from policy_fixtures import rules_file, release_grpc_objects  # noqa: F401 - fixtures
from redis_support import RedisServer
from test_approvals import Approver, determine, ls_request
from test_state_redis import replicas  # noqa: F401 - fixture

pytestmark = pytest.mark.anyio


async def test_no_shared_grant_for_a_file_the_caller_can_modify(replicas, redis_server: RedisServer) -> None:
    own = {"program": "/tmp/w/ls", "workdir": "/tmp/w"}  # caller_can_modify (identity_support)
    async with replicas(redis_server.url) as (a, b), \
            grpc.aio.insecure_channel(a.addresses[0]) as on_a, grpc.aio.insecure_channel(b.addresses[0]) as on_b:
        approver = await Approver(b, on_b, "bob").connected()
        asking = asyncio.ensure_future(determine(on_a, ls_request("s-1", "job", **own)))
        await approver.resolve(await approver.next(), apb.VERDICT_APPROVE_FOR_SESSION)
        first = await asyncio.wait_for(asking, 10)
        assert first.WhichOneof("action") == "escalate" and "no session grant" in first.reason

        for channel in (on_a, on_b):  # asked again, whichever replica decides
            asking = asyncio.ensure_future(determine(channel, ls_request("s-1", "job", **own)))
            pending = await approver.next()
            await approver.resolve(pending, apb.VERDICT_DENY, "rewritten")
            assert (await asyncio.wait_for(asking, 10)).deny.reason == "rewritten"
        await approver.close()


async def test_shared_grant_covers_its_working_directory_only(replicas, redis_server: RedisServer) -> None:
    async with replicas(redis_server.url) as (a, b), \
            grpc.aio.insecure_channel(a.addresses[0]) as on_a, grpc.aio.insecure_channel(b.addresses[0]) as on_b:
        approver = await Approver(b, on_b, "bob").connected()
        asking = asyncio.ensure_future(determine(on_a, ls_request("s-1", "-R", workdir="/srv/a")))
        await approver.resolve(await approver.next(), apb.VERDICT_APPROVE_FOR_SESSION)
        assert (await asyncio.wait_for(asking, 10)).reason == "approved for this session"
        granted = await determine(on_b, ls_request("s-1", "-R", workdir="/srv/a"))
        assert granted.reason == "approved earlier for this session" and approver.queue.empty()

        elsewhere = asyncio.ensure_future(determine(on_b, ls_request("s-1", "-R", workdir="/srv/b")))
        pending = await approver.next()
        assert pending.target.workdir == "/srv/b"
        await approver.resolve(pending, apb.VERDICT_DENY, "not there")
        assert (await asyncio.wait_for(elsewhere, 10)).deny.reason == "not there"
        await approver.close()
