"""Parallel builds are never refused for being parallel (issue #12): a script under ``execgate run``
with 100 escalated ``sleep``s and 300 background ``true``s in flight at once gets every exec
answered (queued, not denied), every status 0, and nothing from execgate on its stderr."""

from __future__ import annotations

import pytest

from run_support import audit_records, execgate, write_rules

pytestmark = pytest.mark.e2e

SLEEPS = 100
TRUES = 300

RULES = """
default = "run"

# By absolute path: the session is root's with --sandbox none, which can rewrite /usr/bin itself,
# so no basename rule trusts what it runs (docs/DESIGN.md §5); an absolute path is the
# operator's word for exactly that file.
[[rule]]
id = "sleep-out"
program = "/usr/bin/sleep"
decision = "escalate"
execution = "unsandboxed"
"""

# Every job reports "<kind> <status>" on stdout; the script waits for all of them. The sleeps are
# started first so that all of them are running (escalated, waiting on their child) while the
# trues ask for their decisions.
SCRIPT = f"""
for i in $(seq {SLEEPS}); do (/usr/bin/sleep 2; echo "sleep $?") & done
for i in $(seq {TRUES}); do (/bin/true; echo "true $?") & done
wait
"""


@pytest.mark.parametrize("wrapper", ["native", "python"])
def test_parallel_escalated_and_background_execs_are_all_answered(tmp_path, wrapper):
    rules = write_rules(tmp_path / "rules.toml", RULES)
    log = tmp_path / "audit.jsonl"
    done = execgate("run", "-q", "--sandbox", "none", "--wrapper", wrapper, "--rules", str(rules),
                    "--audit-log", str(log), "--cwd", str(tmp_path), "--", SCRIPT, timeout=600)
    lines = done.stdout.splitlines()
    assert done.stderr == ""  # no "Execution denied", no execgate WARNING
    assert done.returncode == 0
    assert sorted(set(lines)) == ["sleep 0", "true 0"], lines
    assert (lines.count("sleep 0"), lines.count("true 0")) == (SLEEPS, TRUES)
    names = {"/usr/bin/sleep": "sleep", "/bin/true": "true"}  # `true` alone is a bash builtin: no exec
    decisions = [(names[r["argv"][0]], r["decision"]) for r in audit_records(log) if r["argv"][0] in names]
    assert decisions.count(("sleep", "escalate")) == SLEEPS
    assert decisions.count(("true", "run")) == TRUES
    assert len(decisions) == SLEEPS + TRUES
