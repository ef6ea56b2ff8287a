"""The audit log: one JSON line per decision (docs/DESIGN.md §5).

Each line is a JSON object with the keys of :class:`AuditRecord`: ``time`` (RFC 3339, UTC),
``decision_id``, ``session_id``, ``labels``, ``program``, ``argv``, ``workdir``, ``decision``
(run / escalate / deny), ``rule_id``, ``reason``, ``approver``, ``latency_ms``, ``error``,
``file_kind`` (the file's tags, e.g. ``["elf64", "static"]``; null when the server learnt
nothing), ``children_unseen`` (true: what the program execs is not seen; null: unknown),
``real_path`` (the file that runs, as the server identified it in the caller's view, symlinks
resolved: it may differ from ``program``, the name the caller gave; null when not identified) and
``cached`` (true when the escalation server answered from its decision cache, docs/DESIGN.md §9;
such a line also has ``cached_from``, the decision id of the answer the entry came from, and
``cache_verified``: true when this service issued that answer, as cacheable, for the same key
— false for an answer of another replica, one forgotten, or a claim that does not match).
Lines are appended and flushed one by one, so ``tail -f`` and a crash both see whole lines. A line
that cannot be written (a full disk) raises :class:`AuditWriteError` after what part of it reached
the file is cut off again; the decision it records is then not given (docs/DESIGN.md §5). Each line
is one ``O_APPEND`` write, so writers in several processes (two runs given one file) never
overwrite each other's lines; no lock is taken (a session able to open the file could hold it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import IO, Mapping, Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One decision, as written to the audit log.

    Attributes:
        decision_id: the decision's unique id (also sent to the server).
        session_id: the session that asked.
        labels: the session's labels.
        program: absolute program path.
        argv: full argv, argv[0] included.
        workdir: absolute working directory.
        decision: "run", "escalate" or "deny".
        rule_id: the deciding rule ("" for the configured default).
        reason: justification, approver's reason or denial text.
        approver: who resolved a prompt ("" when nobody was asked).
        latency_ms: time from request to decision, in milliseconds.
        error: True when the decision is a denial caused by a failure rather than by policy.
        file_kind: the file's tags (:func:`execgate.server.fileinfo.kinds`), None if unknown.
        children_unseen: True if the program's own execs are not seen; None if unknown.
        real_path: the identified file's path in the caller's view
            (:attr:`execgate.server.policy.FileIdentity.real_path`), None if not identified.
        time: when the decision was made (UTC).
        cached: True when the escalation server answered from its decision cache.
        cached_from: for a cached line, the decision id of the answer the cache entry came from.
        cache_verified: for a cached line, whether this service issued that answer for this key.
    """

    decision_id: str
    session_id: str
    labels: Mapping[str, str]
    program: str
    argv: Sequence[str]
    workdir: str
    decision: str
    rule_id: str
    reason: str
    approver: str
    latency_ms: float
    error: bool = False
    file_kind: Sequence[str] | None = None
    children_unseen: bool | None = None
    real_path: str | None = None
    time: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    cached: bool = False
    cached_from: str = ""
    cache_verified: bool = False

    def to_json(self) -> str:
        """The record as one compact JSON line (no trailing newline)."""
        data = dataclasses.asdict(self)
        if not self.cached:  # only cached lines carry where they came from
            del data["cached_from"], data["cache_verified"]
        data["time"] = self.time.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        data["labels"] = dict(self.labels)
        data["argv"] = list(self.argv)
        data["file_kind"] = None if self.file_kind is None else list(self.file_kind)
        data["latency_ms"] = round(self.latency_ms, 3)
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


class AuditWriteError(OSError):
    """A line could not be written to the audit log (disk full, I/O error, closed log)."""


class AuditLog:
    """Appends :class:`AuditRecord` lines to a file.

    Args:
        path: the file, opened for appending (created with mode 0600 if missing).

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        # Handlers run on one event loop, but write() may also be called from executor threads.
        self._lock = threading.Lock()

    def write(self, record: AuditRecord) -> None:
        """Append one whole line: one ``write(2)`` on the ``O_APPEND`` descriptor, which the
        kernel places at the end of the file whatever other writers do (open(2), O_APPEND).

        Raises:
            AuditWriteError: the line could not be written whole (it is logged too). The part of
                it that reached the file is cut off again unless another writer appended after
                it (then it is left: its lines are not ours to cut), so a file written by one
                run holds whole lines only. The caller must not give an answer that is not in
                its audit log (docs/DESIGN.md §5). Nothing here waits on another process (no
                lock a session could hold).
        """
        line = (record.to_json() + "\n").encode("utf-8", "backslashreplace")
        with self._lock:
            written = 0
            try:
                if self._fd < 0:
                    raise OSError(errno.EBADF, "the audit log is closed")
                written = os.write(self._fd, line)
                if written != len(line):  # a short write to a regular file: the disk is full
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as exc:
                if written:
                    with contextlib.suppress(OSError):
                        end = os.lseek(self._fd, 0, os.SEEK_CUR)  # the end of our bytes
                        if os.fstat(self._fd).st_size == end:
                            os.ftruncate(self._fd, end - written)
                log.error("audit log %s: cannot write decision %s: %s", self.path, record.decision_id, exc)
                raise AuditWriteError(exc.errno, f"audit log {self.path}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        """Close the file; later writes fail. Never raises (a close error is logged)."""
        with self._lock:
            fd, self._fd = self._fd, -1
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError as exc:
                    log.error("audit log %s: close failed: %s", self.path, exc)
