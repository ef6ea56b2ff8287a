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

from preload_support import ALLOWED, ALLOWED_OUTPUT, DENIED, DENIED_OUTPUT, DENY_REASON, Gate, write_script
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


# ---- (f): glibc's system(), popen() and wordexp() after the caller edited its own environ -------
# They start /bin/sh through libc-internal calls the shim cannot interpose, with the process's
# current environ. The shim interposes system() and popen() and forces the session's values back
# into environ first; EXECGATE_IN_WRAPPER switches on passthrough only in the wrapper process.

TAMPER = {
    "in_wrapper": 'os.environ["EXECGATE_IN_WRAPPER"] = "1"',
    "ld_preload_dropped": 'os.environ.pop("LD_PRELOAD")',
    "exec_wrapper": 'os.environ["EXEC_WRAPPER"] = sys.argv[1]',
}
FAKE_WRAPPER_OUTPUT = "FAKE-WRAPPER-RAN"

LIBC_PROLOGUE = '''\
import ctypes, os, sys
libc = ctypes.CDLL(None)  # the global scope, as a C program's own calls resolve (shim first)
libc.popen.restype = ctypes.c_void_p
libc.popen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.pclose.argtypes = [ctypes.c_void_p]
libc.fileno.argtypes = [ctypes.c_void_p]

def popen(cmd):
    f = libc.popen(cmd.encode(), b"r")
    assert f, "popen failed"
    out = b""
    while chunk := os.read(libc.fileno(f), 4096):
        out += chunk
    return out.decode(), os.waitstatus_to_exitcode(libc.pclose(f))
'''


def _tamper_script(gate: Gate, tamper: str, body: str) -> str:
    helper = write_script(gate.workdir / "tamper.py", f"{LIBC_PROLOGUE}{TAMPER[tamper]}\n{body}", 0o644)
    fake = write_script(gate.workdir / "w.sh", f'#!/bin/sh\necho {FAKE_WRAPPER_OUTPUT}; shift; exec "$@"\n')
    return f"{PY} {helper} {fake}"


@pytest.mark.parametrize("tamper", sorted(TAMPER))
def test_system_after_environ_tampering(gate: Gate, tamper: str) -> None:
    body = f'print("denied-status=%d" % os.waitstatus_to_exitcode(os.system("{DENIED}")), flush=True)\n'
    res = gate.run("bash", _tamper_script(gate, tamper, body))
    _check_denied(gate, res)
    assert FAKE_WRAPPER_OUTPUT not in res.stdout, res.stdout


@pytest.mark.parametrize("tamper", sorted(TAMPER))
def test_popen_after_environ_tampering(gate: Gate, tamper: str) -> None:
    body = f'out, st = popen("{DENIED}")\nprint(repr(out))\nprint("denied-status=%d" % st, flush=True)\n'
    res = gate.run("bash", _tamper_script(gate, tamper, body))
    _check_denied(gate, res)
    assert FAKE_WRAPPER_OUTPUT not in res.stdout, res.stdout


def test_system_and_popen_still_run_allowed_programs(gate: Gate) -> None:
    body = (
        f'st = os.system("{ALLOWED} via-system")\n'
        'print("system-status=%d" % os.waitstatus_to_exitcode(st), flush=True)\n'
        f'st = os.system("{ALLOWED} again; exit 5")\n'
        'print("system-status=%d" % os.waitstatus_to_exitcode(st), flush=True)\n'
        f'out, st = popen("{ALLOWED} via-popen; exit 3")\n'
        'print("popen-out=" + out.strip(), "popen-status=%d" % st, flush=True)\n'
        # The C environ now holds the session's values, not the caller's marker.
        'libc.getenv.restype = ctypes.c_char_p\n'
        'print("in-wrapper=%s" % libc.getenv(b"EXECGATE_IN_WRAPPER"), flush=True)\n'
    )
    res = gate.run("bash", _tamper_script(gate, "in_wrapper", body))
    assert f"{ALLOWED_OUTPUT} via-system\nsystem-status=0\n" in res.stdout, (res.stdout, res.stderr)
    assert f"{ALLOWED_OUTPUT} again\nsystem-status=5\n" in res.stdout, (res.stdout, res.stderr)
    assert f"popen-out={ALLOWED_OUTPUT} via-popen popen-status=3" in res.stdout, (res.stdout, res.stderr)
    assert "in-wrapper=None" in res.stdout
    assert gate.policy.programs().count(str(gate.bindir / ALLOWED)) == 3, gate.policy.calls


def test_wordexp_shell_with_in_wrapper_marker_is_still_gated(gate: Gate) -> None:
    # wordexp() is not interposed: its /bin/sh gets the caller's EXECGATE_IN_WRAPPER=1. The shim
    # loaded in that shell must not treat it as the wrapper (it is not the EXEC_WRAPPER file).
    body = (
        "class W(ctypes.Structure):\n"
        "    _fields_ = [('wordc', ctypes.c_size_t), ('wordv', ctypes.POINTER(ctypes.c_char_p)),"
        " ('offs', ctypes.c_size_t)]\n"
        "w = W()\n"
        f"rc = libc.wordexp(b'x$({DENIED})', ctypes.byref(w), 16)  # WRDE_SHOWERR: keep stderr\n"
        "print('wordexp-rc=%d' % rc, [w.wordv[i] for i in range(w.wordc)], flush=True)\n"
    )
    res = gate.run("bash", _tamper_script(gate, "in_wrapper", body))
    assert DENIED_OUTPUT not in res.stdout, (res.stdout, res.stderr)
    assert "wordexp-rc=0 [b'x']" in res.stdout, (res.stdout, res.stderr)
    assert res.stderr.count(f"Execution denied: {DENY_REASON}") == 1, res.stderr
    assert gate.policy.programs().count(str(gate.bindir / DENIED)) == 1, gate.policy.calls
