"""The rules engine's values: decisions, rules, evaluations, and the checks shared by the loaders.

A :class:`Rule` is one program (basename or absolute path) plus an argv *prefix*: a sequence of
tokens matched against ``argv[1:]`` from the left, where each token is a tuple of alternatives.
Both loaders (:mod:`execgate.policy_service.rules_toml` and
:mod:`execgate.policy_service.codex_rules`) validate their input with the helpers here, so the
two formats reject the same mistakes with the same messages: the file, the rule and the example.

A TOML rule may also test what the server learnt of the file (issue #9 class 12, :class:`Facts`):
``file_kind`` (any of the file's tags, :func:`execgate.server.fileinfo.kinds`) and
``children_unseen`` (true, false or "unknown"). Such a rule may leave out ``program``: it then
names every program (:data:`ANY_PROGRAM`). Its examples say the facts they stand for
(:class:`Example`).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from execgate.server.policy import ExecFacts, Execution, FileIdentity

#: Every decision a rule may carry (docs/DESIGN.md §5).
DECISIONS = ("run", "escalate", "prompt", "deny")
#: Strictness: when several rules match, the highest wins (deny > prompt > run > escalate).
STRICTNESS = {"escalate": 0, "run": 1, "prompt": 2, "deny": 3}
#: Decisions that apply to every path with the rule's basename, trusted or not.
RESTRICTIVE = frozenset({"prompt", "deny"})

Token = tuple[str, ...]
Command = tuple[str, ...]
#: ``Rule.program`` of a rule that names no program: it applies to every program (a file-fact
#: rule such as ``children_unseen = true``); permissive ones only to trusted paths.
ANY_PROGRAM = "*"
#: Every tag ``file_kind`` may name (:func:`execgate.server.fileinfo.kinds`).
FILE_KINDS = ("static", "dynamic", "elf32", "elf64", "setuid", "setgid", "setcap", "script", "other",
              "malformed", "unknown")


@dataclass(frozen=True)
class Facts:
    """The rules engine's view of a request's :class:`~execgate.server.policy.ExecFacts`: what a
    rule's conditions test, and the identity trust is judged from.

    Attributes:
        kinds: the file's tags (``{"unknown"}`` when nothing was learnt).
        children_unseen: True / False, or None when unknown (kept distinct from False).
        identity: the file's identity (None: not identified, nothing trusted).
    """

    kinds: frozenset[str] = frozenset({"unknown"})
    children_unseen: bool | None = None
    identity: FileIdentity | None = None

    @classmethod
    def of(cls, facts: ExecFacts | None) -> Facts:
        """The facts of a request (None: a request that carries none: unknown)."""
        return UNKNOWN_FACTS if facts is None else cls(facts.kinds, facts.children_unseen, facts.identity)


#: What a request without file facts (or a plain example) stands for.
UNKNOWN_FACTS = Facts()


class Example(tuple):  # type: ignore[type-arg]
    """An example command (argv[0] first; a tuple of strings) and the file facts it stands for
    (``.facts``, :data:`UNKNOWN_FACTS` unless the example says otherwise)."""

    facts: Facts

    def __new__(cls, tokens: Sequence[str], facts: Facts = UNKNOWN_FACTS) -> Example:
        self = super().__new__(cls, tokens)
        self.facts = facts
        return self


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
        set_env: ``(name, value)`` pairs set in the escalated environment after cleaning, over
            the caller's (``escalate``/``prompt`` only; the rule author's values, never the
            caller's): e.g. an ssh that fails fast for git.
        source: path of the file the rule came from.
        pattern: the argv prefix after argv[0]; each token is a tuple of alternatives.
        match: example commands (argv[0] first) this rule must match.
        not_match: example commands this rule must not match.
        index: 1-based position of the rule in its file.
        line: line number in the file when known (Codex ``.rules`` files), else None.
        file_kind: the rule applies only when the file has one of these tags; () for any file.
        children_unseen: the rule applies only when the request's ``children_unseen`` is this
            (True, False, or "unknown" for a request without it); None for any.
    """

    id: str
    program: str
    decision: str
    execution: Execution | None = None
    justification: str = ""
    allow_env: tuple[str, ...] = ()
    set_env: tuple[tuple[str, str], ...] = ()
    source: str = ""
    pattern: tuple[Token, ...] = ()
    match: tuple[Example, ...] = field(default=(), repr=False)
    not_match: tuple[Example, ...] = field(default=(), repr=False)
    index: int = 0
    line: int | None = None
    file_kind: tuple[str, ...] = ()
    children_unseen: bool | str | None = None

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

    def matches_facts(self, facts: Facts) -> bool:
        """True when the file facts satisfy this rule's ``file_kind`` and ``children_unseen``."""
        if self.file_kind and not facts.kinds.intersection(self.file_kind):
            return False
        if self.children_unseen is None:
            return True
        if self.children_unseen == "unknown":
            return facts.children_unseen is None
        return facts.children_unseen is self.children_unseen

    def matches_example(self, command: Sequence[str]) -> bool:
        """Match an example command syntactically: by name or exact path, then by prefix, then
        by the facts it stands for (an :class:`Example`'s ``facts``; unknown for a plain tuple).

        Path trust is not considered here (examples are checked where the rules load, not where
        programs run): ``/tmp/x/git push`` matches a ``git push`` rule as an example.
        """
        if not command:
            return False
        head = command[0]
        if self.program == ANY_PROGRAM:
            named = True
        elif os.path.isabs(self.program):
            named = os.path.normpath(head) == self.program
        else:
            named = os.path.basename(head) == self.program
        facts = getattr(command, "facts", UNKNOWN_FACTS)
        return named and self.matches_args(command[1:]) and self.matches_facts(facts)

    @property
    def conditions_text(self) -> str:
        """The file conditions as text (``children_unseen=true file_kind=static|setuid``), or ""."""
        parts = []
        if self.children_unseen is not None:
            value = self.children_unseen
            parts.append(f"children_unseen={value if isinstance(value, str) else str(value).lower()}")
        if self.file_kind:
            parts.append("file_kind=" + "|".join(self.file_kind))
        return " ".join(parts)

    def pattern_text(self) -> str:
        """The prefix as text: ``git [push|fetch] origin`` (then any file conditions in braces)."""
        parts = [self.program if self.program == ANY_PROGRAM else shlex.quote(self.program)]
        for token in self.pattern:
            alts = [shlex.quote(t) for t in token]
            parts.append(alts[0] if len(alts) == 1 else "[" + "|".join(alts) + "]")
        if self.conditions_text:
            parts.append("{" + self.conditions_text + "}")
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
        argv_free: True when no candidate rule (one naming the program, its real file's or
            argv[0]'s basename, or any program) tests argv after argv[0]: the same program,
            argv[0] and facts give this outcome whatever the other arguments (the decision
            cache's program scope, docs/DESIGN.md §9). False when unknown.
    """

    decision: str
    rule: Rule | None
    matched: tuple[Rule, ...]
    execution: Execution | None
    reason: str
    allow_env: tuple[str, ...] = ()
    skipped: tuple[Rule, ...] = ()
    argv_free: bool = False


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
    if value == ANY_PROGRAM:
        raise fail(path, where, f"program {ANY_PROGRAM!r} is not a program name; a rule for every program "
                   "leaves program out and gives a file_kind or children_unseen condition")
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


def parse_example(value: object, path: Path, where: str) -> Example:
    """Validate one example command: a shell-like string (split with shlex), a list of strings, or
    a table ``{command = <string or list>, file_kind = [tags], children_unseen = true|false}``
    giving the file facts it stands for (a plain example stands for unknown facts)."""
    facts = UNKNOWN_FACTS
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"command", "file_kind", "children_unseen"})
        if unknown or "command" not in value:
            raise fail(path, where, f"an example table needs 'command' and may have 'file_kind' and "
                       f"'children_unseen', not {value!r}")
        kinds = parse_file_kind(value.get("file_kind", ["unknown"]), path, where)
        unseen = value.get("children_unseen")
        if unseen is not None and not isinstance(unseen, bool):
            raise fail(path, where, f"an example's children_unseen must be true or false, not {unseen!r}")
        facts = Facts(frozenset(kinds or ("unknown",)), unseen)
        value = value["command"]
    if isinstance(value, str):
        try:
            tokens = shlex.split(value)
        except ValueError as exc:
            raise fail(path, where, f"example {value!r} cannot be split: {exc}") from exc
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        tokens = list(value)
    else:
        raise fail(path, where, f"an example must be a string, a list of strings or a table, not {value!r}")
    if not tokens:
        raise fail(path, where, f"example {value!r} is empty")
    return Example(tokens, facts)


def parse_examples(value: object, path: Path, where: str, key: str) -> tuple[Example, ...]:
    """Validate a ``match``/``not_match`` list."""
    if not isinstance(value, (list, tuple)):
        raise fail(path, where, f"{key} must be a list of example commands, not {value!r}")
    return tuple(parse_example(v, path, where) for v in value)


def parse_file_kind(value: object, path: Path, where: str) -> tuple[str, ...]:
    """Validate a ``file_kind``: a tag or a list of tags among :data:`FILE_KINDS`."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise fail(path, where, f"file_kind must be a tag or a non-empty list of tags, not {value!r}")
    bad = [v for v in items if v not in FILE_KINDS]
    if bad:
        raise fail(path, where, f"unknown file_kind {', '.join(map(repr, bad))}; known: {', '.join(FILE_KINDS)}")
    return tuple(dict.fromkeys(items))


def parse_children_unseen(value: object, path: Path, where: str) -> bool | str:
    """Validate a rule's ``children_unseen``: true, false or "unknown"."""
    if isinstance(value, bool) or value == "unknown":
        return value  # type: ignore[return-value]
    raise fail(path, where, f'children_unseen must be true, false or "unknown", not {value!r}')


def _example_text(example: Sequence[str]) -> str:
    facts = getattr(example, "facts", UNKNOWN_FACTS)
    if facts == UNKNOWN_FACTS:
        return shlex.join(example)
    unseen = "unknown" if facts.children_unseen is None else str(facts.children_unseen).lower()
    return f"{shlex.join(example)} (file_kind={'|'.join(sorted(facts.kinds))}, children_unseen={unseen})"


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
            raise fail(path, where, f"match example {_example_text(example)!r} is not matched by "
                       f"this rule ({first.pattern_text()})")
    for example in first.not_match:
        if any(rule.matches_example(example) for rule in group):
            raise fail(path, where, f"not_match example {_example_text(example)!r} is matched by "
                       f"this rule ({first.pattern_text()})")
