"""The rules engine's values: decisions, rules, evaluations, and the checks shared by the loaders.

A :class:`Rule` is one program (basename or absolute path) plus an argv *prefix*: a sequence of
tokens matched against ``argv[1:]`` from the left, where each token is a tuple of alternatives.
Both loaders (:mod:`execgate.policy_service.rules_toml` and
:mod:`execgate.policy_service.codex_rules`) validate their input with the helpers here, so the
two formats reject the same mistakes with the same messages: the file, the rule and the example.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from execgate.server.policy import Execution

#: Every decision a rule may carry (docs/DESIGN.md §5).
DECISIONS = ("run", "escalate", "prompt", "deny")
#: Strictness: when several rules match, the highest wins (deny > prompt > run > escalate).
STRICTNESS = {"escalate": 0, "run": 1, "prompt": 2, "deny": 3}
#: Decisions that apply to every path with the rule's basename, trusted or not.
RESTRICTIVE = frozenset({"prompt", "deny"})

Token = tuple[str, ...]
Command = tuple[str, ...]


class RulesError(Exception):
    """Raised when a rules file cannot be read, parsed or validated, or an example fails."""


@dataclass(frozen=True)
class Rule:
    """One rule: a program, an argv prefix and a decision.

    Attributes:
        id: the rule's id (given in the file, else ``<file name>#<index>``, 1-based).
        program: a basename (``git``) or an absolute path (``/usr/bin/git``).
        decision: ``run``, ``escalate``, ``prompt`` or ``deny``.
        execution: for ``escalate``/``prompt``, how the approved command runs; None otherwise.
        justification: why the rule exists; shown to approvers and in denials.
        allow_env: environment variable names or fnmatch globs that survive env cleaning.
        source: path of the file the rule came from.
        pattern: the argv prefix after argv[0]; each token is a tuple of alternatives.
        match: example commands (argv[0] first) this rule must match.
        not_match: example commands this rule must not match.
        index: 1-based position of the rule in its file.
        line: line number in the file when known (Codex ``.rules`` files), else None.
    """

    id: str
    program: str
    decision: str
    execution: Execution | None = None
    justification: str = ""
    allow_env: tuple[str, ...] = ()
    source: str = ""
    pattern: tuple[Token, ...] = ()
    match: tuple[Command, ...] = field(default=(), repr=False)
    not_match: tuple[Command, ...] = field(default=(), repr=False)
    index: int = 0
    line: int | None = None

    @property
    def restrictive(self) -> bool:
        """True for ``deny``/``prompt``: such rules apply to every path with the basename."""
        return self.decision in RESTRICTIVE

    @property
    def location(self) -> str:
        """``file:line`` when the line is known, else ``file#index``."""
        if self.line is not None:
            return f"{self.source}:{self.line}"
        return f"{self.source}#{self.index}"

    def matches_args(self, args: Sequence[str]) -> bool:
        """True when ``args`` (argv after argv[0]) starts with this rule's prefix."""
        if len(args) < len(self.pattern):
            return False
        return all(arg in token for arg, token in zip(args, self.pattern))

    def matches_example(self, command: Sequence[str]) -> bool:
        """Match an example command syntactically: by name or exact path, then by prefix.

        Path trust is not considered here (examples are checked where the rules load, not where
        programs run): ``/tmp/x/git push`` matches a ``git push`` rule as an example.
        """
        if not command:
            return False
        head = command[0]
        if os.path.isabs(self.program):
            named = os.path.normpath(head) == self.program
        else:
            named = os.path.basename(head) == self.program
        return named and self.matches_args(command[1:])

    def pattern_text(self) -> str:
        """The prefix as text: ``git [push|fetch] origin``."""
        parts = [shlex.quote(self.program)]
        for token in self.pattern:
            alts = [shlex.quote(t) for t in token]
            parts.append(alts[0] if len(alts) == 1 else "[" + "|".join(alts) + "]")
        return " ".join(parts)


