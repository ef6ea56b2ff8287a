"""The shell sandbox: real bubblewrap, observed from inside."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from execgate.server.policy import Permissions
from execgate.server.sandbox import SandboxError, bwrap_argv, bwrap_usable, choose_sandbox

pytestmark = pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_workdir_writable_root_read_only(short_tmp):
    sandbox = choose_sandbox("bwrap", workdir=str(short_tmp))
    script = "touch ok && echo wrote; touch /etc/eg-nope 2>/dev/null || echo root-ro; touch /tmp/t && echo tmp-ok"
    done = _run(sandbox.launch_argv(["/bin/sh", "-c", script], cwd=str(short_tmp)))
    assert done.stdout.split() == ["wrote", "root-ro", "tmp-ok"], done.stderr
    assert (short_tmp / "ok").exists()


def test_no_network_in_shell_sandbox(short_tmp):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        sandbox = choose_sandbox("bwrap", workdir=str(short_tmp))
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
        inside = _run(sandbox.launch_argv(["python3", "-c", probe], cwd=str(short_tmp)))
        outside = _run(["python3", "-c", probe])
    finally:
        listener.close()
    assert outside.returncode == 0, outside.stderr
    assert inside.returncode != 0
    assert "ConnectionRefusedError" in inside.stderr


def test_network_permission_keeps_network(short_tmp):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        argv = bwrap_argv(Permissions(network=True, writable_roots=(str(short_tmp),)), cwd=str(short_tmp))
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
        done = _run(argv + ["python3", "-c", probe])
    finally:
        listener.close()
    assert done.returncode == 0, done.stderr


def test_none_mode_is_unconfined(short_tmp):
    sandbox = choose_sandbox("none", workdir=str(short_tmp))
    assert sandbox.permissions is None
    assert sandbox.launch_argv(["sh", "-c", "true"], cwd=str(short_tmp)) == ["sh", "-c", "true"]


def test_bwrap_missing_is_an_error_for_bwrap_and_a_fallback_for_auto(short_tmp):
    with pytest.raises(SandboxError, match="not found"):
        choose_sandbox("bwrap", workdir=str(short_tmp), bwrap_dirs=(str(short_tmp),))
    auto = choose_sandbox("auto", workdir=str(short_tmp), bwrap_dirs=(str(short_tmp),))
    assert auto.mode == "none" and "not found" in auto.note


def _pids_with_cmdline(needle: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_killing_bwrap_kills_grandchildren_that_left_the_group(short_tmp):
    token = f"4{os.getpid()}.{time.monotonic_ns() % 100000}".encode()
    argv = bwrap_argv(Permissions(writable_roots=(str(short_tmp),)), cwd=str(short_tmp)) + ["/bin/sh", "-c", f"setsid sleep {token.decode()} & wait"]
    proc = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 20
        while not _pids_with_cmdline(b"sleep\0" + token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _pids_with_cmdline(b"sleep\0" + token), "the detached sleep started"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while _pids_with_cmdline(b"sleep\0" + token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pids_with_cmdline(b"sleep\0" + token) == []
