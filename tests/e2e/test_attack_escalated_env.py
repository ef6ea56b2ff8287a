"""Attack: an escalated command runs the session's code through its environment (issue #9 class 5).

Each test runs ``execgate run`` for real (bwrap, the preload shim), as root and as an
unprivileged user, with a rule that escalates a root-owned program outside the sandbox. The
script sets variables that no denylist named (``GIT_DIR``, ``PATH``) so that the escalated
program runs a marker it wrote; the escalated environment is built from an allowlist, so the
marker must never run, while the escalation itself still happens (control).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from attack_support import Attacker, sandboxed_run

pytestmark = pytest.mark.e2e

GIT = shutil.which("git") or "/usr/bin/git"
ENV = shutil.which("env") or "/usr/bin/env"

RULES = f"""
[[rule]]
id = "git-status-outside"
program = "{GIT}"
prefix = ["status"]
decision = "escalate"
execution = "unsandboxed"
justification = "git status may read outside the sandbox"

[[rule]]
id = "env-true-outside"
program = "{ENV}"
prefix = ["true"]
decision = "escalate"
execution = "unsandboxed"
justification = "stands for any escalated program that runs a helper by name"
"""


def _run(attacker: Attacker, script: str) -> subprocess.CompletedProcess[str]:
    return sandboxed_run(attacker, RULES, script)


def test_git_dir_does_not_reach_an_escalated_git(attacker: Attacker) -> None:
    """``GIT_DIR`` names a repository whose config runs ``core.fsmonitor`` = the marker."""
    work = attacker.workdir()
    marker = attacker.marker_program(work, "fsmonitor")
    evil = work / "evil"
    done = subprocess.run([GIT, "init", "-q", str(evil)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    subprocess.run([GIT, "-C", str(evil), "config", "core.fsmonitor", str(marker)], check=True)
    subprocess.run(["chown", "-R", f"{attacker.uid}:{attacker.gid}", str(evil)], check=True)
    done = _run(attacker, f'GIT_DIR={evil}/.git {GIT} status; echo "status=$?"')
    assert not attacker.marker_ran("fsmonitor"), done.stdout + done.stderr
    # Control: git did escalate (and found no repository, since GIT_DIR did not reach it).
    assert "status=128" in done.stdout and "not a git repository" in done.stderr, done.stdout + done.stderr


def test_path_does_not_reach_an_escalated_command(attacker: Attacker) -> None:
    """``PATH`` puts the session's ``true`` first; the escalated ``env true`` must run /usr/bin's."""
    work = attacker.workdir()
    bin_dir = work / "bin"
    bin_dir.mkdir()
    attacker.marker_program(bin_dir, "true")
    subprocess.run(["chown", f"{attacker.uid}:{attacker.gid}", str(bin_dir)], check=True)
    done = _run(attacker, f'PATH={bin_dir}:$PATH {ENV} true; echo "status=$?"')
    assert not attacker.marker_ran("true"), done.stdout + done.stderr
    assert "status=0" in done.stdout, done.stdout + done.stderr