@dataclass(frozen=True)
class Evaluation:
    """The outcome of :meth:`RuleSet.evaluate` for one exec.

    Attributes:
        decision: ``run``, ``escalate``, ``prompt`` or ``deny``.
        rule: the winning rule, or None when no rule matched (the configured default decided).
        matched: every matching rule, in load order.
        execution: for ``escalate``/``prompt``, how the command runs (default unsandboxed).
        reason: the winner's justification, or a text naming what happened.
        allow_env: variable names or fnmatch globs the winner lets through env cleaning.
        skipped: permissive rules whose prefix matched but whose program path is not trusted.
    """

    decision: str
    rule: Rule | None
    matched: tuple[Rule, ...]
    execution: Execution | None
    reason: str
    allow_env: tuple[str, ...] = ()
    skipped: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class RulesFile:
    """What a loader reads from one file, before files are merged into a RuleSet.

    Attributes:
        path: the file.
        rules: its rules, in file order (a rule naming several programs yields one per program).
        default: the file's ``default`` decision, or None when it sets none.
        trusted_dirs: the file's ``trusted_dirs``, or None when it sets none.
        host_executables: basename → absolute paths declared for it (``host_executable``).
    """

    path: Path
    rules: tuple[Rule, ...]
    default: str | None = None
    trusted_dirs: tuple[str, ...] | None = None
    host_executables: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def fail(path: Path | str, where: str, message: str) -> RulesError:
    """Build a RulesError whose text starts with the file and the rule (``where`` may be "")."""
    prefix = f"{path}: {where}: " if where else f"{path}: "
    return RulesError(prefix + message)


def parse_decision(value: object, path: Path, where: str) -> str:
    """Validate a decision string. Raises RulesError naming file and rule."""
    if value not in DECISIONS:
        raise fail(path, where, f"decision must be one of {', '.join(DECISIONS)}, not {value!r}")
    return str(value)


def parse_program(value: object, path: Path, where: str) -> str:
    """Validate a program: a plain basename or an absolute path (normalized)."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise fail(path, where, f"program must be a non-empty string, not {value!r}")
    if os.path.isabs(value):
        return os.path.normpath(value)
    if "/" in value:
        raise fail(path, where, f"program {value!r} must be a basename or an absolute path")
    return value


def parse_token(value: object, path: Path, where: str) -> Token:
    """Validate one prefix token: a string, or a non-empty list of string alternatives."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise fail(path, where, f"a prefix token must be a string or a non-empty list of strings, "
               f"not {value!r}")


def parse_example(value: object, path: Path, where: str) -> Command:
    """Validate one example command: a shell-like string (split with shlex) or a list of strings."""
    if isinstance(value, str):
        try:
            tokens = shlex.split(value)
        except ValueError as exc:
            raise fail(path, where, f"example {value!r} cannot be split: {exc}") from exc
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        tokens = list(value)
    else:
        raise fail(path, where, f"an example must be a string or a list of strings, not {value!r}")
    if not tokens:
        raise fail(path, where, f"example {value!r} is empty")
    return tuple(tokens)


def parse_examples(value: object, path: Path, where: str, key: str) -> tuple[Command, ...]:
    """Validate a ``match``/``not_match`` list."""
    if not isinstance(value, (list, tuple)):
        raise fail(path, where, f"{key} must be a list of example commands, not {value!r}")
    return tuple(parse_example(v, path, where) for v in value)


def check_examples(group: Sequence[Rule], path: Path, where: str) -> None:
    """Check the examples of one rule as written (one rule per program it names).

    Every ``match`` example must be matched by some rule of the group, and no ``not_match``
    example by any of them.

    Raises:
        RulesError: naming the file, the rule and the failing example.
    """
    if not group:
        return
    first = group[0]
    for example in first.match:
        if not any(rule.matches_example(example) for rule in group):
            raise fail(path, where, f"match example {shlex.join(example)!r} is not matched by "
                       f"this rule ({first.pattern_text()})")
    for example in first.not_match:
        if any(rule.matches_example(example) for rule in group):
            raise fail(path, where, f"not_match example {shlex.join(example)!r} is matched by "
                       f"this rule ({first.pattern_text()})")
