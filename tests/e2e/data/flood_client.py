"""A hostile session's flood: worst-case requests sent over the raw escalation protocol.

Run inside a gated session (it reads ``CODEX_ESCALATE_SOCKET``)::

    python flood_client.py READY STOP REPORT [THREADS]

Stdlib only and independent of execgate (the script in a session owns no execgate code). Each
thread loops over the kinds below until the file STOP exists: handshake (one datagram passing a
fresh stream end), one request frame, then the answer frame or the end of the stream. READY is
written once the first 500,000-component request is on its way; REPORT gets a JSON object
``{kind: {outcome: count}}`` where outcome is ``Run``, ``Escalate``, ``Deny: <reason>`` (reason
cut to 60 characters), ``closed`` or ``timeout``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
from collections import Counter

FRAME_MAX = 1 << 20


def _request(file: str, argv: list[str], env: dict[str, str]) -> bytes:
    return json.dumps({"file": file, "argv": argv, "workdir": "/tmp", "env": env}).encode()


#: Each payload fits the 1 MiB frame limit, so that the server has to read and judge it.
PAYLOADS = {
    "path": _request("a/" * 499_999 + "a", ["a"], {}),  # 500,000 path components
    "argv": _request("/bin/true", ["true"] + ["y" * 1023] * 1000, {}),  # 1 MiB of argv
    "env": _request("/bin/true", ["true"], {f"V{i}": "z" * 80 for i in range(11_000)}),  # 1 MiB of env
    "deep": b"[" * (FRAME_MAX - 1),  # JSON nested a million deep
}
assert all(len(p) <= FRAME_MAX for p in PAYLOADS.values())


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def one(ctrl: socket.socket, payload: bytes, sent: threading.Event | None = None) -> str:
    """Send one request on a fresh connection; the outcome as described in the module doc."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with mine:
        ctrl.sendmsg([b"\x00"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", theirs.fileno()))])
        theirs.close()
        mine.settimeout(60)
        try:
            mine.sendall(struct.pack("<I", len(payload)) + payload)
            if sent is not None:
                sent.set()
            head = _read_exact(mine, 4)
            body = None if head is None else _read_exact(mine, struct.unpack("<I", head)[0])
        except TimeoutError:
            return "timeout"
        except OSError:
            return "closed"
    if body is None:
        return "closed"
    action = json.loads(body)["action"]
    if isinstance(action, dict):
        return "Deny: " + (action["Deny"].get("reason") or "")[:60]
    return action


def main() -> None:
    ready, stop, report = sys.argv[1:4]
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    ctrl = socket.socket(fileno=int(os.environ["CODEX_ESCALATE_SOCKET"]))
    counts: dict[str, Counter[str]] = {kind: Counter() for kind in PAYLOADS}
    lock = threading.Lock()
    first = threading.Event()

    def flood() -> None:
        while not os.path.exists(stop):
            for kind, payload in PAYLOADS.items():
                outcome = one(ctrl, payload, first if kind == "path" else None)
                with lock:
                    counts[kind][outcome] += 1

    workers = [threading.Thread(target=flood) for _ in range(threads)]
    for worker in workers:
        worker.start()
    first.wait()
    with open(ready, "w") as f:
        f.write("flooding\n")
    for worker in workers:
        worker.join()
    with open(report, "w") as f:
        json.dump({kind: dict(c) for kind, c in counts.items()}, f)


if __name__ == "__main__":
    main()
