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

from .rules_engine import DEFAULT_RULES_PATH, RuleSet, expand_paths
from .rules_model import RulesError

log = logging.getLogger(__name__)

#: The name that stands for the shipped rules file in a list of rules paths (``--rules default``).
DEFAULT_RULES_NAME = "default"


def layered_paths(paths: Iterable[str | os.PathLike[str]], *, defaults: bool = True) -> list[Path]:
    """The rules files in force for ``--rules PATHS`` (in load order).

    Rules files layer on top of the shipped default rules: the default file is added unless
    ``defaults`` is False (``--no-default-rules``) or it is already named. It is added *last*: the
    strictest matching rule wins whatever its file, and among equally strict rules the first
    loaded wins, so a file's own rule (and its justification) beats a default rule of the same
    decision. The word ``default`` names the shipped file, so ``--rules default --rules mine.toml``
    chooses another order. A file named twice is loaded once.

    Raises:
        RulesError: no rules at all (``defaults`` False and no path).
    """
    chosen: list[Path] = []
    for raw in paths:
        path = DEFAULT_RULES_PATH if str(raw) == DEFAULT_RULES_NAME else Path(raw)
        if path not in chosen:
            chosen.append(path)
    if defaults and DEFAULT_RULES_PATH not in chosen:
        chosen.append(DEFAULT_RULES_PATH)
    if not chosen:
        raise RulesError("no rules: --no-default-rules needs at least one --rules FILE")
    return chosen


def describe_paths(paths: Iterable[Path]) -> str:
    """One line naming the rules files in force, the shipped file as ``default``."""
    return " + ".join(f"default ({p})" if p == DEFAULT_RULES_PATH else str(p) for p in paths)

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
