"""Protocol clients for figures 3b and 4 (run by :mod:`bench.server_worker` with the sessions'
handshake sockets passed in). Each intercepted exec is done exactly as the wrapper does it —
handshake datagram with a fresh stream socketpair end attached, request frame (the client's real
environment), response frame — then ``exec`` is not performed (the figures measure the server,
not /bin/true). One uvloop process. Prints one JSON object on stdout.

Closed loop (figure 4, ``{"fds", "execs"}``): per session, ``execs`` execs one after another,
all sessions concurrently. Open loop (figure 3b, ``{"fds", "rate", "count", "warm"}``): exec *i*
starts at ``t0 + i / rate`` on session ``i mod len(fds)`` whether or not earlier ones have
finished, and its latency is counted from that scheduled time (no coordinated omission); ``warm``
execs at the same rate come first and are not counted.
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import resource
import socket
import struct
import sys
import time

from bench.common import open_loop as common_open_loop
from execgate.server import protocol as p

_LEN = struct.Struct("<I")


async def _recv_exact(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = await loop.sock_recv(sock, n - len(buf))
        if not chunk:
            raise EOFError("server closed the stream")
        buf += chunk
    return buf


async def one_exec(loop: asyncio.AbstractEventLoop, dgram: socket.socket, frame: bytes) -> str:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        dgram.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))])
        theirs.close()
        mine.setblocking(False)
        await loop.sock_sendall(mine, frame)
        (length,) = _LEN.unpack(await _recv_exact(loop, mine, 4))
        answer = p.EscalateResponse.from_obj(p.decode_json(await _recv_exact(loop, mine, length)))
        return answer.action
    finally:
        mine.close()
        theirs.close()


async def session(fd: int, execs: int, frame: bytes, latencies: list[float], errors: list[str]) -> None:
    loop = asyncio.get_running_loop()
    dgram = socket.socket(fileno=fd)
    try:
        for _ in range(execs):
            start = time.perf_counter()
            try:
                action = await one_exec(loop, dgram, frame)
            except Exception as exc:  # counted, reported; the figure requires zero
                errors.append(repr(exc))
                continue
            latencies.append(time.perf_counter() - start)
            if action != "Run":
                errors.append(f"answer {action}")
    finally:
        dgram.close()


async def drive(fds: list[int], execs: int) -> dict[str, object]:
    frame = _request_frame()
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    await asyncio.gather(*(session(fd, execs, frame, latencies, errors) for fd in fds))
    wall = time.perf_counter() - start
    latencies.sort()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "decisions": len(latencies), "errors": len(errors), "error_samples": errors[:5], "wall_s": wall,
        "request_bytes": len(frame) - 4,
        "p50_ms": latencies[len(latencies) // 2] * 1000 if latencies else None,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000 if latencies else None,
        "driver_cpu_s": usage.ru_utime + usage.ru_stime,
    }


def _request_frame() -> bytes:
    env = {k: v for k, v in os.environ.items() if k not in p.OVERLAY_ENV_VARS}
    payload = p.EscalateRequest(file="/bin/true", argv=["/bin/true"], workdir="/tmp", env=env).to_json()
    return _LEN.pack(len(payload)) + payload


async def _open_loop(loop: asyncio.AbstractEventLoop, dgrams: list[socket.socket], frame: bytes, rate: float,
                     count: int) -> tuple[list[float], list[str], float]:
    """Latencies (s, sorted), errors, and the achieved completion rate (/s): exec *i* on session
    ``i mod len(dgrams)`` (:func:`bench.common.open_loop`)."""
    async def one(i: int) -> str | None:
        action = await one_exec(loop, dgrams[i % len(dgrams)], frame)
        return None if action == "Run" else f"answer {action}"

    return await common_open_loop(one, rate, count)


async def open_loop(fds: list[int], rate: float, count: int, warm: int) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    dgrams = [socket.socket(fileno=fd) for fd in fds]
    frame = _request_frame()
    try:
        await _open_loop(loop, dgrams, frame, rate, warm)
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        latencies, errors, achieved = await _open_loop(loop, dgrams, frame, rate, count)
        usage = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        for d in dgrams:
            d.close()
    return {"latencies_s": latencies, "decisions": warm + count, "errors": len(errors), "error_samples": errors[:5],
            "rate": achieved,
            "request_bytes": len(frame) - 4,
            "driver_cpu_s": usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime}


def main() -> int:
    args = json.loads(sys.argv[1])
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        if "rate" in args:
            result = runner.run(open_loop(args["fds"], args["rate"], args["count"], args["warm"]))
        else:
            result = runner.run(drive(args["fds"], args["execs"]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
