"""A git workflow under ``execgate run --sandbox bwrap``: commits stay in the sandbox's writable
working directory; a push to a bare repository outside it fails when the rules keep ``git push``
in the sandbox, and lands when a rule escalates it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from run_support import audit_records, execgate, git, write_rules

pytestmark = pytest.mark.e2e

COMMIT = "git -c user.name=agent -c user.email=agent@example.org commit -q"
SCRIPT = (
    "set -e; git init -q -b main; echo one > a.txt; git add a.txt; "
    f"{COMMIT} -m first; echo two >> a.txt; {COMMIT} -am second; "
    "git rev-parse HEAD > head.txt; git rev-list --count HEAD"
)


@pytest.fixture
def bare_repo():
    """A bare repository under /var/tmp: visible (read-only) in the sandbox, which has a private
    /tmp and only the working directory writable."""
    base = Path(tempfile.mkdtemp(prefix="eg-bare-", dir="/var/tmp"))
    try:
        assert git("init", "-q", "--bare", "-b", "main", str(base / "bare.git")).returncode == 0
        yield base / "bare.git"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def push_rules(path: Path, decision: str) -> Path:
    execution = 'execution = "unsandboxed"\n' if decision == "escalate" else ""
    return write_rules(path, f"""
[[rule]]
id = "push-{decision}"
program = "git"
prefix = ["push"]
decision = "{decision}"
{execution}match = ["git push origin main"]
not_match = ["git commit -m push"]
""")


@pytest.mark.parametrize("decision", ["run", "escalate"])
def test_git_commit_in_sandbox_and_push_out_only_when_escalated(tmp_path, bare_repo, decision):
    work = tmp_path / "work"
    work.mkdir()
    rules = push_rules(tmp_path / "rules.toml", decision)
    log = tmp_path / "audit.jsonl"

    done = execgate("run", "--sandbox", "bwrap", "--rules", str(rules), "--audit-log", str(log),
                    "--cwd", str(work), "--", SCRIPT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "2\n"
    head = (work / "head.txt").read_text().strip()
    assert git("rev-parse", "HEAD", cwd=work).stdout.strip() == head

    pushed = execgate("run", "--sandbox", "bwrap", "--rules", str(rules), "--audit-log", str(log),
                      "--cwd", str(work), "--", f"git push -q {bare_repo} main; echo push-status=$?")
    refs = git("--git-dir", str(bare_repo), "rev-parse", "--verify", "-q", "main")
    last_push = [r for r in audit_records(log) if r["argv"][:2] == ["git", "push"]]
    assert [(r["decision"], r["rule_id"]) for r in last_push] == [(decision, f"push-{decision}")]
    if decision == "run":
        assert "push-status=0" not in pushed.stdout, pushed.stderr
        assert "remote rejected" in pushed.stderr  # the repository is there, read-only
        assert refs.returncode != 0 and refs.stdout == ""
    else:
        assert "push-status=0" in pushed.stdout, pushed.stderr
        assert refs.stdout.strip() == head
