"""Protocol clients for figure 4 (run by :mod:`bench.server_worker` with the sessions' handshake
sockets passed in): per session, ``execs`` intercepted execs one after another, exactly as the
wrapper does them — handshake datagram with a fresh stream socketpair end attached, request frame,
response frame — then ``exec`` is not performed (the figure measures the server, not /bin/true).
Sessions run concurrently in one uvloop process. Prints one JSON object on stdout.
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
    env = {k: v for k, v in os.environ.items() if k not in p.OVERLAY_ENV_VARS}
    payload = p.EscalateRequest(file="/bin/true", argv=["/bin/true"], workdir="/tmp", env=env).to_json()
    frame = _LEN.pack(len(payload)) + payload
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    await asyncio.gather(*(session(fd, execs, frame, latencies, errors) for fd in fds))
    wall = time.perf_counter() - start
    latencies.sort()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "decisions": len(latencies), "errors": len(errors), "error_samples": errors[:5], "wall_s": wall,
        "request_bytes": len(payload),
        "p50_ms": latencies[len(latencies) // 2] * 1000 if latencies else None,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000 if latencies else None,
        "driver_cpu_s": usage.ru_utime + usage.ru_stime,
    }


def main() -> int:
    args = json.loads(sys.argv[1])
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(drive(args["fds"], args["execs"]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
