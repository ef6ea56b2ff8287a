"""Attack C: a request that draws over its own description (docs/DESIGN.md §8, Approvers).

The session names the argv, the working directory, the environment and the file; shown raw on a
terminal, an escape sequence moves the cursor and rewrites what the approver reads. The reviewer's
reproducer: a working directory named ``ESC[1A CR ESC[2K   argv:    find . -name '*.log' -mtime
+7 LF CR ESC[2K   cwd:     /tmp/w4`` makes ``find . -maxdepth 0 -exec ./pwned ;`` look like a
harmless ``find``. Every text an approver sees (``describe``: ``execgate approve`` and the
terminal approver of ``execgate run``; the web page's JSON and server-sent events) must hold no
control character, show each one escaped, and flag the request on a line of its own."""

from __future__ import annotations

import json
import shlex

import pytest

from execgate.policy_service.approver import describe
from execgate.policy_service.web_feed import pending_to_json
from execgate.server import policy_codec as codec
from execgate.server.fileinfo import FileInfo
from execgate.server.policy import ExecFacts
from execgate.v1 import approvals_pb2 as apb
from execgate.v1 import policy_pb2 as pb

from identity_support import system_identity

#: The line that flags a request holding control characters (``approver.CONTROLS_FLAG``).
FLAG = "this request contains control characters, shown escaped"

#: The reviewer's directory name: up one line, erase it, redraw a harmless argv and cwd.
SPOOF_DIR = "\033[1A\r\033[2K   argv:    find . -name '*.log' -mtime +7\n\r\033[2K   cwd:     /tmp/w4"
ATTACK_ARGV = ["find", ".", "-maxdepth", "0", "-exec", "./pwned", ";"]
#: Other characters that hide or reorder text: C1 CSI, DEL, NUL, bidi overrides and isolates,
#: line and paragraph separators, a zero-width space, a no-break space, a BOM.
HIDING = "\x9b2J\x7f\x00\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029\u200b\u00a0\ufeff"


def attack_pending(**changes: object) -> apb.PendingApproval:
    """The reproducer's pending request as an approver receives it, every shown field spiked."""
    workdir = f"/tmp/atk/{SPOOF_DIR}"
    identity = system_identity(f"/tmp/atk/pwned{HIDING}", real_path=f"/tmp/atk/\u202epwned")
    info = FileInfo(format="script", interpreter="/bin/sh\x1b]0;title\x07")
    facts = ExecFacts(file=info, children_unseen=False, identity=identity)
    pending = apb.PendingApproval(
        request_id="r-1", session=pb.SessionContext(session_id="s\x1b[31m", labels={"a\x1bb": "v\u202ex"}),
        target=codec.target_to_pb("/usr/bin/find", ATTACK_ARGV, workdir, facts),
        rule_id="ask-find", reason="x", seconds_left=30,
        env={"LANG": "C.UTF-8", "X\x1b": f"\x1b[8m{HIDING}"},
    )
    for name, value in changes.items():
        setattr(pending, name, value)
    return pending


def assert_no_controls(text: str, *, newlines: bool = False) -> None:
    """``text`` holds printable characters only (and newlines between lines, if allowed)."""
    bad = sorted({hex(ord(c)) for c in text if not c.isprintable() and not (newlines and c == "\n")})
    assert not bad, (bad, text)


def test_describe_shows_every_control_character_escaped_and_flags_the_request() -> None:
    shown = describe(attack_pending())
    assert_no_controls(shown, newlines=True)
    lines = shown.split("\n")
    assert FLAG in lines[1]
    # One line per field: the spoofed directory cannot add lines or draw over earlier ones.
    assert [line[:12] for line in lines[2:]] == ["   program: ", "   argv:    ", "   cwd:     ", "   session: ",
                                                 "   rule:    ", "   env:     ", "   file:    ", "   note:    ",
                                                 "   runs:    "]
    assert lines[3] == "   argv:    find . -maxdepth 0 -exec ./pwned ';'"
    assert lines[4] == ("   cwd:     /tmp/atk/\\x1b[1A\\x0d\\x1b[2K   argv:    find . -name '*.log' -mtime +7"
                        "\\x0a\\x0d\\x1b[2K   cwd:     /tmp/w4")
    for escaped in ("\\x9b2J", "\\x7f", "\\x00", "\\u202a", "\\u202e", "\\u2066", "\\u2069", "\\u2028", "\\u2029",
                    "\\u200b", "\\xa0", "\\ufeff", "\\x1b]0;title\\x07", "s\\x1b[31m", "a\\x1bb=v\\u202ex",
                    "X\\x1b=\\x1b[8m", "real file /tmp/atk/\\u202epwned"):
        assert escaped in shown, (escaped, shown)


