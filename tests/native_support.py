"""The server side of the escalation protocol with plain sockets, driven step by step by a test.

Deliberately independent of ``execgate.server`` (docs/DESIGN.md §2 re-implemented in a few lines: the
handshake datagram, frames of a 4-byte little-endian length + JSON, the fallback SOCK_STREAM path)
so that the wrappers are checked byte for byte against a second implementation; the e2e tests use
the real ``EscalateServer``.
"""

from __future__ import annotations

import array
import json
import socket
import struct
import subprocess
from pathlib import Path
from typing import Any


def recv_exact(sock: socket.socket, n: int) -> tuple[bytes, list[int]]:
    """Read exactly n bytes with recvmsg; returns the bytes and every fd received with them."""
    data, fds = b"", []
    while len(data) < n:
        msg, anc, _flags, _addr = sock.recvmsg(n - len(data), socket.CMSG_SPACE(16 * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(payload[: len(payload) - len(payload) % 4])
                fds.extend(arr)
        if not msg:
            raise EOFError("peer closed the stream")
        data += msg
    return data, fds


def read_frame(sock: socket.socket) -> tuple[Any, list[int]]:
    head, fds = recv_exact(sock, 4)
    (length,) = struct.unpack("<I", head)
    body, more = recv_exact(sock, length) if length else (b"", [])
    return json.loads(body.decode("utf-8", "surrogateescape")), fds + more


def write_frame(sock: socket.socket, obj: Any) -> None:
    payload = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(struct.pack("<I", len(payload)) + payload)


class RawPeer:
    """The server side of one wrapper run, driven step by step by a test.

    Owns a SOCK_DGRAM socketpair (the client end is inheritable) and a fallback SOCK_STREAM
    listener at ``<tmpdir>/fb.sock``; :meth:`close` closes all three.
    """

    def __init__(self, tmpdir: Path) -> None:
        self.server, self.client = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.client.set_inheritable(True)
        self.path = str(tmpdir / "fb.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)

    def overlay(self, wrapper: str, *, fd: bool = True, path: bool = False) -> dict[str, str]:
        env = {"CODEX_ESCALATE_SOCKET": str(self.client.fileno()) if fd else "", "EXEC_WRAPPER": wrapper}
        if not fd:
            del env["CODEX_ESCALATE_SOCKET"]
        if path:
            env["EXECGATE_SOCKET_PATH"] = self.path
        return env

    def spawn(self, wrapper: str, args: list[str | bytes], env: dict[str, str], cwd: str = "/tmp") -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [wrapper, *args], env=env, cwd=cwd, pass_fds=(self.client.fileno(),),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )

    def accept_handshake(self, timeout: float = 20) -> socket.socket:
        """The stream end passed in the next handshake datagram."""
        self.server.settimeout(timeout)
        data, anc, _f, _a = self.server.recvmsg(16, socket.CMSG_SPACE(16 * 4))
        fds = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(payload[: len(payload) - len(payload) % 4])
                fds.extend(arr)
        assert data == b"\x00" and len(fds) == 1, (data, fds)
        stream = socket.socket(fileno=fds[0])
        stream.settimeout(timeout)
        return stream

    def accept_fallback(self, timeout: float = 20) -> socket.socket:
        self.listener.settimeout(timeout)
        conn, _ = self.listener.accept()
        conn.settimeout(timeout)
        return conn

    def close(self) -> None:
        for s in (self.server, self.client, self.listener):
            s.close()


def read_raw_frame(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One frame as raw bytes (length prefix included) and the fds that came with it."""
    head, fds = recv_exact(sock, 4)
    (length,) = struct.unpack("<I", head)
    body, more = recv_exact(sock, length) if length else (b"", [])
    return head + body, fds + more


def raw_frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload
