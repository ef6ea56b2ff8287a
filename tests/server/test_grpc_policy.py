"""GrpcPolicy against real grpc.aio servers on Unix sockets: round trips, and fail-closed denials
for a service that is absent, killed, hanging, raising or answering garbage."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Sequence

import grpc
import pytest

from execgate.policy_service.envclean import SAFE_PATH
from execgate.policy_service.server import running_service
from execgate.server.grpc_policy import GrpcPolicy, PolicyError
from execgate.server.policy import Execution, Permissions, Policy, SessionContext
from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _release_grpc_objects():
    """Collect this test's grpc objects now: their sockets close only when they are collected,
    and later tests count the process's open fds."""
    yield
    gc.collect()

SESSION = SessionContext("s-1", {"agent": "a"}, Permissions(writable_roots=("/tmp",)))
TIMEOUT = 0.5


@dataclass
class _Eval:
    decision: str
    rule: object | None = None
    execution: Execution | None = None
    reason: str = "fixed"
    allow_env: tuple[str, ...] = ()


class FixedRules:
    """A rules source (the service's injection point) that answers by basename."""

    current = property(lambda self: self)

    def evaluate(self, program: str, argv: Sequence[str], facts: object = None) -> _Eval:
        return _Eval({"rm": "deny", "env": "escalate"}.get(program.rsplit("/", 1)[-1], "run"))


