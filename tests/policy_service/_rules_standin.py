"""TEMPORARY stand-in for ``execgate.policy_service.rules`` (branch ``rules``), used only by these
tests until that engine is merged into main; delete it then. It reads the same TOML schema's
subset (``[[rule]]`` id, program, prefix, decision, execution, justification, allow_env) and has
the same interface; no path trust, no examples."""

from __future__ import annotations

import asyncio
import os
import tomllib
from pathlib import Path
from dataclasses import dataclass
from typing import Sequence

from execgate.server.policy import Execution, Permissions

_RANK = {"escalate": 0, "run": 1, "prompt": 2, "deny": 3}


class RulesError(Exception):
    pass


@dataclass(frozen=True)
class Rule:
    id: str
    program: str
    decision: str
    execution: Execution | None
    justification: str
    allow_env: tuple[str, ...]
    prefix: tuple[tuple[str, ...], ...]

    def matches(self, program: str, argv: Sequence[str]) -> bool:
        if self.program not in (program, os.path.basename(program)):
            return False
        args = argv[1:]
        return len(args) >= len(self.prefix) and all(a in t for a, t in zip(args, self.prefix))


@dataclass(frozen=True)
class Evaluation:
    decision: str
    rule: Rule | None
    matched: tuple[Rule, ...]
    execution: Execution | None
    reason: str
    allow_env: tuple[str, ...]


def _execution(value) -> Execution | None:
    if value is None or value == "unsandboxed":
        return Execution()
    if value == "session_default":
        return Execution("session_default")
    return Execution("permissions", Permissions(
        value.get("network", False), tuple(value.get("writable_roots", ())), tuple(value.get("readable_roots", ()))))


class RuleSet:
    def __init__(self, rules: list[Rule], default: str) -> None:
        self.rules, self.default = rules, default

    @classmethod
    def load(cls, paths, *, default: str = "run", trusted_dirs=None) -> "RuleSet":
        rules = []
        for path in paths:
            try:
                data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
                for i, t in enumerate(data.get("rule", []), 1):
                    if t["decision"] not in _RANK:
                        raise RulesError(f"{path}: rule {i}: bad decision {t['decision']!r}")
                    prefix = tuple((x,) if isinstance(x, str) else tuple(x) for x in t.get("prefix", []))
                    rules.append(Rule(t.get("id", f"{os.path.basename(path)}#{i}"), t["program"], t["decision"],
                                      _execution(t.get("execution")), t.get("justification", ""),
                                      tuple(t.get("allow_env", [])), prefix))
            except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
                raise RulesError(f"{path}: {exc}") from exc
        return cls(rules, default)

    def evaluate(self, program: str, argv: Sequence[str]) -> Evaluation:
        matched = tuple(r for r in self.rules if r.matches(program, argv))
        if not matched:
            return Evaluation(self.default, None, (), Execution(), "default", ())
        win = max(matched, key=lambda r: _RANK[r.decision])
        return Evaluation(win.decision, win, matched, win.execution, win.justification, win.allow_env)


class RulesStore:
    def __init__(self, paths, *, default="run", trusted_dirs=None) -> None:
        self.paths, self.default = list(paths), default
        self._current = RuleSet.load(self.paths, default=default)
        self._sig = self._stat()

    @property
    def current(self) -> RuleSet:
        return self._current

    def _stat(self):
        return tuple(os.stat(p).st_mtime_ns for p in self.paths)

    def reload(self) -> bool:
        try:
            self._current = RuleSet.load(self.paths, default=self.default)
            return True
        except RulesError:
            return False

    async def watch(self, interval_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            sig = self._stat()
            if sig != self._sig:
                self._sig = sig
                self.reload()
