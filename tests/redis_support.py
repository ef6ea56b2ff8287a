"""A real ``redis-server`` for the replicated policy service's tests (a pytest plugin: the
fixture ``redis_server``).

Each test gets its own server on a free loopback port, in a temp dir, with no persistence
(``--save '' --appendonly no``), so no system service is needed: only Debian's
``redis-server`` package (scripts/setup.sh installs it). :meth:`RedisServer.kill` and
:meth:`RedisServer.start` restart it on the same port, empty, as a crash would leave it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:port``.

    Args:
        directory: its working directory (logs).
        password: if set, clients need it (``requirepass``).
    """

    def __init__(self, directory: Path, password: str | None = None) -> None:
        self.directory = directory
        self.port = free_port()
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:PORT/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start it and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not listen within ``timeout_s`` seconds.
        """
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.directory), "--logfile", str(self.directory / "redis.log")]
        if self.password:
            argv += ["--requirepass", self.password]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.directory}/redis.log")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not listen on port {self.port} within {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL it and reap it (its data is gone: nothing is persisted)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def redis_server():
    """A started :class:`RedisServer` (skipped without ``redis-server``), killed afterwards."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian package redis-server; scripts/setup.sh)")
    directory = Path(tempfile.mkdtemp(prefix="eg-redis-", dir="/tmp"))
    server = RedisServer(directory)
    try:
        server.start()
        yield server
    finally:
        server.kill()
        shutil.rmtree(directory, ignore_errors=True)
