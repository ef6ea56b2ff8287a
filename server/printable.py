"""Text a hostile session chose, made safe to show a person: every character that is not
printable shown as an escape (:func:`visible`). Used wherever such text reaches a terminal or a
page: approvers' questions (:mod:`execgate.policy_service.approver`), ``execgate run``'s notes and
its log lines (:class:`execgate.server.logfilter.VisibleFormatter`).
"""

from __future__ import annotations


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` with every character that is not printable shown as an escape: C0 and C1 controls,
    DEL and other bytes as ``\\xNN`` (ESC is ``\\x1b``, a newline ``\\x0a``), others as
    ``\\uNNNN`` (a right-to-left override is ``\\u202e``, a line separator ``\\u2028``). What a
    request names (argv, paths, env, labels) is the hostile session's choice: shown raw on a
    terminal, an escape sequence could move the cursor and overwrite what a person reads (an
    approver's question, execgate's own notes and warnings), and bidi controls reorder it in a
    browser. Printable text, backslashes included, is left as is
    (the escalation server already shows each non-UTF-8 byte as the text ``\\xNN``).

    Not printable, for :meth:`str.isprintable`: Unicode categories Cc (C0 and C1 controls, DEL),
    Cf (bidi embeddings, overrides and isolates U+202A–U+202E, U+2066–U+2069, zero-width
    characters, U+FEFF), Zl and Zp (U+2028, U+2029), Zs other than U+0020 (no-break spaces), Cs,
    Co and Cn (surrogates, private use, unassigned)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)
