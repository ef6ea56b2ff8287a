"""Log lines on a terminal a session shares with the user: bounded in number, and unable to
draw on it.

Text a session chose (a program path, argv) reaches the server's log lines:
:class:`VisibleFormatter` shows its control characters escaped
(:func:`execgate.server.printable.visible`), so that an escape sequence in a path cannot repaint
the terminal (an approval question on it, found by review).

A session (or any process of the user's that can connect to a session's fallback socket) can
make the server log a warning per connection — a broken frame, a dropped handshake — as fast as
it can connect. :class:`RepeatLimit` lets ``burst`` lines of one kind through per ``window_s``
seconds and drops the rest; the first line after a window with drops says how many were dropped.
Lines are of one kind when they come from the same logger with the same format string and the
same first argument (by execgate's convention, the session id).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Hashable

from execgate.server.printable import visible

#: Most kinds remembered at once; past it the oldest is forgotten (its drops are not reported).
MAX_KINDS = 1024


class RepeatLimit(logging.Filter):
    """A :class:`logging.Filter` that passes at most ``burst`` records of a kind per ``window_s``
    seconds (monotonic clock), and reports the dropped ones with the next record of that kind.

    Args:
        burst: records of one kind passed per window (>= 1).
        window_s: the window, seconds.
        clock: seconds, monotonic (tests may pass their own).
    """

    def __init__(self, burst: int = 5, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = max(1, burst)
        self.window_s = window_s
        self._clock = clock
        self._kinds: dict[Hashable, list[float | int]] = {}  # kind -> [window start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        first = args[0] if args else None
        if not isinstance(first, (str, int, float, bytes, type(None))):
            first = repr(first)  # a list argument (unhashable) must not crash the logging call
        kind = (record.name, record.msg, first)
        now = self._clock()
        state = self._kinds.get(kind)
        if state is None or now - state[0] >= self.window_s:
            dropped = 0 if state is None else int(state[2])
            self._remember(kind, [now, 1, 0])
            if dropped:
                record.msg = f"{record.msg} ({dropped} more like this dropped in the last {self.window_s:g} s)"
            return True
        if state[1] < self.burst:
            state[1] += 1
            return True
        state[2] += 1
        return False

    def _remember(self, kind: Hashable, state: list[float | int]) -> None:
        self._kinds.pop(kind, None)
        if len(self._kinds) >= MAX_KINDS:
            self._kinds.pop(next(iter(self._kinds)))
        self._kinds[kind] = state


class VisibleFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose message part has every non-printable character escaped
    (:func:`~execgate.server.printable.visible`); the format's own text and a traceback are kept."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = visible(record.message)
        return super().formatMessage(record)
