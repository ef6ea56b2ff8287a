"""A tiny threaded escalation server with plain sockets, for testing the wrappers and the shim.

It speaks the server side of DESIGN.md §2 (handshake on a SOCK_DGRAM socketpair, frames of a 4-byte
little-endian length + JSON, Run/Escalate/Deny, the fds message and the exit code) and also listens
on a fallback SOCK_STREAM path (``EXECGATE_SOCKET_PATH``). It is deliberately independent of
``execgate.server`` so that the wrappers are checked against a second implementation; the e2e
tests use the real ``EscalateServer``.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

Decide = Callable[[dict[str, Any]], dict[str, Any]]


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


def run_decision() -> dict[str, Any]:
    return {"action": "Run"}


@dataclass
class MiniServer:
    """Serve decisions from ``decide(request) -> response`` until closed.

    ``requests`` records every decoded request; ``signals`` every ``{"signal": N}`` frame received
    during an escalation. Escalated requests run ``request["argv"]`` with the received fds.
    """

    decide: Decide = field(default=lambda req: run_decision())
    tmpdir: Path | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    signals: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server_sock, self.client_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.client_sock.set_inheritable(True)
        self.path = str((self.tmpdir or Path("/tmp")) / "eg.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._dgram_loop, daemon=True).start()
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def env(self, wrapper: str | os.PathLike[str]) -> dict[str, str]:
        """The session env overlay for this server (plus the fallback path)."""
        return {
            "CODEX_ESCALATE_SOCKET": str(self.client_sock.fileno()),
            "EXEC_WRAPPER": str(wrapper),
            "EXECGATE_SOCKET_PATH": self.path,
        }

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self.client_sock.fileno(),)

    def _dgram_loop(self) -> None:
        while not self._closed:
            try:
                _data, anc, _f, _a = self.server_sock.recvmsg(16, socket.CMSG_SPACE(16 * 4))
            except OSError:
                return
            fds = []
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    arr = array.array("i")
                    arr.frombytes(payload[: len(payload) - len(payload) % 4])
                    fds.extend(arr)
            if len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                continue
            stream = socket.socket(fileno=fds[0])
            threading.Thread(target=self._serve, args=(stream,), daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, stream: socket.socket) -> None:
        with stream:
            try:
                req, fds = read_frame(stream)
                for fd in fds:
                    os.close(fd)
                with self._lock:
                    self.requests.append(req)
                resp = self.decide(req)
                write_frame(stream, resp)
                if resp.get("action") == "Escalate":
                    self._escalate(stream, req)
            except (EOFError, OSError, ValueError):
                return

    def _escalate(self, stream: socket.socket, req: dict[str, Any]) -> None:
        msg, fds = read_frame(stream)
        try:
            std = dict(zip(msg["fds"], fds))
            proc = subprocess.Popen(
                req["argv"], executable=req["file"], cwd=req["workdir"],
                env={"PATH": "/usr/bin:/bin"}, stdin=std.get(0), stdout=std.get(1), stderr=std.get(2),
            )
        finally:
            for fd in fds:
                os.close(fd)
        stream.setblocking(False)
        buf = b""
        while proc.poll() is None:
            try:
                chunk = stream.recv(4096)
                if chunk == b"":
                    proc.kill()
                buf += chunk
            except BlockingIOError:
                pass
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack("<I", buf[:4])[0]:
                n = struct.unpack("<I", buf[:4])[0]
                obj = json.loads(buf[4 : 4 + n])
                buf = buf[4 + n :]
                self.signals.append(obj["signal"])
                proc.send_signal(obj["signal"])
            try:
                proc.wait(0.02)
            except subprocess.TimeoutExpired:
                pass
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        stream.setblocking(True)
        write_frame(stream, {"exit_code": code})

    def close(self) -> None:
        self._closed = True
        for s in (self.server_sock, self.client_sock, self.listener):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self) -> MiniServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
