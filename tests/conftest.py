"""Shared fixtures: every async test runs on asyncio and on asyncio+uvloop (anyio's pytest plugin)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# grpcio's core installs pthread_atfork handlers when fork support is on (its build default). A
# child forked by uvloop (libuv forks, it does not vfork) while a grpc thread is busy then logs
# "epoll_ctl failed: file descriptor was created pre fork" onto that child's stderr, which the
# tests read as the program's own output. execgate's server spawns through Popen (vfork), so only
# the tests' uvloop subprocesses fork with grpc loaded. The core reads this at its first init.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

#: The e2e fixture ``gate`` (real shells under the preload shim) lives in tests/preload_support.py.
pytest_plugins = ("preload_support", "attack_support", "redis_support")


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ]
)
def anyio_backend(request):
    return request.param


@pytest.fixture
def short_tmp():
    """A short temp dir (AF_UNIX paths are limited to 108 bytes); removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="eg-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def open_fd_count() -> int:
    """Number of fds open in this process, read from /proc/self/fd."""
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(params=["python", "native"])
def wrapper_kind(request):
    """Which execve wrapper a wrapper test runs against: the Python reference client or the native one."""
    return request.param


@pytest.fixture
def wrapper_path(wrapper_kind, tmp_path):
    """Absolute path of an executable that behaves as ``EXEC_WRAPPER`` (parametrised python/native)."""
    import sys

    if wrapper_kind == "native":
        from execgate.wrapper.artifacts import native_wrapper_path

        return str(native_wrapper_path())
    path = tmp_path / "execgate-wrapper"
    path.write_text(f"#!{sys.executable}\nimport sys\nfrom execgate.wrapper.client import main\nsys.exit(main())\n")
    path.chmod(0o755)
    return str(path)


def pytest_sessionfinish(session, exitstatus):
    """With EXECGATE_NO_SKIP=1 (set by .ci/run, which installs every tool the tests use), a
    skipped test fails the run: a tool that went missing must not turn tests into silent skips."""
    if os.environ.get("EXECGATE_NO_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        reporter.write_line(f"EXECGATE_NO_SKIP=1: {len(skipped)} test(s) skipped; every tool should be installed here", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
