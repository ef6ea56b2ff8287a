"""What a session names cannot draw on the user's terminal through execgate's own lines (found by
review, 2026-12-01): a note (why a program a rule would escalate stays in the sandbox) names the
program's path, which the session chooses; with an escape sequence in a directory name it cleared
the screen and painted a fake approval question while the real one waited. Notes and log lines
now show control characters escaped (:func:`execgate.server.printable.visible`)."""

from __future__ import annotations

from attack_support import attacker  # noqa: F401  (fixture)

SCRIPT = r"""D=$(printf 'x\033[2J\033[H\033[31mFAKE-QUESTION\033[0m')
mkdir -p "$D" && cp /bin/true "$D/pip" && "./$D/pip" install foo; echo status=$?"""


def test_a_note_naming_a_hostile_path_is_shown_escaped(attacker):
    done = attacker.execgate("run", "--", SCRIPT, cwd=attacker.workdir())
    assert "status=0" in done.stdout, done.stdout + done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("execgate: note:")]
    assert notes and any("FAKE-QUESTION" in line for line in notes), done.stderr
    assert "\x1b" not in done.stderr, repr(done.stderr)
    assert "\\x1b[2J" in done.stderr, done.stderr
