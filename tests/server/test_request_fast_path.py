"""The server's lean request path: ``EscalateRequest.from_payload`` (an ASCII payload skips the
per-string work) gives exactly what ``from_obj`` gives on the decoded object — fields, extension
flags, bound violations and their messages; the request frame is read whole in one go, and bytes
sent past it close that connection only."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from core_support import TablePolicy, handshake, request
from execgate.server import protocol as p
from execgate.server.escalate_server import EscalateServer
from execgate.server.fdpass import encode_frame, recv_frame

pytestmark = pytest.mark.anyio

BASE = {"file": "/bin/true", "argv": ["true", "-x"], "workdir": "/tmp", "env": {"HOME": "/root", "A": "b c"}}

PAYLOADS = [
    json.dumps(BASE).encode(),
    json.dumps({**BASE, p.TARGET_FD_EXTENSION_FIELD: True}).encode(),
    json.dumps({**BASE, p.CACHED_ONLY_EXTENSION_FIELD: True}).encode(),
    json.dumps({**BASE, p.CACHED_ONLY_EXTENSION_FIELD: True, p.CACHED_FOR_CHILD_EXTENSION_FIELD: True}).encode(),
    json.dumps({**BASE, p.CACHED_FOR_CHILD_EXTENSION_FIELD: True}).encode(),  # without cached_only: ignored
    json.dumps({**BASE, "env": {}, "unknown": [1, {"x": None}]}).encode(),
    # Not ASCII, or with \u escapes: the full path (canonicalising) must give the same.
    json.dumps({**BASE, "env": {"LANG": "é"}}, ensure_ascii=False).encode(),
    json.dumps({**BASE, "env": {"LANG": "é"}}).encode(),  # "\u00e9"
    b'{"file":"/bin/true","argv":["\\udcc3\\udca9"],"workdir":"/","env":{"K":"\\udcff"}}',
    b'{"file":"/bin/true","argv":["a\\\\u"],"workdir":"/","env":{}}',  # a literal backslash-u
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_from_payload_equals_from_obj(payload: bytes) -> None:
    assert p.EscalateRequest.from_payload(payload) == p.EscalateRequest.from_obj(p.decode_json(payload))


def _error(fn, *args) -> tuple[type, str]:
    with pytest.raises(p.ProtocolError) as info:
        fn(*args)
    return type(info.value), str(info.value)


BAD = [
    {**BASE, "env": {"A": 1}},
    {**BASE, "env": ["A"]},
    {**BASE, "env": {"A": None}},
    {**BASE, "argv": ["a", 2]},
    {**BASE, "file": ""},
    {**BASE, "workdir": 3},
    {**BASE, "env": {f"V{i}": "" for i in range(p.MAX_ENV_ITEMS + 1)}},
    {**BASE, "env": {"BIG": "x" * (p.MAX_ENV_BYTES - 2)}},  # "BIG" + value: over by one byte
    {**BASE, "argv": ["x"] * (p.MAX_ARGV_ITEMS + 1)},
    {**BASE, "argv": ["x" * p.MAX_ARGV_BYTES, "y"]},
    {**BASE, "file": "/" + "a" * p.MAX_PATH_BYTES},
    [BASE],
]


@pytest.mark.parametrize("obj", BAD, ids=range(len(BAD)))
def test_from_payload_refuses_as_from_obj(obj) -> None:
    payload = json.dumps(obj).encode()
    assert payload.isascii()
    assert _error(p.EscalateRequest.from_payload, payload) == _error(p.EscalateRequest.from_obj, json.loads(payload))


def test_env_at_its_byte_bound_is_accepted() -> None:
    payload = json.dumps({**BASE, "env": {"BIG": "x" * (p.MAX_ENV_BYTES - 3)}}).encode()
    assert len(p.EscalateRequest.from_payload(payload).env["BIG"]) == p.MAX_ENV_BYTES - 3


def _server(policy, tmp) -> EscalateServer:
    return EscalateServer("/bin/sh", "/bin/false", policy, socket_dir=str(tmp))


async def test_request_split_in_pieces_is_read_whole(short_tmp):
    policy = TablePolicy()
    frame = encode_frame(p.EscalateRequest(file="/bin/true", argv=["true"], workdir="/", env={"A": "b"}).to_json())
    async with _server(policy, short_tmp).start_session() as s:
        sock = await handshake(s.client_fd)
        with sock:
            for piece in (frame[:2], frame[2:7], frame[7:]):
                sock.send(piece)
                await asyncio.sleep(0.05)
            async with asyncio.timeout(10):
                payload, _ = await recv_frame(sock)
        assert p.EscalateResponse.from_obj(p.decode_json(payload)).action == "Run"
    assert policy.programs == ["/bin/true"]


async def test_bytes_after_the_request_close_that_connection_only(short_tmp):
    policy = TablePolicy()
    frame = encode_frame(p.EscalateRequest(file="/bin/true", argv=["true"], workdir="/", env={}).to_json())
    async with _server(policy, short_tmp).start_session() as s:
        sock = await handshake(s.client_fd)
        with sock:
            sock.sendall(frame + frame)  # a second request before the first answer
            with pytest.raises(p.ProtocolError):  # closed without an answer
                async with asyncio.timeout(10):
                    await recv_frame(sock)
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
    assert policy.programs == ["/bin/true"]


async def test_silent_peer_times_out_and_the_session_goes_on(short_tmp):
    from execgate.server.escalation import Limits

    policy = TablePolicy()
    server = EscalateServer("/bin/sh", "/bin/false", policy, socket_dir=str(short_tmp),
                            limits=Limits(request_timeout_s=0.2))
    async with server.start_session() as s:
        sock = await handshake(s.client_fd)
        with sock:
            sock.send(b"\x10\x00")  # half a length prefix, then nothing
            with pytest.raises(p.ProtocolError):  # the server gave up and closed the stream
                async with asyncio.timeout(10):
                    await recv_frame(sock)
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
    assert policy.programs == ["/bin/true"]
