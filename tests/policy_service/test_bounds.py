"""Input bounds of the policy service (issue #9 class 8): over a real grpc.aio server, an oversized
field is INVALID_ARGUMENT naming the bound, before any work; a request at the bounds is served."""

from __future__ import annotations

import grpc
import pytest

from execgate.server import protocol as p
from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc

from policy_fixtures import release_grpc_objects, rules_file, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.anyio

SESSION = pb.SessionContext(session_id="s-1", labels={"agent": "a1"})
X = p.GRPC_TEXT_EXPANSION
#: 500,000 path components (1 MB): once kept the service's event loop in realpath for minutes.
DEEP = "/" + "a/" * 499_999 + "a"


def _target(program: str = "/usr/bin/echo", argv: list[str] | None = None, workdir: str = "/tmp") -> pb.ExecTarget:
    return pb.ExecTarget(program=program, argv=argv or ["echo"], workdir=workdir)


async def _status(address: str, *, session=SESSION, target=None, env=None) -> tuple[grpc.StatusCode, str]:
    """Status of DetermineAction and of PrepareEscalatedExec (with ``env``) for one input; both must agree."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = policy_pb2_grpc.EscalationPolicyStub(channel)
        seen = []
        calls = [
            stub.DetermineAction(pb.DetermineActionRequest(session=session, target=target or _target()), timeout=30),
            stub.PrepareEscalatedExec(pb.PrepareEscalatedExecRequest(
                session=session, target=target or _target(), env=env or {},
                execution=pb.Execution(unsandboxed=pb.Unsandboxed())), timeout=30),
        ]  # fmt: skip
        for call in calls if env is None else calls[1:]:
            try:
                await call
                seen.append((grpc.StatusCode.OK, ""))
            except grpc.aio.AioRpcError as exc:
                seen.append((exc.code(), exc.details() or ""))
        assert all(s == seen[0] for s in seen), seen
        return seen[0]


async def test_500000_component_program_is_invalid_argument(service) -> None:
    async with service() as server:
        code, details = await _status(server.addresses[0], target=_target(program=DEEP))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "target.program" in details and "PATH_MAX" in details


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("workdir", "target.workdir"),
        ("argv_items", "argv has"),
        ("session_id", "session id"),
        ("labels", "labels"),
        ("label_bytes", "label 'k'"),
        ("roots", "sandbox has"),
        ("root_bytes", "sandbox root 0"),
    ],
)
async def test_each_bound_is_invalid_argument(service, case: str, words: str) -> None:
    long_path = "/" + "d" * (p.MAX_PATH_BYTES * X)
    session, target = SESSION, _target()
    if case == "workdir":
        target = _target(workdir=long_path)
    elif case == "argv_items":
        target = _target(argv=["echo"] * (p.MAX_ARGV_ITEMS + 1))
    elif case == "session_id":
        session = pb.SessionContext(session_id="s" * (p.MAX_SESSION_ID_BYTES * X + 1))
    elif case == "labels":
        session = pb.SessionContext(session_id="s", labels={f"k{i}": "v" for i in range(p.MAX_LABELS + 1)})
    elif case == "label_bytes":
        session = pb.SessionContext(session_id="s", labels={"k": "v" * (p.MAX_LABEL_BYTES * X)})
    elif case == "roots":
        box = pb.Permissions(writable_roots=["/tmp"] * (p.MAX_SANDBOX_ROOTS + 1))
        session = pb.SessionContext(session_id="s", sandbox=box)
    else:
        session = pb.SessionContext(session_id="s", sandbox=pb.Permissions(readable_roots=[long_path]))
    async with service() as server:
        code, details = await _status(server.addresses[0], session=session, target=target)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "input bound exceeded" in details and words in details, details


async def test_env_bound_on_prepare(service) -> None:
    # The byte totals of argv and env (x4 here: 4 MiB) are those of gRPC's own 4 MiB message
    # limit; the escalation server's side tests them (tests/server/test_request_bounds.py).
    async with service() as server:
        address = server.addresses[0]
        many = await _status(address, env={f"V{i}": "" for i in range(p.MAX_ENV_ITEMS + 1)})
        fine = await _status(address, env={f"V{i}": "z" for i in range(100)})
    assert many[0] == grpc.StatusCode.INVALID_ARGUMENT and "env has" in many[1], many
    assert fine[0] == grpc.StatusCode.OK


async def test_inputs_at_the_bounds_are_served(service) -> None:
    """Exactly at each bound (gRPC text: 4 bytes per byte, room for ``\\xNN`` escapes) is served."""
    at_path = "/" + "d" * (p.MAX_PATH_BYTES * X - 1)
    session = pb.SessionContext(session_id="s" * (p.MAX_SESSION_ID_BYTES * X),
                                labels={f"k{i}": "v" for i in range(p.MAX_LABELS)})
    target = _target(program=at_path, argv=["echo"] + [""] * (p.MAX_ARGV_ITEMS - 1), workdir=at_path)
    async with service() as server:
        code, details = await _status(server.addresses[0], session=session, target=target)
    assert code == grpc.StatusCode.OK, details
