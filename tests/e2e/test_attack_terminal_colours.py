"""Attack (red team C): the session sets the terminal's *default* colours (xterm OSC 10 and 11:
foreground and background, both black), draws a fake, harmless question in explicit colours
(SGR 97;44: white on blue, unaffected), then triggers the real prompt. ``SANE_TERMINAL``
(server/terminal.py) resets SGR attributes to the defaults — which are now black on black — and
never the dynamic colours themselves (OSC 110/111): on xterm, VTE (GNOME Terminal), kitty,
foot, iTerm2, Windows Terminal, the real question, the echo of the answer and "approved once" are
drawn invisible under the fake one, and ``y`` approves ``find … -exec ./pwned``.

pyte does not model dynamic colours, so the test follows the terminal's state in the byte stream:
after the session's last OSC 10/11, a reset (OSC 110 and 111, or RIS) must come before the
question's first line.
"""

from __future__ import annotations

import re

import pytest

from attack_support import Attacker
from pty_support import PROMPT_FIND_RULES, deny_at_the_prompt

pytestmark = pytest.mark.e2e

HEADER = b"a command needs your approval"


FAKE = (r"\033[97;44m\nexecgate: a command needs your approval\n   program: /usr/bin/find\n"
        r"   argv:    find . -name x\n   [y] once  [s] for session  [n] deny > \033[0m")
SET_COLOURS = r"\033]10;#000000\007\033]11;#000000\007"


def _colours_at(data: bytes) -> dict[str, bool]:
    """Which of the default foreground (10) and background (11) are left changed by ``data``."""
    changed = {"10": False, "11": False}
    for m in re.finditer(rb"\x1b\](11[01]|1[01])(?=[;\x07\x1b]);?[^\x07\x1b]*(?:\x07|\x1b\\)|\x1bc", data):
        if m.group(0) == b"\x1bc":
            changed = {"10": False, "11": False}
            continue
        code = m.group(1).decode()
        if code in ("10", "11"):
            changed[code] = True
        else:
            changed[{"110": "10", "111": "11"}[code]] = False
    return changed


def test_session_cannot_make_the_question_invisible_with_default_colours(attacker: Attacker) -> None:
    work = attacker.workdir()
    attacker.marker_program(work, "pwned")
    script = f"printf '{FAKE}{SET_COLOURS}'; find . -maxdepth 0 -exec ./pwned ';'; echo \"find=$?\""
    raw = deny_at_the_prompt(attacker, PROMPT_FIND_RULES, script, reason="colours", questions=2)  # the fake, then it
    assert not attacker.marker_ran("pwned"), raw.decode(errors="replace")
    real = raw.index(HEADER, raw.index(b"\x1b]11;"))
    left = _colours_at(raw[:real])
    assert not any(left.values()), (
        f"the real question is drawn with the session's default colours still set (OSC {left}: black on "
        f"black), no OSC 110/111 before it; bytes before the question: {raw[max(0, real - 200):real]!r}")
