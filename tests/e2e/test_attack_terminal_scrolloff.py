"""Attack (red team C): a request whose own fields push the real question's first lines off the
screen, so that what is left on screen is a fake question the session wrote *into* a field
(README "Prompts"; policy_service/approver.py ``describe``; server/terminal.py).

Every field is escaped (no control character reaches the terminal), but spaces and ordinary text
are not, and no field is cut: a long argv wraps over as many rows as it needs. The session knows
its window size (its pty has the user's), so it pads one argv element with spaces so that, once
wrapped, each screen row of the element's tail reads like a line of the question —
``program: /usr/bin/true``, ``argv:    true`` — and makes the element longer than the screen,
so that the real ``program:`` and ``argv:`` rows scroll off the top. The person at the terminal
sees the header, ``program:``, ``argv:`` of the fake, then the real cwd/session/rule/env/file rows
and the ``[y] once`` line: a harmless request. ``y`` approves ``find … -exec ./pwned``.

The question, as drawn (pyte, at the terminal's size), must show the real program line while it
waits for the answer (or refuse such a request, or cut the field so the real rows stay).
"""

from __future__ import annotations

import shlex
import shutil

import pytest

from attack_support import Attacker
from pty_support import PROMPT_FIND_RULES, QUESTION, deny_at_the_prompt, screen_rows

pytestmark = pytest.mark.e2e

ROWS, COLS = 30, 100
FIND = shutil.which("find") or "/usr/bin/find"
REAL_PROGRAM = f"   program: {FIND}"


FAKE_ROWS = ["execgate: a command needs your approval", "── approval 0123456789ab (60 s left)",
             "   program: /usr/bin/true", "   argv:    true"]


def _element(head: str) -> str:
    """An argv element that, after ``head`` on the question's argv row, wraps into blank rows
    (more than a screen of them) and then the fake rows, each filling a whole row."""
    used = len(head) % COLS
    pad = " " * ((COLS - used) % COLS + COLS * (ROWS + 2))
    fake = "".join(row.ljust(COLS) for row in FAKE_ROWS[:-1]) + FAKE_ROWS[-1].ljust(COLS - 1)
    return pad + fake


def test_a_long_field_cannot_push_the_real_program_line_off_the_screen(attacker: Attacker) -> None:
    work = attacker.workdir()
    attacker.marker_program(work, "pwned")
    argv = ["find", ".", "-maxdepth", "0", "-exec", "./pwned", ";", "-o", "-name"]
    head = "   argv:    " + shlex.join(argv) + " '"
    element = _element(head)
    script = (f"find . -maxdepth 0 -exec ./pwned ';' -o -name {shlex.quote(element)}; echo \"find=$?\"")
    raw = deny_at_the_prompt(attacker, PROMPT_FIND_RULES, script, reason="long field", rows=ROWS, cols=COLS)
    assert not attacker.marker_ran("pwned"), raw.decode(errors="replace")
    rows = screen_rows(raw[:raw.index(QUESTION.encode()) + len(QUESTION)], ROWS, COLS)
    shown = "\n".join(rows)
    assert REAL_PROGRAM in rows, (
        f"the question waiting for y/s/n shows no row {REAL_PROGRAM!r}; the person sees:\n{shown}")
    assert "   program: /usr/bin/true" not in rows, f"a fake program row is on screen:\n{shown}"
