"""Input bounds on the escalation server (issue #9 class 8): a request whose path, argv or env
exceeds its bound gets a Deny naming the bound before the policy is asked; at the bound it is
decided as usual. A session's id and labels are bounded when it is created."""

from __future__ import annotations

import asyncio
import struct

import pytest

from core_support import TablePolicy, handshake, request
from execgate.server import protocol as p
from execgate.server.fdpass import recv_frame
from execgate.server.escalate_server import EscalateServer
from execgate.server.escalation import Limits

pytestmark = pytest.mark.anyio

#: 500,000 path components (1 MB, inside the 1 MiB frame).
DEEP = "a/" * 499_999 + "a"


def _server(policy, tmp, **kw) -> EscalateServer:
    return EscalateServer("/bin/sh", "/bin/false", policy, socket_dir=str(tmp), **kw)


async def _refused(s, file: str, argv: list[str], **kw) -> str:
    resp = await request(s.client_fd, file, argv, **kw)
    assert resp.action == "Deny", resp
    assert (resp.reason or "").startswith("request refused: "), resp.reason
    return resp.reason or ""


async def _big_request(s, argv: list[str], env: dict[str, str]) -> p.EscalateResponse:
    """A request frame larger than the default frame limit (our own framing: the library's
    encoder refuses it), and the answer."""
    payload = p.EscalateRequest("/bin/true", argv, "/", env).to_json()
    sock = await handshake(s.client_fd)
    with sock:
        async with asyncio.timeout(10):
            await asyncio.get_running_loop().sock_sendall(sock, struct.pack("<I", len(payload)) + payload)
            answer, _ = await recv_frame(sock, max_fds=0)
    return p.EscalateResponse.from_obj(p.decode_json(answer))


async def test_500000_component_file_is_denied_before_the_policy(short_tmp):
    policy = TablePolicy()
    async with _server(policy, short_tmp).start_session() as s:
        reason = await _refused(s, DEEP, ["a"], workdir="/tmp")
        assert "request.file" in reason and "PATH_MAX (4096 bytes)" in reason
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"  # the session serves on
    assert policy.programs == ["/bin/true"]


async def test_paths_at_and_past_path_max(short_tmp):
    policy = TablePolicy()
    # Non-UTF-8 bytes travel as one escape each and count as the one byte they stand for.
    at_max = "/" + "\udcff" * (p.MAX_PATH_BYTES - 1)
    async with _server(policy, short_tmp).start_session() as s:
        assert (await request(s.client_fd, at_max, ["x"])).action == "Run"
        assert "request.file" in await _refused(s, at_max + "x", ["x"])
        assert "request.workdir" in await _refused(s, "x", ["x"], workdir="/" + "w" * p.MAX_PATH_BYTES)
        # Each part within PATH_MAX, joined beyond it.
        reason = await _refused(s, "f" * 2000, ["f"], workdir="/" + "w" * 3000)
        assert "program path (workdir joined with file)" in reason
    assert policy.programs == [at_max]


async def test_argv_and_env_counts(short_tmp):
    policy = TablePolicy()
    async with _server(policy, short_tmp).start_session() as s:
        at_max = ["x"] * p.MAX_ARGV_ITEMS
        assert (await request(s.client_fd, "/bin/true", at_max)).action == "Run"
        assert "argv has 65537 items" in await _refused(s, "/bin/true", at_max + ["x"])
        env = {f"V{i}": "" for i in range(p.MAX_ENV_ITEMS + 1)}
        assert "env has 16385 items" in await _refused(s, "/bin/true", ["true"], env=env)
    assert policy.programs == ["/bin/true"]


async def test_argv_and_env_bytes_hold_whatever_the_frame_limit(short_tmp):
    policy = TablePolicy()
    limits = Limits(max_frame_bytes=3 * p.MAX_FRAME_BYTES)
    async with _server(policy, short_tmp, limits=limits).start_session() as s:
        big = "y" * p.MAX_ARGV_BYTES
        argv = await _big_request(s, ["true", big], {})
        env = await _big_request(s, ["true"], {"V": big})
        assert (await _big_request(s, ["true", big[:-4]], {})).action == "Run"  # exactly at the bound
    assert argv.action == env.action == "Deny"
    assert "argv totals more than the bound of 1048576 bytes" in (argv.reason or "")
    assert "env totals more than the bound of 1048576 bytes" in (env.reason or "")
    assert policy.programs == ["/bin/true"]


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"session_id": "s" * (p.MAX_SESSION_ID_BYTES + 1)}, "session id"),
        ({"labels": {f"k{i}": "v" for i in range(p.MAX_LABELS + 1)}}, "65 labels"),
        ({"labels": {"k": "v" * p.MAX_LABEL_BYTES}}, "label 'k'"),
    ],
)
async def test_session_id_and_labels_are_bounded(short_tmp, kw, words):
    with pytest.raises(ValueError, match=words):
        _server(TablePolicy(), short_tmp).start_session(**kw)