class Misbehaving(policy_pb2_grpc.EscalationPolicyServicer):
    """A servicer that hangs, raises or answers garbage, as told."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def _misbehave(self, empty):
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "raise":
            raise RuntimeError("rules exploded")
        return empty

    async def DetermineAction(self, request, context):  # noqa: N802
        return await self._misbehave(pb.DetermineActionResponse(decision=pb.Decision(rule_id="r")))

    async def PrepareEscalatedExec(self, request, context):  # noqa: N802
        return await self._misbehave(pb.PrepareEscalatedExecResponse())


def _bytes_handler(method: str) -> grpc.GenericRpcHandler:
    """Answers every call with bytes that are not a valid protobuf message."""

    async def answer(request, context):
        return b"\xff\xff\xff"

    handler = grpc.unary_unary_rpc_method_handler(answer, request_deserializer=None, response_serializer=None)
    return grpc.method_handlers_generic_handler("execgate.v1.EscalationPolicy",
                                                {"DetermineAction": handler, "PrepareEscalatedExec": handler})


@contextlib.asynccontextmanager
async def misbehaving(path: Path, mode: str) -> AsyncIterator[str]:
    server = grpc.aio.server()
    if mode == "bytes":
        server.add_generic_rpc_handlers((_bytes_handler(mode),))
    else:
        policy_pb2_grpc.add_EscalationPolicyServicer_to_server(Misbehaving(mode), server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield f"unix://{path}"
    finally:
        await server.stop(0)


async def test_round_trip_through_real_service(short_tmp: Path) -> None:
    async with running_service(FixedRules(), address=f"unix://{short_tmp / 'p.sock'}") as server:
        policy = GrpcPolicy(server.addresses[0], timeout_s=2)
        assert isinstance(policy, Policy)
        run = await policy.determine_action("/usr/bin/echo", ["echo", "x"], "/tmp", SESSION)
        esc = await policy.determine_action("/usr/bin/env", ["env"], "/tmp", SESSION)
        deny = await policy.determine_action("/usr/bin/rm", ["rm", "-rf", "/"], "/tmp", SESSION)
        prepared = await policy.prepare_escalated_exec(
            "/usr/bin/env", ["env", "-0"], "/tmp", {"HOME": "/h", "LD_PRELOAD": "x", "LANG": "C.UTF-8"}, Execution(), SESSION
        )
        sandboxed = await policy.prepare_escalated_exec(
            "/usr/bin/env", ["env"], "/tmp", {}, Execution("session_default"), SESSION
        )
        await policy.aclose()
    assert run.action == "run" and run.decision_id and not run.error
    assert esc.action == "escalate" and esc.execution == Execution()
    assert deny.action == "deny" and deny.reason == "fixed" and not deny.error
    assert list(prepared.command) == ["/usr/bin/env", "-0"] and prepared.arg0 == "env"
    # The escalated environment is an allowlist (HOME dropped, PATH the safe default).
    assert dict(prepared.env) == {"LANG": "C.UTF-8", "PATH": SAFE_PATH} and prepared.cwd == "/tmp"
    assert sandboxed.command[0].endswith("/bwrap") and os.path.isabs(sandboxed.command[0]) and "/tmp" in sandboxed.command
    assert policy.stats == {"run": 1, "escalate": 1, "deny": 1}


async def assert_fails_closed(policy: GrpcPolicy, *words: str) -> None:
    started = time.monotonic()
    decision = await policy.determine_action("/usr/bin/echo", ["echo"], "/tmp", SESSION)
    assert time.monotonic() - started < TIMEOUT + 1.0
    assert decision.action == "deny" and decision.error, decision
    assert decision.reason and all(w in decision.reason for w in words), decision.reason
    started = time.monotonic()
    with pytest.raises(PolicyError) as info:
        await policy.prepare_escalated_exec("/usr/bin/echo", ["echo"], "/tmp", {}, Execution(), SESSION)
    assert time.monotonic() - started < TIMEOUT + 1.0
    assert all(w in str(info.value) for w in words[:1])


async def test_service_never_started(short_tmp: Path) -> None:
    policy = GrpcPolicy(f"unix://{short_tmp / 'absent.sock'}", timeout_s=TIMEOUT)
    await assert_fails_closed(policy, "unavailable", "absent.sock")
    await policy.aclose()


async def test_service_killed_mid_session(short_tmp: Path) -> None:
    async with running_service(FixedRules(), address=f"unix://{short_tmp / 'p.sock'}", grace_s=0) as server:
        policy = GrpcPolicy(server.addresses[0], timeout_s=TIMEOUT)
        assert (await policy.determine_action("/usr/bin/echo", ["echo"], "/tmp", SESSION)).action == "run"
    await assert_fails_closed(policy, "unavailable")
    await policy.aclose()
    await asyncio.sleep(0.5)  # see test_cli_serve: a late reconnect completion targets this loop


@pytest.mark.parametrize(
    "mode, words",
    [
        ("hang", ("not answering",)),
        ("raise", ("raised an error",)),
        ("garbage", ("answered garbage", "no action set")),
        ("bytes", ("answered garbage",)),
    ],
)
async def test_misbehaving_service(short_tmp: Path, mode: str, words: tuple[str, ...]) -> None:
    async with misbehaving(short_tmp / "m.sock", mode) as address:
        policy = GrpcPolicy(address, timeout_s=TIMEOUT)
        await assert_fails_closed(policy, *words)
        await policy.aclose()


async def test_no_leftover_tasks_after_1000_failures(short_tmp: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        policies = [GrpcPolicy(f"unix://{short_tmp / 'absent.sock'}", timeout_s=TIMEOUT)]
        for mode in ("hang", "raise", "garbage", "bytes"):
            address = await stack.enter_async_context(misbehaving(short_tmp / f"{mode}.sock", mode))
            policies.append(GrpcPolicy(address, timeout_s=TIMEOUT))
        for policy in policies:  # warm up: channels exist before counting
            await policy.determine_action("/usr/bin/echo", ["echo"], "/tmp", SESSION)
        before = len(asyncio.all_tasks())
        decisions = []
        for batch in range(5):
            decisions += await asyncio.gather(
                *(policies[i % len(policies)].determine_action("/usr/bin/echo", ["echo", str(i)], "/tmp", SESSION)
                  for i in range(200))
            )
        await asyncio.sleep(0.1)
        after = len(asyncio.all_tasks())
        for policy in policies:
            await policy.aclose()
    await asyncio.sleep(0.5)  # late reconnect completions land on this loop, not a closed one
    assert len(decisions) == 1000 and all(d.action == "deny" and d.error for d in decisions)
    assert after <= before, (before, after)


def test_masked_dirs_and_notes_cross_the_wire():
    from execgate.server.policy import Decision, Permissions
    from execgate.server.policy_codec import (decision_from_pb, decision_to_pb, permissions_from_pb,
                                              permissions_to_pb)

    perms = Permissions(network=True, writable_roots=("/w",), readable_roots=("/r",), masked_dirs=("/home/u",))
    assert permissions_from_pb(permissions_to_pb(perms)) == perms
    run = Decision.run(reason="default", note="why it stays in the sandbox", rule_id="", decision_id="d")
    assert decision_from_pb(decision_to_pb(run)) == run
