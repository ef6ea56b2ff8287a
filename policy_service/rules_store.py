"""Hold the current rule set of a running service and reload it safely.

A reload builds a complete new :class:`RuleSet` first and swaps it in only if every file is good,
so a running service keeps its last good rules (docs/DESIGN.md §5). Readers take ``store.current``
once per decision; the swap is a single attribute assignment, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Iterable

from .rules_engine import RuleSet, expand_paths
from .rules_model import RulesError

log = logging.getLogger(__name__)

_Signature = tuple[tuple[str, int, int, int] | tuple[str], ...]


class RulesStore:
    """The current rules, reloadable on demand, on file change (:meth:`watch`) or on SIGHUP."""

    def __init__(
        self,
        paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
        *,
        default: str | None = None,
        trusted_dirs: Iterable[str] | None = None,
    ) -> None:
        """Load the rules now.

        Args:
            paths: rules files or directories (see :meth:`RuleSet.load`).
            default: decision for unmatched commands (see :meth:`RuleSet.load`).
            trusted_dirs: see :meth:`RuleSet.load`.

        Raises:
            RulesError: the files are bad; there is no last good rule set to fall back to.
        """
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self._paths = [Path(p) for p in paths]
        self._default = default
        self._trusted_dirs = None if trusted_dirs is None else tuple(trusted_dirs)
        self._signature = self._stat()
        self._current = self._load()
        self.generation = 1
        """Incremented on every successful reload."""

    @property
    def current(self) -> RuleSet:
        """The last good rule set."""
        return self._current

    def reload(self) -> bool:
        """Load the files again and swap the new rules in if they are all good.

        Returns:
            True if the new rules are in use; False if they are bad (the RulesError is logged
            and the last good rules stay in use).
        """
        self._signature = self._stat()
        try:
            rules = self._load()
        except RulesError as exc:
            log.error("rules reload failed, keeping the last good rules: %s", exc)
            return False
        self._current = rules
        self.generation += 1
        log.info("rules reloaded: %d rules from %s", len(rules.rules),
                 ", ".join(str(p) for p in rules.sources))
        return True

    async def watch(self, interval_s: float = 1.0) -> None:
        """Poll the files every ``interval_s`` seconds and reload when one changes.

        A change is any difference in a file's mtime (ns), size or inode, or a file appearing or
        disappearing (directories included). A bad change is logged once and retried when the
        files change again. Runs until cancelled.
        """
        while True:
            await asyncio.sleep(interval_s)
            if self._stat() != self._signature:
                self.reload()

    def install_sighup(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reload on SIGHUP, on ``loop`` (which must run in the main thread).

        ``loop.add_signal_handler`` runs the reload as an ordinary callback on the loop, never
        inside the signal handler itself.
        """
        loop.add_signal_handler(signal.SIGHUP, self.reload)

    def remove_sighup(self, loop: asyncio.AbstractEventLoop) -> None:
        """Undo :meth:`install_sighup`."""
        loop.remove_signal_handler(signal.SIGHUP)

    def _load(self) -> RuleSet:
        return RuleSet.load(self._paths, default=self._default, trusted_dirs=self._trusted_dirs)

    def _stat(self) -> _Signature:
        """Identity of every watched file: (path, mtime_ns, size, inode), or (path,) if missing."""
        entries: list[Path] = list(self._paths)
        try:
            entries += [p for p in expand_paths(self._paths) if p not in self._paths]
        except RulesError:
            pass
        out: list = []
        for path in entries:
            try:
                st = os.stat(path)
            except OSError:
                out.append((str(path),))
                continue
            out.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)
