"""A session cannot change the rules that judge it (issue #9 class 2, found by review on
2026-12-01): ``execgate run --rules FILE`` with FILE, or a rules directory, in the session's own
writable working directory. The embedded service used to re-read its rules files every second, so a
script that rewrote them turned its own denial into an unsandboxed escalation within the session.
Now the embedded service reads them once, at start.
"""

from __future__ import annotations

from attack_support import attacker  # noqa: F401  (fixture)

MARKER = "eg-rules-marker"
DENY = f"""[[rule]]
id = "marker-deny"
program = "{MARKER}"
decision = "deny"
justification = "the marker is denied"
"""
#: What the script writes over (or beside) the rules: the marker escalated, unsandboxed.
LOOSE = f"""[[rule]]
id = "marker-escalate"
program = "{MARKER}"
decision = "escalate"
execution = "unsandboxed"
justification = "rewritten by the session"
"""


def _attack(attacker, rules_arg: str, write: str) -> tuple[str, str]:
    work = attacker.workdir()
    marker = attacker.marker_program(work, MARKER)
    (work / "loose.toml").write_text(LOOSE)
    script = (f"{marker}; echo first=$?; {write}; sleep 3; {marker}; echo second=$?; "
              f"{marker}; echo third=$?")
    done = attacker.execgate("run", "--rules", rules_arg, "--", script, cwd=work)
    return done.stdout, done.stderr


def test_a_rules_file_rewritten_by_the_session_is_not_reloaded(attacker):
    work = attacker.workdir()
    (work / "rules.toml").write_text(DENY)
    (work / "rules.toml").chmod(0o666)
    out, err = _attack(attacker, str(work / "rules.toml"), "cat loose.toml > rules.toml")
    assert (work / "rules.toml").read_text() == LOOSE  # the session did rewrite it
    assert not attacker.marker_ran(MARKER), out + err
    assert "first=1" in out and "second=1" in out and "third=1" in out, out + err
    assert err.count("Execution denied: the marker is denied") == 3, err


def test_a_file_added_to_a_rules_directory_by_the_session_is_not_loaded(attacker):
    work = attacker.workdir()
    rules = work / "rules.d"
    rules.mkdir()
    rules.chmod(0o777)
    (rules / "10-deny.toml").write_text(DENY)
    out, err = _attack(attacker, str(rules), "cp loose.toml rules.d/00-loose.toml && rm -f rules.d/10-deny.toml")
    assert sorted(p.name for p in rules.iterdir()) == ["00-loose.toml"]  # the session did change it
    assert not attacker.marker_ran(MARKER), out + err
    assert "first=1" in out and "second=1" in out and "third=1" in out, out + err
