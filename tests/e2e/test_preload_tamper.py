"""A gated process cannot hand its children another wrapper or another server: the preload shim
forces the values it captured at load (``EXEC_WRAPPER``, ``CODEX_ESCALATE_SOCKET``,
``EXECGATE_SOCKET_PATH``, ``EXECGATE_SOCKET_ID``, ``EXECGATE_MAX_DEPTH``, its ``LD_PRELOAD``
entry) onto every exec, whatever the caller set. Each case runs in real shells under a real
EscalateServer; the denied marker must stay denied (status 1, the reason on stderr, the policy
saw it) and must never run. Fake servers the tests start must never be asked."""

from __future__ import annotations

import shutil
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from preload_support import DENIED, DENIED_OUTPUT, DENY_REASON, Gate, write_script
from execgate.wrapper.artifacts import native_wrapper_path

pytestmark = pytest.mark.e2e

PY = sys.executable
SHELLS = ["bash", "dash"]
RUN_FRAME = b'{"action":"Run"}'


def _frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


def _check_denied(gate: Gate, res, times: int = 1) -> None:
    assert DENIED_OUTPUT not in res.stdout, (res.stdout, res.stderr)
    assert res.stdout.count("denied-status=1") == times, (res.stdout, res.stderr)
    assert res.stderr.count(f"Execution denied: {DENY_REASON}") == times, res.stderr
    assert gate.policy.programs().count(str(gate.bindir / DENIED)) == times, gate.policy.calls


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    if shutil.which(request.param) is None:
        pytest.skip(f"{request.param} is not installed")
    return request.param


