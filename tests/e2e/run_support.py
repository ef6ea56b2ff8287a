"""Helpers for the ``execgate run`` end-to-end tests: the real CLI as a subprocess, rules files,
audit logs, and process checks through /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

#: The ``execgate`` command line of the interpreter running the tests.
CLI = (sys.executable, "-m", "execgate.server.cli")


def execgate(*args: str, cwd: str | os.PathLike[str] | None = None, timeout: float = 60,
             env: Mapping[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``execgate ARGS…`` to completion; stdout/stderr captured as text."""
    return subprocess.run(
        [*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
        env=None if env is None else dict(env), input=stdin,
    )


def write_rules(path: Path, text: str) -> Path:
    """Write a rules file (TOML) and return its path."""
    path.write_text(text)
    return path


def audit_records(path: Path) -> list[dict[str, Any]]:
    """Every line of an audit log, parsed (each line must be one JSON object)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def processes_with_argv(argv: Sequence[str]) -> list[int]:
    """Pids whose /proc/PID/cmdline is exactly ``argv`` (zombies have an empty cmdline)."""
    want = b"\0".join(a.encode() for a in argv) + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read() == want:
                    found.append(int(entry))
        except OSError:
            continue
    return found


def git(*args: str, cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run git outside any gate (for setting up and inspecting repositories)."""
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
