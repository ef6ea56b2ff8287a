"""The escalation server's decision cache (docs/DESIGN.md §9): reuse a Run or Deny the policy
service marked cacheable, for the same session and the same file, for its TTL.

Shapes and units:

- an entry is made from a ``DetermineAction`` answer carrying a
  :class:`~execgate.server.policy.CacheHint` (scope, TTL in seconds, rules fingerprint), only for
  ``run`` and ``deny`` answers that are not errors and that no approver gave (the service marks
  nothing else cacheable; this module checks again);
- the cache is **per session**: one LRU table per session id; nothing one session's execs put
  there is ever looked up for another session. Each entry's key also holds the session's labels
  and sandbox profile (an API caller may reuse a session id);
- key, scope ``program``: ``(program, argv[0], facts)``; scope ``exact``: ``(program, argv,
  workdir, facts)``. ``program`` is the absolute path as resolved lexically (never a symlink's
  target); ``facts`` the whole :class:`~execgate.server.policy.ExecFacts` learnt for this very
  exec: the file's identity (device, inode, owner, mode, real path, the directory-chain and
  caller-can-modify judgements, ``/proc``/``/dev``, same-for-server), its file info (format,
  linkage, set-ID bits, capabilities, interpreter) and ``children_unseen``. The rules' answer is
  a function of exactly these (and of the rules, whose fingerprint the entry keeps): a file
  swapped at the same path (another inode), a symlink pointed elsewhere, a file rewritten in place
  into a static or set-ID one, a mode or owner change, all miss;
- lookups try the ``program`` key, then the ``exact`` key: two dict lookups per exec;
- TTL: an entry is used until ``ttl_s`` after the answer arrived (``time.monotonic``), then
  dropped; rules reloads: every answer (and every ``RecordCachedDecisions`` answer) carries the
  service's rules fingerprint, and a new one empties the whole cache. Staleness after a reload
  is therefore bounded by the TTL, and in practice by the next answer or audit flush (≤ 0.5 s);
- bounds: at most ``max_entries`` entries and ``max_bytes`` of key text per session (LRU
  eviction), entries with keys over ``max_entry_bytes`` are not cached, at most ``max_sessions``
  session tables (the least recently used table is dropped whole).

:class:`CachedAudit` carries every hit to the service's audit log: entries are queued and sent
with ``RecordCachedDecisions`` every ``interval_s`` (0.5 s) or as soon as ``batch`` (256) are
waiting, and when a session closes; a failed send is logged and retried with the next flush (up
to ``attempts`` sends per entry, ``max_queue`` entries waiting), beyond which the lines are lost
and counted (``lost``), never fatal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Awaitable, Callable, Hashable, Sequence

from execgate.server import protocol as p
from execgate.server.policy import CacheHint, Decision, ExecFacts, SessionContext

log = logging.getLogger(__name__)

#: Defaults of :class:`DecisionCache` (entries and bytes per session, sessions, bytes per entry).
MAX_ENTRIES = 4096
MAX_BYTES = 1 << 20
MAX_SESSIONS = 256
MAX_ENTRY_BYTES = 16 << 10


@dataclass(frozen=True, slots=True)
class Entry:
    """A cached answer: the decision as the service gave it (its ``decision_id`` is the one
    cited as ``cached_from``), when it stops being used (``time.monotonic``) and its size."""

    decision: Decision
    expires: float
    nbytes: int


class _SessionTable:
    """One session's entries, least recently used first."""

    __slots__ = ("entries", "nbytes")

    def __init__(self) -> None:
        self.entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self.nbytes = 0


def _context_key(session: SessionContext) -> Hashable:
    return (tuple(sorted(session.labels.items())), session.sandbox)


def _facts_bytes(facts: ExecFacts | None) -> int:
    identity = None if facts is None else facts.identity
    return 256 + (len(identity.real_path) if identity is not None else 0) + len((facts and facts.problem) or "")


