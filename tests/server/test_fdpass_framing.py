"""Framing and SCM_RIGHTS over real socketpairs; byte-exact frames from tests/data/protocol.json."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from conftest import open_fd_count
from execgate.server import protocol as p
from execgate.server.fdpass import (
    encode_frame,
    recv_datagram,
    recv_frame,
    recv_frame_blocking,
    send_frame,
    send_frame_blocking,
)

#: Byte-exact frames of the Codex shell-escalation protocol, kept in the repository.
VECTORS = Path(__file__).resolve().parents[1] / "data" / "protocol.json"


def _vectors() -> dict:
    return {v["name"]: v for v in json.loads(VECTORS.read_text())["frames"]}


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


@pytest.mark.anyio
async def test_10000_byte_payload_round_trips(pair):
    payload = json.dumps({"x": "y" * 9990}).encode()[:10000]
    payload = payload + b" " * (10000 - len(payload))
    assert len(payload) == 10000
    a, b = pair
    await send_frame(a, payload)
    got, fds = await recv_frame(b)
    assert got == payload and fds == []


@pytest.mark.anyio
async def test_passed_fd_is_usable_and_close_on_exec(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        await send_frame(a, b'{"fds":[1]}', [w])
        os.close(w)  # the receiver's copy must keep the pipe open
        payload, fds = await recv_frame(b)
        assert payload == b'{"fds":[1]}' and len(fds) == 1
        assert os.get_inheritable(fds[0]) is False
        os.write(fds[0], b"through the passed fd")
        os.close(fds[0])
        assert os.read(r, 100) == b"through the passed fd"
    finally:
        os.close(r)


@pytest.mark.anyio
async def test_17_fds_refused_by_sender_and_receiver(pair):
    a, b = pair
    baseline = open_fd_count()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        with pytest.raises(p.ProtocolError):
            await send_frame(a, b"{}", [null] * 17)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(__import__("array").array("i", [null] * 17)))]
        a.sendmsg([encode_frame(b"{}")], anc)
        with pytest.raises(p.ProtocolError, match="fds"):
            await recv_frame(b)
    finally:
        os.close(null)
    assert open_fd_count() == baseline


def test_vector_frames_are_byte_exact():
    v = _vectors()
    enc = {
        "escalate_request": p.EscalateRequest("/bin/echo", ["echo", "hi"], "/tmp", {"A": "1"}),
        "escalate_request_relative": p.EscalateRequest("./bin/tool", ["./bin/tool", "--flag"], "/home/u/ws", {}),
        "response_run": p.EscalateResponse("Run"),
        "response_escalate": p.EscalateResponse("Escalate"),
        "response_deny_reason": p.EscalateResponse("Deny", reason="Execution forbidden by policy"),
        "response_deny_null": p.EscalateResponse("Deny", reason=None),
        "super_exec_message": p.SuperExecMessage([0, 1, 2]),
        "super_exec_result": p.SuperExecResult(42),
    }
    assert set(enc) == set(v)
    for name, message in enc.items():
        assert encode_frame(message.to_json()).hex() == v[name]["frame_hex"], name
    assert bytes.fromhex(v["response_run"]["frame_hex"])[:4] == b"\x10\x00\x00\x00"


def test_vector_frames_decode_through_a_socket():
    v = _vectors()
    kinds = {
        "escalate_request": p.EscalateRequest,
        "escalate_request_relative": p.EscalateRequest,
        "response_run": p.EscalateResponse,
        "response_escalate": p.EscalateResponse,
        "response_deny_reason": p.EscalateResponse,
        "response_deny_null": p.EscalateResponse,
        "super_exec_message": p.SuperExecMessage,
        "super_exec_result": p.SuperExecResult,
    }
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        for name, kind in kinds.items():
            a.sendall(bytes.fromhex(v[name]["frame_hex"]))
            payload, fds = recv_frame_blocking(b)
            assert fds == [] and json.loads(payload) == v[name]["json"]
            decoded = kind.from_obj(p.decode_json(payload))
            assert decoded.to_json() == payload, name
    deny_null = p.EscalateResponse.from_obj(v["response_deny_null"]["json"])
    assert deny_null.action == "Deny" and deny_null.reason is None
    assert p.deny_message(deny_null.reason) == "Execution denied"


def test_unknown_fields_are_ignored():
    resp = p.EscalateResponse.from_obj({"action": "Escalate", "execgate_signals": True, "future": [1]})
    assert resp.action == "Escalate" and resp.extensions["execgate_signals"] is True
    req = p.EscalateRequest.from_obj({"file": "x", "argv": ["x"], "workdir": "/", "env": {}, "extra": 1})
    assert req.file == "x"
    assert p.SuperExecResult.from_obj({"exit_code": 3, "note": "x"}).exit_code == 3
    assert p.SuperExecMessage.from_obj({"fds": [0], "z": None}).fds == [0]
    assert p.SignalMessage.from_obj({"signal": 2, "z": 0}).signal == 2
    deny = p.EscalateResponse.from_obj({"action": {"Deny": {"reason": "r", "code": 9}}, "x": 1})
    assert deny.reason == "r"


@pytest.mark.parametrize(
    "obj",
    [[], {"action": "Maybe"}, {"action": {"Deny": "no"}}, {"action": {"Deny": {"reason": 3}}}],
)
def test_wrong_response_shapes_raise_protocol_error(obj):
    with pytest.raises(p.ProtocolError):
        p.EscalateResponse.from_obj(obj)


def test_blocking_variants_round_trip_with_fds():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    with a, b:
        send_frame_blocking(a, b'{"fds":[0,1,2]}', [r, w, w])
        payload, fds = recv_frame_blocking(b)
        os.close(r)
        os.close(w)
        assert payload == b'{"fds":[0,1,2]}' and len(fds) == 3
        os.write(fds[1], b"ok")
        assert os.read(fds[0], 10) == b"ok"
        for fd in fds:
            os.close(fd)


def test_oversized_length_is_refused_without_reading_the_body():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        a.sendall((p.MAX_FRAME_BYTES + 1).to_bytes(4, "little"))
        with pytest.raises(p.ProtocolError, match="exceeds"):
            recv_frame_blocking(b)
        with pytest.raises(p.ProtocolError):
            encode_frame(b"x" * (p.MAX_FRAME_BYTES + 1))


@pytest.mark.anyio
async def test_datagram_with_fds_is_received_close_on_exec():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b.setblocking(False)
    null = os.open(os.devnull, os.O_RDONLY)
    with a, b:
        a.sendmsg([b"\x00"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, null.to_bytes(4, "little"))])
        payload, fds = await recv_datagram(b)
        os.close(null)
        assert payload == b"\x00" and len(fds) == 1 and not os.get_inheritable(fds[0])
        assert os.path.samestat(os.fstat(fds[0]), os.stat(os.devnull))
        os.close(fds[0])
