"""Attack: program identity (issue #9 class 4). The file judged must be the file that executes, in
the caller's view.

Each test runs ``execgate run --sandbox bwrap`` for real (real bwrap, the preload shim, the native
wrapper), as root and as an unprivileged user, and names a marker program (it writes
``markers/NAME`` when it runs) by a route that the policy service used to resolve in *its own*
filesystem view: ``/dev/fd/3``, ``/proc/self/fd/N``, ``/proc/self/cwd/...``, a symlink in the
sandbox's private ``/tmp``. A deny rule on the marker must hold on every route. Two more routes
try to borrow a trusted basename escalation: a copy under the sandbox's private ``/dev``, and, for
a root session, ``./git`` in a root-owned working directory (root can write it there).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from attack_support import Attacker
from execgate.server.sandbox import bwrap_usable

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")]

DENY_MARK = """
[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"
"""

ESCALATE_GIT = """
[[rule]]
id = "git-outside"
program = "git"
decision = "escalate"
execution = "unsandboxed"
justification = "a trusted git may run outside the sandbox"
"""


#: ``--seccomp`` of every session of the running test (set by the ``interception`` fixture).
_SECCOMP = ["on"]


@pytest.fixture(autouse=True, params=["on", "off"], ids=["backstop", "shim-only"])
def interception(request):
    """Every identity attack runs with the seccomp backstop on and off: the identity mechanism
    (the wrapper's fd, the server's walk in the caller's view) must hold on its own, not only
    because the backstop re-checks the exec."""
    _SECCOMP[0] = request.param
    return request.param


def _run(attacker: Attacker, rules: str, script: str,
         cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """``execgate run`` of ``script`` with ``rules`` (``--seccomp`` as the ``interception``
    fixture says); returns the result and the audit records."""
    work = cwd or attacker.workdir()
    rules_file = attacker.workdir() / "rules.toml"
    rules_file.write_text(rules)
    audit = attacker.workdir() / "audit.jsonl"
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--seccomp", _SECCOMP[0],
                             "--rules", str(rules_file),
                             "--audit-log", str(audit), "--cwd", str(work), "--", script, cwd=work)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, records


def _assert_denied(attacker: Attacker, done: subprocess.CompletedProcess[str], route: str) -> None:
    out = done.stdout + done.stderr
    assert not attacker.marker_ran("mark"), f"marker ran through {route}: {out}"
    assert "Execution denied: the marker must never run" in done.stderr, out
    assert "status=1" in done.stdout, out  # the script went on after the denial


def test_dev_fd_cannot_dodge_a_deny(attacker: Attacker) -> None:
    marker = attacker.marker_program(attacker.workdir(), "mark")
    done, _ = _run(attacker, DENY_MARK, f'exec 3<"{marker}"; /dev/fd/3; echo "status=$?"')
    _assert_denied(attacker, done, "/dev/fd/3")


def test_proc_self_fd_cannot_dodge_a_deny(attacker: Attacker) -> None:
    marker = attacker.marker_program(attacker.workdir(), "mark")
    done, _ = _run(attacker, DENY_MARK, f'exec 7<"{marker}"; /proc/self/fd/7; echo "status=$?"')
    _assert_denied(attacker, done, "/proc/self/fd/7")


def test_proc_self_cwd_cannot_dodge_a_deny(attacker: Attacker) -> None:
    work = attacker.workdir()
    attacker.marker_program(work, "mark")
    # sub/git -> ../mark, run from sub: the service resolved /proc/self/cwd in its own process
    # (whose working directory is not sub), never reaching mark.
    script = 'mkdir sub && cd sub && ln -s ../mark git && /proc/self/cwd/git; echo "status=$?"'
    done, _ = _run(attacker, DENY_MARK, script)
    _assert_denied(attacker, done, "/proc/self/cwd/git")


def test_symlink_in_private_tmp_cannot_dodge_a_deny(attacker: Attacker) -> None:
    marker = attacker.marker_program(attacker.workdir(), "mark")
    done, _ = _run(attacker, DENY_MARK, f'ln -s "{marker}" /tmp/x && /tmp/x; echo "status=$?"')
    _assert_denied(attacker, done, "a symlink /tmp/x in the private /tmp")


def test_copy_under_private_dev_borrows_no_escalation(attacker: Attacker) -> None:
    marker = attacker.marker_program(attacker.workdir(), "mark")
    script = f'cp "{marker}" /dev/git && echo copied; /dev/git; echo "status=$?"'
    done, records = _run(attacker, ESCALATE_GIT, script)
    out = done.stdout + done.stderr
    # The sandbox's /dev is a private tmpfs that both attackers can write: the route is open.
    assert "copied" in done.stdout, f"the sandbox's /dev is not writable for {attacker.name}: {out}"
    ours = [r for r in records if r["program"] == "/dev/git"]
    assert ours, (records, out)  # the exec was decided
    assert all(r["decision"] != "escalate" and r["rule_id"] != "git-outside" for r in ours), (ours, out)
    # It ran where it was, inside the sandbox, as any untrusted program would.
    assert attacker.marker_ran("mark") and "status=0" in done.stdout, out


@pytest.fixture
def root_owned_workdir(attacker: Attacker):
    """A working directory whose whole chain is root-owned and 0755 (``/srv/eg-atk-*``: /srv is
    root-owned and, unlike /var/lib, not a system directory a session may not work in), and a
    root-owned directory outside every session root where only an unconfined process can write."""
    assert attacker.is_root, "the root-owned working directory route is a root session's"
    work = Path(tempfile.mkdtemp(prefix="eg-atk-", dir="/srv"))
    outside = Path(tempfile.mkdtemp(prefix="eg-out-", dir="/srv"))
    work.chmod(0o755)
    outside.chmod(0o755)
    try:
        yield work, outside
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)


@pytest.mark.parametrize("attacker", ["root"], indirect=True)  # a root session's route (see the fixture)
def test_dot_git_in_root_owned_workdir_borrows_no_escalation(attacker: Attacker, root_owned_workdir) -> None:
    work, outside = root_owned_workdir
    escaped = outside / "escaped"
    script = (f"printf '#!/bin/sh\\necho ran > {escaped}\\necho ran-somewhere\\n' > git && chmod 755 git && "
              './git; echo "status=$?"')
    done, records = _run(attacker, ESCALATE_GIT, script, cwd=work)
    out = done.stdout + done.stderr
    assert not escaped.exists(), f"./git escalated unconfined: {out}"
    ours = [r for r in records if r["program"] == str(work / "git")]
    assert ours and all(r["decision"] != "escalate" for r in ours), (records, out)
    # Control: ./git did run, in the sandbox, where the root filesystem is read-only.
    assert "ran-somewhere" in done.stdout, out


@pytest.mark.parametrize("interception", ["on"], indirect=True)  # the backstop's own behaviour
def test_backstop_sees_the_wrappers_fd_exec_as_the_approved_one(attacker: Attacker) -> None:
    """With the seccomp backstop on, the wrapper's ``execveat(fd, "", AT_EMPTY_PATH)`` of an
    approved file continues undecided: one audit line per exec, none for ``/proc/PID/fd/N``."""
    done, records = _run(attacker, DENY_MARK, '/usr/bin/env true; echo "status=$?"')
    assert "status=0" in done.stdout, done.stdout + done.stderr
    names = [Path(r["program"]).name for r in records]
    assert names.count("env") == 1 and names.count("true") == 1, records
    assert not any(r["program"].startswith("/proc/") for r in records), records
