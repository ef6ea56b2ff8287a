"""Attack C: a session's request draws over its own question on the user's terminal
(docs/DESIGN.md §8, Approvers).

``execgate run`` runs on a real pty (the user's terminal) with its built-in terminal approver, as
root and as an unprivileged user, with a ``prompt`` rule for ``find``. The session runs the
reviewer's reproducer: it makes a working directory whose name moves the cursor up, erases the
line and redraws a harmless ``argv:``/``cwd:`` pair, and runs ``find . -maxdepth 0 -exec
../pwned ;`` from there. Raw, the question would read as a ``find -name '*.log'`` in
``/tmp/w4``. The question on the terminal must hold no control character from the request, show
the real argv and the escaped directory, and flag the request; the person denies and the marker
never runs.
"""

from __future__ import annotations

import sys

import pytest

from attack_support import Attacker
from pty_support import PROMPT_FIND_RULES, PtyUser

pytestmark = pytest.mark.e2e

QUESTION = "[y] once  [s] for session  [n] deny > "
HEADER = "execgate: a command needs your approval"

RULES = PROMPT_FIND_RULES

SCRIPT = (
    """D=$(printf "\\033[1A\\r\\033[2K   argv:    find . -name '*.log' -mtime +7\\n\\r\\033[2K   cwd:     /tmp/w4"); """
    """mkdir -p "$D" && cd "$D" && find . -maxdepth 0 -exec ../pwned ';'; echo "find=$?" """
)


def test_a_request_cannot_redraw_its_question_on_the_terminal(attacker: Attacker) -> None:
    work = attacker.workdir()
    attacker.marker_program(work, "pwned")
    rules = work / "rules.toml"
    rules.write_text(RULES)
    user = PtyUser(owner=(attacker.uid, attacker.gid))
    user.start([sys.executable, "-m", "execgate.server.cli", "run", "--sandbox", "bwrap", "--rules", str(rules),
                "--approval-timeout", "60", "--cwd", str(work), "--", SCRIPT],
               cwd=str(work), env=attacker.env(), wrap=attacker.command)
    try:
        user.expect(QUESTION.replace("[", r"\[").replace("]", r"\]"), timeout=90)
        user.type("n\r")
        user.expect(r"reason \(optional\) > ", timeout=30)
        user.type("spoofed directory\r")
        user.expect(r"find=\d", timeout=60)
        status = user.wait()
    finally:
        user.close()
    text = user.text()
    assert status == 0, text
    assert not attacker.marker_ran("pwned") and "MARKER pwned RAN" not in text, text
    assert "find=1" in text, text
    # The question, as the terminal received it: lines of printable text only (the pty turns
    # each newline into CR LF).
    _, header, rest = text.partition(HEADER)
    question, asked, _ = rest.partition(QUESTION)
    assert header and asked, text
    lines = question.replace("\r\n", "\n")
    bad = sorted({hex(ord(c)) for c in lines if not c.isprintable() and c != "\n"})
    assert not bad, (bad, question)
    assert "   WARNING: this request contains control characters, shown escaped" in lines, lines
    assert "   argv:    find . -maxdepth 0 -exec ../pwned ';'\n" in lines, lines
    assert ("\\x1b[1A\\x0d\\x1b[2K   argv:    find . -name '*.log' -mtime +7\\x0a\\x0d\\x1b[2K   cwd:     "
            "/tmp/w4\n") in lines, lines
    assert lines.count("   cwd:     ") == 2 and lines.count("   argv:    ") == 2  # the real ones lead their lines
    assert [line[:12] for line in lines.split("\n") if line.startswith("   argv:")] == ["   argv:    "]
