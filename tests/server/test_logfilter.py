"""RepeatLimit: a burst per window and kind, then drops, reported with the next line of the kind."""

from __future__ import annotations

import logging

from execgate.server.logfilter import RepeatLimit


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("execgate.server.escalation", logging.WARNING, __file__, 1, msg, args, None)


def test_a_burst_per_kind_then_drops_reported_after_the_window():
    now = [0.0]
    limit = RepeatLimit(burst=3, window_s=60, clock=lambda: now[0])
    passed = [limit.filter(_record("session %s: protocol error: %s", "s1", i)) for i in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert limit.filter(_record("session %s: protocol error: %s", "s2", 0))  # another session: its own kind
    assert limit.filter(_record("session %s: peer too slow", "s1"))  # another message: its own kind
    now[0] = 61.0
    record = _record("session %s: protocol error: %s", "s1", 10)
    assert limit.filter(record)
    assert record.getMessage() == "session s1: protocol error: 10 (7 more like this dropped in the last 60 s)"


def test_an_unhashable_first_argument_is_counted_not_raised():
    """A list as the first argument (the containment sweep's pids, before 2026-12-02) raised
    TypeError inside the logging call, which crashed execgate run at the end of a session."""
    limit = RepeatLimit(burst=1, window_s=60, clock=lambda: 0.0)
    assert limit.filter(_record("still run: %s", [1, 2]))
    assert not limit.filter(_record("still run: %s", [1, 2]))
    assert limit.filter(_record("still run: %s", {"a": 1}))  # another value: another kind


def test_visible_formatter_escapes_the_message_only():
    from execgate.server.logfilter import VisibleFormatter

    record = _record("session %s: cannot run %s", "s1", "/tmp/x\x1b[2J\u202e")
    assert VisibleFormatter("execgate: %(levelname)s: %(message)s").format(record) == \
        "execgate: WARNING: session s1: cannot run /tmp/x\\x1b[2J\\u202e"
