"""The session's own start is not a decision (issue #12 item 7): a rules file that denies every
program (``default = "deny"``) still gets its shell, in every sandbox and backstop mode, while
every exec of the script is decided — including a re-exec of the session's exact shell argv.
"""

from __future__ import annotations

import pytest

from run_support import audit_records, execgate, write_rules

pytestmark = pytest.mark.e2e

MODES = [
    pytest.param(("--sandbox", "bwrap", "--seccomp", "on"), id="bwrap-backstop"),
    pytest.param(("--sandbox", "bwrap", "--seccomp", "off"), id="bwrap-shim"),
    pytest.param(("--sandbox", "none", "--seccomp", "on"), id="none-backstop"),
    pytest.param(("--sandbox", "none", "--seccomp", "off"), id="none-shim"),
]


@pytest.mark.parametrize("mode", MODES)
def test_deny_everything_still_starts_the_shell_and_decides_the_script(tmp_path, mode):
    work = tmp_path / "work"
    work.mkdir()
    rules = write_rules(tmp_path / "deny.toml", 'default = "deny"\n')
    audit = tmp_path / "audit.jsonl"
    done = execgate("run", "-q", *mode, "--no-default-rules", "--rules", str(rules), "--audit-log", str(audit),
                    "--cwd", str(work), "--", "echo started; /bin/true; echo true=$?", cwd=work)
    assert done.stdout == "started\ntrue=1\n", done.stdout + done.stderr
    assert "Execution denied: no rule matched /bin/true; default: deny" in done.stderr
    records = audit_records(audit)
    # The start was never put to the policy; the script's exec was, and was denied.
    assert [(r["program"], r["decision"]) for r in records] == [("/bin/true", "deny")], records


@pytest.mark.parametrize("mode", MODES[:2])
def test_a_reexec_of_the_session_shell_argv_is_decided(tmp_path, mode):
    """The script re-execs exactly the argv execgate started it with (``$0 -c
    "$BASH_EXECUTION_STRING"``): the exemption is spent, so under deny-all that exec is denied
    and the script runs once, not twice."""
    work = tmp_path / "work"
    work.mkdir()
    rules = write_rules(tmp_path / "deny.toml", 'default = "deny"\n')
    audit = tmp_path / "audit.jsonl"
    script = 'echo started; exec "$0" -c "$BASH_EXECUTION_STRING"'
    done = execgate("run", "-q", *mode, "--no-default-rules", "--rules", str(rules), "--audit-log", str(audit),
                    "--cwd", str(work), "--", script, cwd=work)
    assert done.stdout == "started\n", done.stdout + done.stderr
    assert done.returncode != 0
    assert "Execution denied: no rule matched" in done.stderr
    denied = [r for r in audit_records(audit) if r["decision"] == "deny"]
    assert len(denied) == 1 and denied[0]["argv"][1:] == ["-c", script], denied
