"""Text as a proto ``string`` field can carry it, and back: free of gRPC and protobuf.

The wire protocol carries a caller's non-UTF-8 bytes (paths, argv, env) as surrogate escapes
(:mod:`execgate.server.protocol`); proto strings must be UTF-8, so the policy sees such bytes as
``\\xNN`` text (:func:`wire_text`), and :func:`restore_text` maps its answer back to the caller's
exact bytes. Both ways of reaching the policy — the gRPC client
(:mod:`execgate.server.policy_codec`) and the in-process one of ``execgate run``'s embedded
service (:mod:`execgate.policy_service.inprocess`) — use these, so the rules, the audit log and
the approvers see the same text either way.
"""

from __future__ import annotations

from typing import Sequence

from execgate.server.policy import PolicyError, PreparedExec


def wire_text(text: str) -> str:
    """``text`` as a proto ``string`` field can carry it.

    Proto strings must be valid UTF-8, but a caller's paths, argv and env may hold any bytes; the
    wire protocol carries those as surrogate escapes (:mod:`execgate.server.protocol`). Such bytes
    are shown to the policy as ``\\xNN`` (Python's ``backslashreplace``); plain text is unchanged.
    :func:`restore_text` maps the policy's answer back to the caller's exact bytes.
    """
    if text.isascii():  # per argv item on every decision: skip the encode for the common case
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


def restore_text(prepared: PreparedExec, originals: Sequence[str]) -> PreparedExec:
    """``prepared`` with every value equal to ``wire_text(x)`` of an original ``x`` (a string that
    held non-UTF-8 bytes) replaced by ``x``, so that the escalated command gets the exact bytes.

    Raises:
        PolicyError: two different originals have the same text (the byte 0xff and the four
            characters ``\xff``, in either order): a value of the answer could stand for
            either, so which bytes the command would get is not known; the escalation is
            refused rather than guessed.
    """
    back = {wired: text for text in originals if (wired := wire_text(text)) != text}
    if not back:
        return prepared
    for text in originals:
        wired = wire_text(text)
        if wired in back and back[wired] != text:
            raise PolicyError(f"refused: {wired!r} names two different byte strings of this request (one of "
                              "them not UTF-8); the escalated command could get the wrong one")
    fix = lambda value: back.get(value, value)  # noqa: E731
    return PreparedExec(
        command=tuple(map(fix, prepared.command)),
        cwd=fix(prepared.cwd),
        env={fix(k): fix(v) for k, v in prepared.env.items()},
        arg0=None if prepared.arg0 is None else fix(prepared.arg0),
    )