class DecisionCache:
    """Per-session LRU of cacheable decisions (module doc).

    Args:
        max_entries, max_bytes: bounds per session (entries; bytes of key text).
        max_sessions: session tables kept at once.
        max_entry_bytes: an answer whose key is larger is not cached.
        clock: the monotonic clock (seconds), replaceable in tests.
    """

    def __init__(self, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES,
                 max_sessions: int = MAX_SESSIONS, max_entry_bytes: int = MAX_ENTRY_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self.max_entry_bytes = max_entry_bytes
        self._clock = clock
        self._sessions: OrderedDict[str, _SessionTable] = OrderedDict()
        #: The rules fingerprint the entries were decided by ("" before the first answer).
        self.fingerprint = ""

    def __len__(self) -> int:
        return sum(len(t.entries) for t in self._sessions.values())

    def get(self, session: SessionContext, program: str, argv: Sequence[str], workdir: str,
            facts: ExecFacts | None) -> Entry | None:
        """The live entry for this exec (``program`` scope first, then ``exact``), or None."""
        table = self._sessions.get(session.session_id)
        if table is None or not argv:
            return None
        context = _context_key(session)
        now = self._clock()
        for key in (("p", context, program, argv[0], facts), ("e", context, program, tuple(argv), workdir, facts)):
            entry = table.entries.get(key)
            if entry is None:
                continue
            if entry.expires <= now:
                self._drop(table, key)
                continue
            table.entries.move_to_end(key)
            self._sessions.move_to_end(session.session_id)
            return entry
        return None

    def observe(self, fingerprint: str) -> None:
        """Note the rules fingerprint of an answer: another one than the entries' empties the cache."""
        if fingerprint and fingerprint != self.fingerprint:
            if self._sessions:
                log.info("policy rules changed (fingerprint %s → %s): decision cache emptied",
                         self.fingerprint or "-", fingerprint)
            self._sessions.clear()
            self.fingerprint = fingerprint

    def put(self, session: SessionContext, program: str, argv: Sequence[str], workdir: str,
            facts: ExecFacts | None, decision: Decision, hint: CacheHint) -> bool:
        """Keep ``decision`` for its hint's scope and TTL; returns whether it was kept.

        Not kept: an error, an action other than run/deny, a TTL ≤ 0, an answer of rules other
        than the current fingerprint (:meth:`observe` it first), an empty argv, a key over
        ``max_entry_bytes``.
        """
        if (decision.error or decision.action not in ("run", "deny") or not hint.ttl_s > 0 or not argv
                or not hint.fingerprint or hint.fingerprint != self.fingerprint):
            return False
        context = _context_key(session)
        if hint.scope == "program":
            key: Hashable = ("p", context, program, argv[0], facts)
            nbytes = len(program) + len(argv[0])
        elif hint.scope == "exact":
            key = ("e", context, program, tuple(argv), workdir, facts)
            nbytes = len(program) + sum(len(a) + 1 for a in argv) + len(workdir)
        else:
            return False
        nbytes += _facts_bytes(facts) + len(decision.reason or "") + len(decision.note) + len(decision.rule_id)
        nbytes += sum(len(k) + len(v) for k, v in session.labels.items())
        if nbytes > self.max_entry_bytes:
            return False
        table = self._sessions.get(session.session_id)
        if table is None:
            table = self._sessions[session.session_id] = _SessionTable()
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session.session_id)
        if key in table.entries:
            self._drop(table, key)
        table.entries[key] = Entry(decision, self._clock() + hint.ttl_s, nbytes)
        table.nbytes += nbytes
        while len(table.entries) > self.max_entries or table.nbytes > self.max_bytes:
            self._drop(table, next(iter(table.entries)))
        return True

    def forget_session(self, session_id: str) -> None:
        """Drop every entry of a session (it closed)."""
        self._sessions.pop(session_id, None)

    def clear(self) -> None:
        self._sessions.clear()

    @staticmethod
    def _drop(table: _SessionTable, key: Hashable) -> None:
        entry = table.entries.pop(key)
        table.nbytes -= entry.nbytes


@dataclass(frozen=True, slots=True)
class Hit:
    """One exec answered from the cache, waiting to be audited by the service.

    Attributes:
        decision: what was answered, with the client's own fresh ``decision_id``.
        cached_from: the decision id of the service's answer the entry came from.
        time_unix_ms: when it was answered (milliseconds since the epoch).
        latency_ms: how long answering took.
    """

    session: SessionContext
    program: str
    argv: tuple[str, ...]
    workdir: str
    facts: ExecFacts | None
    decision: Decision
    cached_from: str
    time_unix_ms: int
    latency_ms: float


#: Sends a batch of hits to the service; returns the service's rules fingerprint ("" if none);
#: raises on failure.
Sender = Callable[[Sequence[Hit]], Awaitable[str]]


