"""Attack: the session arranges the user's screen so that the approval question drawn after its
output shows something else than the request (README "Prompts"; server/terminal.py
``SANE_TERMINAL``). Companion of test_attack_terminal_state.py (open strings, concealed text,
line-drawing glyphs), for what only a screen model shows — the terminal stream is rendered by
pyte, a VT100/VT220 emulator, at the test terminal's size:

* ``overdraw``: the session fills the screen with lines that begin like the question's argv line
  and go on with harmless-looking text, then moves the cursor back up; the question's own lines
  are drawn over them, and where a line of the question is shorter the session's text showed on
  after it (``argv: rm -rf /`` read as ``argv: rm -rf /tmp/build-cache``);
* ``scroll``: the session sets a two-line scrolling region at the bottom (DECSTBM): each line of the
  question scrolls away inside those rows, only the last ones — the ``[y] once`` line —
  is left, under the fake question the session drew above.

The real request is ``find . -maxdepth 0 -exec ./pwned ;`` (escalated unsandboxed); the
question, once drawn, must have a screen row that is exactly its argv line. Both failed before
``SANE_TERMINAL`` reset the scrolling region and erased the screen below the cursor.
"""

from __future__ import annotations


import pytest

from attack_support import Attacker
from pty_support import PROMPT_FIND_RULES, QUESTION, deny_at_the_prompt, screen_rows

pytestmark = pytest.mark.e2e

ROWS, COLS = 30, 100
REAL_ARGV = "   argv:    find . -maxdepth 0 -exec ./pwned ';'"

RULES = PROMPT_FIND_RULES

# printf's format, inside the script's single quotes: \047 is the quote.
_FAKE_ROW = r"   argv:    find . -maxdepth 0 -exec ./pwned \047;\047 -o -name x -print  (dry run)\n"
ARRANGE = {
    # ROWS lines of the fake argv row (shorter than the screen is wide: one row each), then the
    # cursor back to the top.
    "overdraw": _FAKE_ROW * ROWS + rf"\033[{ROWS}A",
    # A fake question on the screen, then a scrolling region of the last two rows (the smallest
    # DECSTBM takes), the cursor there.
    "scroll": (r"\033[2J\033[H" + r"execgate: a command needs your approval\n   argv:    find . -name x\n"
               + rf"\033[{ROWS - 1};{ROWS}r\033[{ROWS};1H"),
}


@pytest.mark.parametrize("how", sorted(ARRANGE))
def test_session_cannot_arrange_the_screen_to_misshow_the_question(attacker: Attacker, how: str) -> None:
    work = attacker.workdir()
    attacker.marker_program(work, "pwned")
    script = f"printf '{ARRANGE[how]}'; find . -maxdepth 0 -exec ./pwned ';'; printf '\\033[r'; echo \"find=$?\""
    raw = deny_at_the_prompt(attacker, RULES, script, reason="arranged screen", rows=ROWS, cols=COLS)
    assert not attacker.marker_ran("pwned"), raw.decode(errors="replace")
    rows = screen_rows(raw[:raw.index(QUESTION.encode()) + len(QUESTION)], ROWS, COLS)
    assert REAL_ARGV in rows, (f"after the session's {how} arrangement no row of the screen is the question's "
                               f"argv line; the person sees:\n" + "\n".join(rows))
    assert rows.index(REAL_ARGV) < max(i for i, row in enumerate(rows) if QUESTION.strip() in row), rows
