"""Attack (red team A): the session's own output leaves the user's terminal in a state that hides
or garbles the approval question that follows it, after drawing a fake, harmless one
(docs/DESIGN.md §8, Approvers; README "Prompts").

The request's fields are escaped (tests/e2e/test_attack_approver_display.py), but the question is
written onto the same terminal right after the bytes the session printed, which the relay copies
raw. The session prints a fake question — ``find . -name x`` — then opens a terminal state and
triggers the real prompt (``find . -maxdepth 0 -exec ./pwned ;``, escalated unsandboxed):

* ``osc``: an unterminated OSC string (``ESC ] 0 ;``, a window title): a terminal swallows every
  byte up to BEL or ST, so the whole real question, the echo of the answer and "approved once"
  never show; only the fake question is on screen, and ``y`` approves the real request;
* ``conceal``: SGR 8 (concealed text): the real question is printed invisible;
* ``charset``: ``ESC ( 0`` (DEC special graphics as G0): every lower-case letter of the real
  question is drawn as a line-drawing glyph.

Seen on 0bc5a1e: the bytes of the real question follow the session's ``ESC ] 0 ;`` (or
``ESC [ 8 m``, ``ESC ( 0``) with no terminator or reset in between. The question, as a VT100-class
terminal renders the stream, must show the real argv.
"""

from __future__ import annotations


import pytest

from attack_support import Attacker
from pty_support import PROMPT_FIND_RULES, QUESTION, deny_at_the_prompt

pytestmark = pytest.mark.e2e

REAL_ARGV = "argv:    find . -maxdepth 0 -exec ./pwned ';'"

RULES = PROMPT_FIND_RULES

HIDE = {"osc": r"\033]0;", "conceal": r"\033[8m", "charset": r"\033(0"}

FAKE = ("\\nexecgate: a command needs your approval\\n── approval 0123456789ab (60 s left)\\n"
        "   program: /usr/bin/find\\n   argv:    find . -name x\\n   cwd:     .\\n"
        "   [y] once  [s] for session  [n] deny > ")


def _render(data: bytes) -> str:
    """The text a VT100/xterm-class terminal shows for ``data`` (line structure kept as "\\n"):
    escape sequences consumed, OSC/DCS/APC/PM/SOS strings swallowed up to their terminator,
    concealed text (SGR 8) left out, DEC special graphics drawn as "#" for its remapped range."""
    text = data.decode("utf-8", "replace")
    out: list[str] = []
    state, params, concealed, g0_graphics, g1_graphics, shifted = "ground", "", False, False, False, False
    i = 0
    while i < len(text):
        ch = text[i]
        i += 1
        if state == "string":
            if ch in "\x07\x18\x1a":
                state = "ground"
            elif ch == "\x1b" and i < len(text) and text[i] == "\\":
                i += 1
                state = "ground"
            continue
        if state == "esc":
            if ch in "]P_^X":
                state = "string"
            elif ch == "[":
                state, params = "csi", ""
            elif ch in "()":
                designator = text[i] if i < len(text) else ""
                i += 1
                if ch == "(":
                    g0_graphics = designator == "0"
                else:
                    g1_graphics = designator == "0"
                state = "ground"
            else:
                state = "ground"
            continue
        if state == "csi":
            if "\x40" <= ch <= "\x7e":
                if ch == "m":
                    for param in (params.split(";") if params else ["0"]):
                        if param in ("", "0"):
                            concealed = False
                        elif param == "8":
                            concealed = True
                        elif param == "28":
                            concealed = False
                state = "ground"
            else:
                params += ch
            continue
        if ch == "\x1b":
            state = "esc"
        elif ch == "\x0e":
            shifted = True
        elif ch == "\x0f":
            shifted = False
        elif ch == "\n":
            out.append("\n")
        elif ch >= " " and not concealed:
            graphics = g1_graphics if shifted else g0_graphics
            out.append("#" if graphics and "\x5f" <= ch <= "\x7e" else ch)
    return "".join(out)


@pytest.mark.parametrize("how", sorted(HIDE))
def test_session_output_cannot_hide_the_question_that_follows_it(attacker: Attacker, how: str) -> None:
    work = attacker.workdir()
    attacker.marker_program(work, "pwned")
    script = (f"printf '{FAKE}{HIDE[how]}'; find . -maxdepth 0 -exec ./pwned ';'; "
              "printf '\\a\\033\\\\\\033[0m\\033(B'; echo \"find=$?\"")
    # The real question: the second question line on the wire (the first is the session's fake).
    raw = deny_at_the_prompt(attacker, RULES, script, reason="hidden question", questions=2)
    assert not attacker.marker_ran("pwned"), raw.decode(errors="replace")
    real_start = raw.index(b"   argv:    find . -maxdepth 0")
    shown = _render(raw[:raw.index(QUESTION.encode(), real_start) + len(QUESTION)])
    assert REAL_ARGV in shown, (
        f"the approval question is not visible on the terminal after the session's {how} sequence; "
        f"the person sees:\n{shown[-800:]}\nraw bytes around it: {raw[real_start - 120:real_start + 40]!r}")
