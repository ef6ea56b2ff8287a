"""Framing and fd passing (``SCM_RIGHTS``) on raw ``AF_UNIX`` sockets: the only module that calls
``sendmsg``/``recvmsg``.

Why raw sockets: asyncio transports (and uvloop's) read ahead with plain ``recv``, which makes the
kernel discard any fds attached to the bytes read (unix(7)). So the server keeps its sockets
non-blocking, calls ``sendmsg``/``recvmsg`` itself and, on ``BlockingIOError``, waits with
``loop.add_reader``/``add_writer`` — which behave the same on asyncio and uvloop. The synchronous
wrapper uses the blocking variants below on blocking sockets.

Frames (docs/DESIGN.md §2): 4-byte little-endian length, then that many bytes of UTF-8 JSON. Every read
of a frame is a ``recvmsg`` so that fds riding on its first byte are collected, never lost.

Fd ownership: every function returning fds hands them to the caller, already close-on-exec
(``MSG_CMSG_CLOEXEC``, so there is no window in which a concurrent spawn could inherit them).
Functions that raise close every fd they received first. Functions that send fds never close them.
"""

from __future__ import annotations

import array
import os
import socket
import struct
import time
from typing import Iterable, Sequence

from execgate.server.protocol import LENGTH_PREFIX_BYTES, MAX_FDS_PER_MESSAGE, MAX_FRAME_BYTES, ProtocolError

_LENGTH = struct.Struct("<I")
_INT_SIZE = array.array("i").itemsize


class PeerClosedError(ProtocolError):
    """Raised when the peer closes the stream before or inside a frame (EOF)."""


def close_fds(fds: Iterable[int]) -> None:
    """Close every fd in ``fds``, ignoring ones that are already closed."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def encode_frame(payload: bytes, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Return ``payload`` prefixed with its 4-byte little-endian length.

    Raises:
        ProtocolError: ``payload`` is longer than ``max_bytes``.
    """
    if len(payload) > max_bytes:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the limit of {max_bytes}")
    return _LENGTH.pack(len(payload)) + payload


def _fds_ancillary(fds: Sequence[int], max_fds: int) -> list[tuple[int, int, bytes]]:
    if len(fds) > max_fds:
        raise ProtocolError(f"{len(fds)} fds exceed the limit of {max_fds} per message")
    if not fds:
        return []
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


def _recvmsg(sock: socket.socket, nbytes: int, max_fds: int) -> tuple[bytes, list[int]]:
    """One ``recvmsg``; returns (data, fds). Raises BlockingIOError/OSError, or ProtocolError on
    truncated control data (every fd received is closed first)."""
    data, ancdata, flags, _addr = sock.recvmsg(
        nbytes, socket.CMSG_SPACE(max_fds * _INT_SIZE), socket.MSG_CMSG_CLOEXEC
    )
    fds: list[int] = []
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(cdata) - len(cdata) % _INT_SIZE
            fds.extend(array.array("i", cdata[:usable]))
    if flags & socket.MSG_CTRUNC or len(fds) > max_fds:
        # The kernel has already closed the fds that did not fit (MSG_CTRUNC, unix(7)).
        close_fds(fds)
        raise ProtocolError(f"more than {max_fds} fds attached to one message")
    return data, fds