def test_a_long_field_is_cut_and_the_program_is_named_again_next_to_the_prompt() -> None:
    """A field as long as the session likes (spaces to the screen's edge, then lines drawn like a
    question) would scroll the real header and program away: each field shows at most
    MAX_SHOWN characters and says how many more it has; the last line names the program again."""
    from execgate.policy_service.approver import MAX_SHOWN

    facts = ExecFacts(identity=system_identity("/usr/bin/find"))
    fake = " " * 3200 + "execgate: a command needs your approval" + " " * 61 + "   program: /usr/bin/true"
    target = codec.target_to_pb("/usr/bin/find", ["find", ".", "-exec", "./pwned", ";", "-o", "-name", fake], "/w",
                                facts)
    pending = apb.PendingApproval(request_id="r", target=target, rule_id="r", reason="x",
                                  session=pb.SessionContext(session_id="s"))
    lines = describe(pending).split("\n")
    argv = next(line for line in lines if line.startswith("   argv:    "))
    assert len(argv) < len("   argv:    ") + MAX_SHOWN + 60, len(argv)
    assert argv.endswith("more characters not shown]") and "/usr/bin/true" not in argv, argv[-80:]
    assert lines[-1] == f"   runs:    /usr/bin/find (8 arguments, {len(shlex.join(target.argv)):,} characters)"


@pytest.mark.parametrize("field", ["program", "argv", "workdir", "env", "label", "reason", "rule_id"])
def test_any_single_spiked_field_is_flagged(field: str) -> None:
    facts = ExecFacts(identity=system_identity("/usr/bin/find"))
    target = codec.target_to_pb("/usr/bin/find", ["find", "."], "/w", facts)
    pending = apb.PendingApproval(request_id="r", target=target, rule_id="r", reason="x",
                                  session=pb.SessionContext(session_id="s"))
    assert FLAG not in describe(pending)
    spike = "a\u2067b"
    if field == "program":
        pending.target.program = "/usr/bin/" + spike
    elif field == "argv":
        pending.target.argv.append(spike)
    elif field == "workdir":
        pending.target.workdir = "/" + spike
    elif field == "env":
        pending.env["V"] = spike
    elif field == "label":
        pending.session.labels[spike] = "v"
    else:
        setattr(pending, field, spike)
    shown = describe(pending)
    assert FLAG in shown and "a\\u2067b" in shown and spike not in shown
    assert_no_controls(shown, newlines=True)


def test_visible_leaves_printable_text_alone() -> None:
    from execgate.policy_service.approver import visible

    text = "naïve 日本語 ls -l 'a b' \\x1b literal"
    assert visible(text) == text
    assert visible("\t\x1b\x85\u2028\U000e0001") == "\\x09\\x1b\\x85\\u2028\\U000e0001"


def test_web_page_data_and_events_hold_no_control_character() -> None:
    """The page's JSON (``/api/pending``) and each server-sent event carry the escaped texts (the
    page puts them in the document as text), a ``controls`` flag, and no raw control character."""
    item = pending_to_json(attack_pending())
    assert item["controls"] is True
    assert item["cwd"].startswith("/tmp/atk/\\x1b[1A\\x0d\\x1b[2K")
    assert item["command"] == "find . -maxdepth 0 -exec ./pwned ';'"
    assert item["labels"] == {"a\\x1bb": "v\\u202ex"} and item["session"] == "s\\x1b[31m"
    assert "X\\x1b" in item["env"] and "\\u202e" in item["env"]["X\\x1b"]
    assert "\\u202epwned" in item["file"]
    assert item["no_session_grant"] == "the caller can change this file or a directory holding it"

    def texts(value: object) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, dict):
            return [t for k, v in value.items() for t in (k, *texts(v))]
        if isinstance(value, list):
            return [t for v in value for t in texts(v)]
        return []

    for text in texts(item):
        assert_no_controls(text)
    event = f"event: pending\ndata: {json.dumps(item)}\n\n"  # as web_approver.events writes it
    assert_no_controls(event.replace("\n", ""))
    assert event.count("\n") == 3
    clean = pending_to_json(apb.PendingApproval(
        request_id="r", target=codec.target_to_pb("/usr/bin/ls", ["ls"], "/w",
                                                  ExecFacts(identity=system_identity("/usr/bin/ls")))))
    assert clean["controls"] is False and clean["no_session_grant"] is None
