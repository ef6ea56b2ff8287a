"""Hostile and non-UTF-8 requests against a real session: deep nesting closes only that connection;
non-UTF-8 bytes (sent as \\udcXX escapes, see execgate.server.protocol) reach the policy and the
escalated command as the caller's exact bytes."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from core_support import ESCALATE, TablePolicy, handshake, request
from execgate.server import protocol as p
from execgate.server.escalate_server import EscalateServer
from execgate.server.fdpass import encode_frame, recv_frame, send_frame

pytestmark = pytest.mark.anyio


def _server(policy, tmp) -> EscalateServer:
    return EscalateServer("/bin/sh", "/bin/false", policy, socket_dir=str(tmp))


async def _send_raw(sock: socket.socket, payload: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, encode_frame(payload))


async def test_deeply_nested_request_closes_that_connection_only(short_tmp):
    policy = TablePolicy()
    nested = b'{"file":"/bin/true","argv":["true"],"workdir":"/","env":{},"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with _server(policy, short_tmp).start_session() as s:
        sock = await handshake(s.client_fd)
        with sock:
            await _send_raw(sock, nested)
            with pytest.raises(p.ProtocolError):  # closed without an answer
                async with asyncio.timeout(10):
                    await recv_frame(sock)
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
    assert policy.programs == ["/bin/true"]


async def test_surrogates_that_stand_for_no_byte_are_refused(short_tmp):
    policy = TablePolicy()
    async with _server(policy, short_tmp).start_session() as s:
        sock = await handshake(s.client_fd)
        with sock:
            await _send_raw(sock, b'{"file":"/bin/true","argv":["\\ud800"],"workdir":"/","env":{}}')
            with pytest.raises(p.ProtocolError):
                async with asyncio.timeout(10):
                    await recv_frame(sock)
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
    assert policy.programs == ["/bin/true"]


async def test_non_utf8_bytes_reach_policy_and_escalated_command_exactly(short_tmp, monkeypatch):
    workdir = os.fsencode(short_tmp) + b"/w\xff"
    os.mkdir(workdir)
    monkeypatch.chdir(workdir)  # the caller (this process) is where its request says
    program = workdir + b"/p\xe9"
    out = os.fsencode(short_tmp) + b"/out"
    with open(program, "wb") as f:
        f.write(b'#!/bin/sh\nprintf "%s|%s|" "$0" "$1" > "$OUT"; pwd >> "$OUT"; tr "\\0" "\\n" < /proc/$$/environ >> "$OUT"\n')
    os.chmod(program, 0o755)
    policy = TablePolicy(default=ESCALATE)
    env = {"OUT": p.wire_str(out), "K\udcfe": "v\udc80"}
    # The same bytes spelled as escapes of a valid UTF-8 sequence ("\udcc3\udca9" = "é") are canonicalised.
    argv = ["zero\udcff", "\udcc3\udca9\udcc3"]
    async with _server(policy, short_tmp).start_session() as s:
        sock = await handshake(s.client_fd)
        with sock:
            await send_frame(sock, p.EscalateRequest("./p\udce9", argv, p.wire_str(workdir), env).to_json())
            async with asyncio.timeout(10):
                payload, _ = await recv_frame(sock, max_fds=0)
            assert p.EscalateResponse.from_obj(p.decode_json(payload)).action == "Escalate"
            null = os.open(os.devnull, os.O_RDWR)
            try:
                await send_frame(sock, p.SuperExecMessage([0, 1, 2]).to_json(), [null, null, null])
            finally:
                os.close(null)
            async with asyncio.timeout(20):
                payload, _ = await recv_frame(sock, max_fds=0)
            assert p.SuperExecResult.from_obj(p.decode_json(payload)).exit_code == 0
    (seen_program, seen_argv, seen_workdir, _) = policy.calls[0]
    assert p.wire_bytes(seen_program) == program and os.fsencode(seen_program) == program
    assert seen_argv == ["zero\udcff", "é\udcc3"] and p.wire_bytes(seen_workdir) == workdir
    with open(out, "rb") as f:
        lines = f.read().split(b"\n")
    assert lines[0] == program + b"|\xc3\xa9\xc3|" + workdir  # $0 of a script is its path
    assert b"K\xfe=v\x80" in lines