class _Fd:
    """Adapts a bare fd to the ``fileno()`` interface of :func:`_wait`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd


# --------------------------------------------------------------------------------------------
# Async variants (non-blocking sockets, asyncio or uvloop).


async def _wait(sock: socket.socket | _Fd, writable: bool, deadline: float | None = None) -> None:
    """Wait until ``sock`` is writable or readable; with ``deadline`` (``time.monotonic()``
    seconds), raise TimeoutError once it has passed."""
    # Imported here, not at module top: the per-exec wrapper imports this module and must not pay
    # for importing asyncio.
    import asyncio

    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    fd = sock.fileno()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    if writable:
        loop.add_writer(fd, ready)
    else:
        loop.add_reader(fd, ready)
    try:
        if deadline is None:
            await fut
        else:
            async with asyncio.timeout(deadline - time.monotonic()):  # past: TimeoutError at once
                await fut
    finally:
        (loop.remove_writer if writable else loop.remove_reader)(fd)


async def send_frame(
    sock: socket.socket, payload: bytes, fds: Sequence[int] = (), *, max_fds: int = MAX_FDS_PER_MESSAGE
) -> None:
    """Send one frame on a non-blocking stream socket, ``fds`` attached to its first byte.

    Args:
        sock: connected non-blocking ``AF_UNIX SOCK_STREAM`` socket.
        payload: UTF-8 JSON bytes (≤ 1 MiB).
        fds: fds to attach; still owned by the caller afterwards.
        max_fds: refuse to send more fds than this.

    Raises:
        ProtocolError: payload too long or too many fds.
        OSError: the socket failed (e.g. ``BrokenPipeError`` when the peer is gone).
    """
    data = encode_frame(payload)
    anc = _fds_ancillary(fds, max_fds)
    while data:
        try:
            sent = sock.sendmsg([data], anc, socket.MSG_NOSIGNAL)
        except BlockingIOError:
            await _wait(sock, writable=True)
            continue
        data, anc = data[sent:], []


async def _recv_exact(sock: socket.socket, n: int, fds: list[int], max_fds: int, allow_eof: bool,
                      deadline: float | None = None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk, got = _recvmsg(sock, n - len(buf), max_fds - len(fds))
        except BlockingIOError:
            await _wait(sock, writable=False, deadline=deadline)
            continue
        fds.extend(got)
        if not chunk:
            if allow_eof and not buf:
                return b""
            raise PeerClosedError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


#: Most bytes the first read of a sole frame asks for (:func:`recv_frame`): a request with a
#: typical environment (a few KiB) arrives in one read; a larger one is read on exactly.
SOLE_FRAME_FIRST_READ = 64 << 10


async def _recv_sole(sock: socket.socket, fds: list[int], max_bytes: int, max_fds: int,
                     deadline: float | None) -> bytes:
    """The payload of the one frame a peer sends before it waits for an answer, read in as few
    ``recvmsg`` calls as it arrived in (usually one, prefix included).

    Raises:
        PeerClosedError, ProtocolError (also: bytes past the frame), TimeoutError, OSError.
    """
    buf = bytearray()
    total: int | None = None  # the frame's size, prefix included, once the prefix is in
    while total is None or len(buf) < total:
        room = LENGTH_PREFIX_BYTES + min(max_bytes, SOLE_FRAME_FIRST_READ) if total is None else total
        try:
            chunk, got = _recvmsg(sock, room - len(buf), max_fds - len(fds))
        except BlockingIOError:
            await _wait(sock, writable=False, deadline=deadline)
            continue
        fds.extend(got)
        if not chunk:
            if not buf:
                raise PeerClosedError("connection closed")
            raise PeerClosedError(f"connection closed after {len(buf)} of {total or LENGTH_PREFIX_BYTES} bytes")
        buf += chunk
        if total is None and len(buf) >= LENGTH_PREFIX_BYTES:
            (length,) = _LENGTH.unpack_from(buf)
            if length > max_bytes:
                raise ProtocolError(f"frame length {length} exceeds the limit of {max_bytes} bytes")
            total = LENGTH_PREFIX_BYTES + length
    if len(buf) > total:
        raise ProtocolError(f"{len(buf) - total} bytes sent after the frame, before its answer")
    return bytes(buf[LENGTH_PREFIX_BYTES:])


async def recv_frame(
    sock: socket.socket, *, max_bytes: int = MAX_FRAME_BYTES, max_fds: int = MAX_FDS_PER_MESSAGE,
    timeout_s: float | None = None, sole: bool = False,
) -> tuple[bytes, list[int]]:
    """Receive one frame from a non-blocking stream socket.

    Args:
        timeout_s: the whole frame must have arrived within this many seconds of the call
            (TimeoutError otherwise); None: no deadline. A frame already waiting in the socket is
            read without arming any timer: only a read that has to wait is bounded by one.
        sole: the peer sends nothing after this frame until it has an answer (the request, docs/
            DESIGN.md §2): the prefix and the payload are read together, and bytes past the frame
            break the protocol (ProtocolError). Never for a stream of frames (signal frames).

    Returns:
        ``(payload, fds)``: the JSON bytes and the fds attached anywhere in the frame, in order,
        close-on-exec and owned by the caller.

    Raises:
        PeerClosedError: EOF before or inside the frame.
        ProtocolError: length above ``max_bytes``, or more than ``max_fds`` fds.
        TimeoutError: ``timeout_s`` passed first.
        OSError: the socket failed.
        On any error every fd received so far is closed.
    """
    fds: list[int] = []
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        if sole:
            return await _recv_sole(sock, fds, max_bytes, max_fds, deadline), fds
        head = await _recv_exact(sock, LENGTH_PREFIX_BYTES, fds, max_fds, True, deadline)
        if not head:
            raise PeerClosedError("connection closed")
        (length,) = _LENGTH.unpack(head)
        if length > max_bytes:
            raise ProtocolError(f"frame length {length} exceeds the limit of {max_bytes} bytes")
        payload = await _recv_exact(sock, length, fds, max_fds, False, deadline)
    except BaseException:
        close_fds(fds)
        raise
    return payload, fds


def recv_datagram_nowait(
    sock: socket.socket, *, nbytes: int = 64, max_fds: int = MAX_FDS_PER_MESSAGE
) -> tuple[bytes, list[int]]:
    """:func:`recv_datagram` for a datagram already waiting (e.g. in a reader callback).

    Raises:
        BlockingIOError: none is waiting. ProtocolError, OSError: as :func:`recv_datagram`.
    """
    return _recvmsg(sock, nbytes, max_fds)


async def recv_datagram(
    sock: socket.socket, *, nbytes: int = 64, max_fds: int = MAX_FDS_PER_MESSAGE
) -> tuple[bytes, list[int]]:
    """Receive one datagram (a handshake) from a non-blocking ``SOCK_DGRAM`` socket.

    Returns:
        ``(payload, fds)``; the fds are close-on-exec and owned by the caller.

    Raises:
        ProtocolError: more than ``max_fds`` fds were attached (all of them are closed).
        OSError: the socket failed.
    """
    while True:
        try:
            return _recvmsg(sock, nbytes, max_fds)
        except BlockingIOError:
            await _wait(sock, writable=False)


async def wait_readable(sock_or_fd: socket.socket | int) -> None:
    """Wait until ``sock_or_fd`` (a socket or any pollable fd, e.g. a pidfd or pipe) is readable."""
    target = sock_or_fd if isinstance(sock_or_fd, socket.socket) else _Fd(sock_or_fd)
    await _wait(target, writable=False)


# --------------------------------------------------------------------------------------------
# Blocking variants (the synchronous wrapper; blocking sockets).


def send_frame_blocking(
    sock: socket.socket, payload: bytes, fds: Sequence[int] = (), *, max_fds: int = MAX_FDS_PER_MESSAGE
) -> None:
    """Blocking :func:`send_frame`. ``fds`` stay owned by the caller. Raises ProtocolError, OSError."""
    data = encode_frame(payload)
    anc = _fds_ancillary(fds, max_fds)
    while data:
        sent = sock.sendmsg([data], anc, socket.MSG_NOSIGNAL)
        data, anc = data[sent:], []


def _recv_exact_blocking(sock: socket.socket, n: int, fds: list[int], max_fds: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk, got = _recvmsg(sock, n - len(buf), max_fds - len(fds))
        fds.extend(got)
        if not chunk:
            raise PeerClosedError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_frame_blocking(
    sock: socket.socket, *, max_bytes: int = MAX_FRAME_BYTES, max_fds: int = MAX_FDS_PER_MESSAGE
) -> tuple[bytes, list[int]]:
    """Blocking :func:`recv_frame`: returns ``(payload, fds)``, fds owned by the caller.

    Raises:
        PeerClosedError, ProtocolError, OSError — as :func:`recv_frame`; fds closed on error.
    """
    fds: list[int] = []
    try:
        (length,) = _LENGTH.unpack(_recv_exact_blocking(sock, LENGTH_PREFIX_BYTES, fds, max_fds))
        if length > max_bytes:
            raise ProtocolError(f"frame length {length} exceeds the limit of {max_bytes} bytes")
        payload = _recv_exact_blocking(sock, length, fds, max_fds)
    except BaseException:
        close_fds(fds)
        raise
    return payload, fds


def send_datagram_blocking(sock: socket.socket, payload: bytes, fds: Sequence[int] = ()) -> None:
    """Send one datagram with ``fds`` attached (the handshake). Fds stay owned by the caller.

    Raises:
        OSError: e.g. ``ConnectionRefusedError`` when the server's end is closed.
    """
    sock.sendmsg([payload], _fds_ancillary(fds, max(len(fds), 1)), socket.MSG_NOSIGNAL)
