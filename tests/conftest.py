"""Shared fixtures: every async test runs on asyncio and on asyncio+uvloop (anyio's pytest plugin)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


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