class CachedAudit:
    """Queues cache hits and sends them to the service's audit log in batches (module doc).

    Args:
        send: the ``RecordCachedDecisions`` call.
        on_fingerprint: given the fingerprint each successful send returns.
        interval_s: the longest a hit waits before a flush (seconds).
        batch: a flush starts as soon as this many hits wait; also the most sent in one call.
        attempts: sends per hit before it counts as lost.
        max_queue: the most hits waiting; past it, new hits count as lost at once.

    Attributes:
        lost: hits that never reached the service (dropped after ``attempts`` failed sends or
            because the queue was full). sent: hits the service recorded.
    """

    def __init__(self, send: Sender, *, on_fingerprint: Callable[[str], None] | None = None,
                 interval_s: float = 0.5, batch: int = 64, attempts: int = 3, max_queue: int = 65536,
                 on_lost: Callable[[int], None] | None = None) -> None:
        self._send = send
        self._on_fingerprint = on_fingerprint
        self._on_lost = on_lost
        self.interval_s = interval_s
        self.batch = batch
        self.attempts = attempts
        self.max_queue = max_queue
        self._queue: list[tuple[Hit, int]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lost = 0
        self.sent = 0

    @staticmethod
    def size(hit: Hit) -> int:
        """A bound of the bytes ``hit`` takes in a RecordCachedDecisions message: its strings at
        gRPC's text expansion, plus room for the other fields."""
        text = sum(len(a) for a in hit.argv) + len(hit.program) + len(hit.workdir)
        return text * p.GRPC_TEXT_EXPANSION + 4096

    def _take(self) -> list[tuple[Hit, int]]:
        """The next batch off the queue: at most ``batch`` hits and, past the first, at most
        :data:`~execgate.server.protocol.CACHED_AUDIT_BATCH_BYTES` (so that no call exceeds the
        message limit, which would lose every hit of the batch)."""
        total, n = 0, 0
        for hit, _tries in self._queue[:self.batch]:
            total += self.size(hit)
            if n and total > p.CACHED_AUDIT_BATCH_BYTES:
                break
            n += 1
        taken, self._queue = self._queue[:n], self._queue[n:]
        return taken

    def add(self, hit: Hit) -> None:
        """Queue one hit (never blocks; starts the flusher in the running loop if needed)."""
        self._ensure_started()
        if len(self._queue) >= self.max_queue:
            self._lose(1, "the queue of cached decisions to audit is full")
            return
        self._queue.append((hit, 0))
        if len(self._queue) >= self.batch and self._wake is not None:
            self._wake.set()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def flush(self, session_id: str | None = None) -> None:
        """Send what waits now (every session's; ``session_id`` is informational), once each.
        Never raises for a failed send (it is logged, and retried or counted lost)."""
        if not self._queue:
            return
        self._ensure_started()
        assert self._lock is not None
        async with self._lock:
            while self._queue:
                taken = self._take()
                try:
                    fingerprint = await self._send([hit for hit, _ in taken])
                except asyncio.CancelledError:
                    self._queue[:0] = taken
                    raise
                except Exception as exc:  # noqa: BLE001 - any failure: retry later or count lost
                    retry = [(hit, n + 1) for hit, n in taken if n + 1 < self.attempts]
                    room = max(0, self.max_queue - len(self._queue))
                    kept = retry[:room]
                    self._queue[:0] = kept
                    dropped = len(taken) - len(kept)
                    log.warning("could not audit %d cached decisions%s: %s", len(taken),
                                f" (session {session_id})" if session_id else "", exc)
                    if dropped:
                        self._lose(dropped, "sending them failed")
                    return
                self.sent += len(taken)
                if fingerprint and self._on_fingerprint is not None:
                    self._on_fingerprint(fingerprint)

    async def aclose(self) -> None:
        """Flush what waits, then stop the flusher."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._queue and self._loop is asyncio.get_running_loop():
            await self.flush()
        if self._queue:  # a failed last send: these lines will never be written
            self._lose(len(self._queue), "the last send before closing failed")
            self._queue = []
        self._wake = self._lock = self._loop = None

    def _lose(self, n: int, why: str) -> None:
        self.lost += n
        log.error("%d cached decisions will not be in the audit log (%s); %d lost so far", n, why, self.lost)
        if self._on_lost is not None:
            self._on_lost(n)

    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (the object outlived the old one)
            self._loop = loop
            self._wake = asyncio.Event()
            self._lock = asyncio.Lock()
            self._task = None
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="execgate-cached-audit")

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()