class FakeStreamServer:
    """A fake escalation server on a path: answers Run to anything; records every connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connections = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            with conn:
                try:
                    conn.settimeout(5)
                    conn.recv(1 << 20)
                    conn.sendall(_frame(RUN_FRAME))
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


@pytest.fixture
def fake_server(gate: Gate) -> Iterator[FakeStreamServer]:
    server = FakeStreamServer(gate.socket_dir.parent / "fake.sock")
    try:
        yield server
    finally:
        server.close()


# ---- (a), (b): a changed EXEC_WRAPPER / LD_PRELOAD for a child shell ---------------------------

@pytest.mark.parametrize("fake_wrapper", ["marker", "/usr/bin/env"])
def test_exec_wrapper_set_for_a_child_shell(gate: Gate, shell: str, fake_wrapper: str) -> None:
    value = '"$(command -v ' + DENIED + ')"' if fake_wrapper == "marker" else fake_wrapper
    res = gate.run(shell, f"EXEC_WRAPPER={value} {shell} -c '{DENIED}; echo \"denied-status=$?\"'")
    _check_denied(gate, res)


@pytest.mark.parametrize("preload", ["libm.so.6", "", "/nonexistent/other.so"])
def test_exec_wrapper_and_ld_preload_set_for_a_child_shell(gate: Gate, shell: str, preload: str) -> None:
    script = (
        f"EXEC_WRAPPER=\"$(command -v {DENIED})\" LD_PRELOAD='{preload}' "
        f"{shell} -c '{DENIED}; echo \"denied-status=$?\"; echo \"child-wrapper=$EXEC_WRAPPER\"'"
    )
    res = gate.run(shell, script)
    _check_denied(gate, res)
    # The child shell got the session's wrapper back, not the caller's value.
    assert f"child-wrapper={native_wrapper_path()}" in res.stdout


# ---- (c): the inherited socket closed, the fallback path pointed at a fake server ------------

def test_fallback_socket_path_redirect(gate: Gate, shell: str, fake_server: FakeStreamServer) -> None:
    fake = fake_server.path
    script = (
        f'EXECGATE_SOCKET_PATH={fake} {DENIED}; echo "denied-status=$?"; '
        f'export EXECGATE_SOCKET_PATH={fake}; {DENIED}; echo "denied-status=$?"; '
        # The wrapper exec'd directly by the caller gets the session's socket path too.
        f'{native_wrapper_path()} "$(command -v {DENIED})" {DENIED}; echo "denied-status=$?"'
    )
    if shell == "bash":
        res = gate.run(shell, f'eval "exec $CODEX_ESCALATE_SOCKET>&-"; {script}')
    else:  # dash's redirections take one-digit fds only: close it before exec'ing dash
        res = gate.run(shell, (
            f"{PY} -c 'import os, sys; os.close(int(os.environ[\"CODEX_ESCALATE_SOCKET\"])); "
            f"os.execvp(\"dash\", [\"dash\", \"-c\", sys.argv[1]])' '{script}'"
        ))
    _check_denied(gate, res, times=3)
    assert fake_server.connections == 0


def test_fallback_socket_path_redirect_from_python(gate: Gate, fake_server: FakeStreamServer) -> None:
    # subprocess closes the inherited socket in the child (close_fds) and passes the fake path.
    script = (
        f"{PY} -c 'import os, shutil, subprocess\n"
        f"r = subprocess.run([shutil.which(\"{DENIED}\")], env={{**os.environ, \"EXECGATE_SOCKET_PATH\": \"{fake_server.path}\"}})\n"
        "print(\"denied-status=%d\" % r.returncode)'"
    )
    res = gate.run("bash", script)
    _check_denied(gate, res)
    assert fake_server.connections == 0


# ---- (d): CODEX_ESCALATE_SOCKET pointed at another datagram socket ----------------------------

FAKE_DGRAM = '''\
import os, socket, struct, subprocess, sys, threading
shell, script, log = sys.argv[1], sys.argv[2], sys.argv[3]
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
def serve():
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(ours, 16, 4)
        except OSError:
            return
        with open(log, "a") as f:
            f.write("handshake\\n")
        for fd in fds:
            with socket.socket(fileno=fd) as s:
                s.recv(1 << 20)
                s.sendall(struct.pack("<I", 16) + b'{"action":"Run"}')
threading.Thread(target=serve, daemon=True).start()
fd = theirs.fileno()
os.set_inheritable(fd, True)
ino = os.fstat(fd).st_ino
r = subprocess.run([shell, "-c", script, "fake", str(fd), f"{fd}:{ino}"], close_fds=False)
sys.exit(r.returncode)
'''


def test_escalate_socket_pointed_at_another_datagram_socket(gate: Gate, shell: str) -> None:
    helper = write_script(gate.workdir / "fake_dgram.py", FAKE_DGRAM, 0o644)
    log = gate.workdir / "fake.log"
    inner = (
        f'CODEX_ESCALATE_SOCKET=$1 {DENIED}; echo "denied-status=$?"; '
        f'CODEX_ESCALATE_SOCKET=$1 EXECGATE_SOCKET_ID=$2 {DENIED}; echo "denied-status=$?"'
    )
    res = gate.run(shell, f"{PY} {helper} {shell} '{inner}' {log}")
    _check_denied(gate, res, times=2)
    assert not log.exists(), log.read_text()


# ---- (e): env(1) and os.execve with a changed EXEC_WRAPPER -------------------------------------

@pytest.mark.parametrize("fake_wrapper", ["marker", "/usr/bin/env"])
def test_env_and_execve_with_exec_wrapper(gate: Gate, shell: str, fake_wrapper: str) -> None:
    value = f'"$(command -v {DENIED})"' if fake_wrapper == "marker" else fake_wrapper
    script = (
        f'env EXEC_WRAPPER={value} {DENIED}; echo "denied-status=$?"; '
        f"w={value}; {PY} -c 'import os, shutil, sys\n"
        f"m = shutil.which(\"{DENIED}\")\n"
        "os.execve(m, [m], {\"EXEC_WRAPPER\": sys.argv[1], \"LD_PRELOAD\": \"\"})' \"$w\"; "
        'echo "denied-status=$?"; '
        # The same for a shell exec'd with the changed variable (it would load the caller's value).
        f"{PY} -c 'import os, sys\n"
        f"os.execve(\"/bin/sh\", [\"sh\", \"-c\", \"{DENIED}; echo denied-status=$?\"], "
        "{\"EXEC_WRAPPER\": sys.argv[1], \"PATH\": os.environ[\"PATH\"]})' \"$w\""
    )
    res = gate.run(shell, script)
    _check_denied(gate, res, times=3)


def test_max_depth_cannot_be_raised_by_a_child(gate: Gate) -> None:
    # EXECGATE_MAX_DEPTH is forced like the others: a caller cannot lift the session's limit.
    nest = "EXECGATE_MAX_DEPTH=1000 sh -c 'sh -c \"sh -c true; echo inner-status=\\$?\"'"
    res = gate.run("sh", nest, env={"EXECGATE_MAX_DEPTH": "2"})
    assert "exec depth limit reached" in res.stderr
    assert "inner-status=126" in res.stdout
