"""Load OpenAI Codex execpolicy ``.rules`` files, safely: parsed, never executed.

Codex writes its rules in a Starlark subset (facts from the codex-execpolicy README)::

    prefix_rule(
        pattern = ["git", ["push", "fetch"]],  # ordered tokens; a list lists alternatives
        decision = "prompt",                   # allow | prompt | forbidden; default allow
        justification = "why",
        match = [["git", "push"], "git fetch origin"],   # examples: lists, or shlex strings
        not_match = ["git status"],
    )
    host_executable(name = "git", paths = ["/usr/bin/git", "~/bin/git"])

The first pattern token is the program (alternatives allowed). Decisions map to execgate's:
``allow`` → escalate unsandboxed, ``prompt`` → prompt, ``forbidden`` → deny.

Safety: the text goes through :func:`ast.parse` only. Each top-level statement must be a call of
``prefix_rule`` or ``host_executable`` by plain name with keyword arguments whose values are string
literals or (nested) lists/tuples of them. Anything else — another call, an attribute, an import,
an assignment, a name, ``**kwargs``, f-strings — is a :class:`RulesError` naming the file and the
line. Nothing in the file is ever evaluated, so a rule file cannot run code.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

from execgate.server.policy import Execution

from .rules_model import (
    Rule,
    RulesError,
    RulesFile,
    check_examples,
    fail,
    parse_examples,
    parse_program,
    parse_token,
)

#: Codex decision → execgate decision (docs/DESIGN.md §5).
CODEX_DECISIONS = {"allow": "escalate", "prompt": "prompt", "forbidden": "deny"}
_PREFIX_RULE_KEYS = frozenset({"pattern", "decision", "justification", "match", "not_match"})
_HOST_KEYS = frozenset({"name", "paths"})


def load_codex(path: Path) -> RulesFile:
    """Read and validate one Codex ``.rules`` file without executing any of it.

    Args:
        path: the file.

    Returns:
        Its rules (one per program alternative of each ``prefix_rule``) and host executables.

    Raises:
        RulesError: unreadable file, syntax error, a construct other than the two allowed calls
            with literal keyword arguments, a bad value, or a failing example; the message names
            the file and line, and the example when one fails.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(path, "", f"cannot read rules file: {exc}") from exc
    try:
        tree = ast.parse(text, filename=str(path), mode="exec")
    except SyntaxError as exc:
        raise fail(path, f"line {exc.lineno}", f"syntax error: {exc.msg}") from exc
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        raise fail(path, "", f"cannot parse: {exc}") from exc
    rules: list[Rule] = []
    hosts: dict[str, tuple[str, ...]] = {}
    for index, stmt in enumerate(tree.body, start=1):
        try:
            name, kwargs = _call(stmt, path)
        except RecursionError as exc:
            raise fail(path, f"line {stmt.lineno}", "values nested too deeply") from exc
        if name == "prefix_rule":
            rules.extend(_prefix_rule(kwargs, index, stmt.lineno, path))
        else:
            host_name, paths = _host_executable(kwargs, stmt.lineno, path)
            hosts[host_name] = hosts.get(host_name, ()) + paths
    return RulesFile(Path(path), tuple(rules), None, None, hosts)


def _call(stmt: ast.stmt, path: Path) -> tuple[str, dict[str, Any]]:
    """Accept ``name(key=literal, …)`` for the two allowed names; return name and kwargs."""
    where = f"line {stmt.lineno}"
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        raise fail(path, where, f"only prefix_rule(...) and host_executable(...) calls are "
                   f"allowed, not {type(stmt).__name__.lower()} statements")
    call = stmt.value
    if not isinstance(call.func, ast.Name) or call.func.id not in ("prefix_rule",
                                                                   "host_executable"):
        raise fail(path, where, f"only prefix_rule(...) and host_executable(...) may be "
                   f"called, not {ast.unparse(call.func)!r}")
    if call.args:
        raise fail(path, where, f"{call.func.id}() takes keyword arguments only")
    kwargs: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise fail(path, where, "**kwargs is not allowed")
        if kw.arg in kwargs:
            raise fail(path, where, f"keyword {kw.arg!r} given twice")
        kwargs[kw.arg] = _literal(kw.value, path)
    return call.func.id, kwargs


def _literal(node: ast.expr, path: Path) -> Any:
    """Convert a string literal or a (nested) list/tuple of them; reject everything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(elt, path) for elt in node.elts]
    raise fail(path, f"line {node.lineno}", f"only string literals and lists of them are "
               f"allowed as values, not {ast.unparse(node)!r}")


def _prefix_rule(kwargs: dict[str, Any], index: int, line: int, path: Path) -> list[Rule]:
    """Build the rules of one ``prefix_rule`` (one per program alternative) and check examples."""
    where = f"prefix_rule #{index} (line {line})"
    unknown = sorted(set(kwargs) - _PREFIX_RULE_KEYS)
    if unknown:
        raise fail(path, where, f"unknown keyword(s) {', '.join(map(repr, unknown))}; "
                   f"allowed: {', '.join(sorted(_PREFIX_RULE_KEYS))}")
    pattern = kwargs.get("pattern")
    if not isinstance(pattern, list) or not pattern:
        raise fail(path, where, "pattern must be a non-empty list of tokens")
    tokens = [parse_token(t, path, where) for t in pattern]
    decision = kwargs.get("decision", "allow")
    if decision not in CODEX_DECISIONS:
        raise fail(path, where, f"decision must be allow, prompt or forbidden, not {decision!r}")
    justification = kwargs.get("justification", "")
    if not isinstance(justification, str):
        raise fail(path, where, "justification must be a string")
    ours = CODEX_DECISIONS[decision]
    common = dict(
        id=f"{path.name}#{index}",
        decision=ours,
        execution=Execution("unsandboxed") if ours in ("escalate", "prompt") else None,
        justification=justification,
        source=str(path),
        pattern=tuple(tokens[1:]),
        match=parse_examples(kwargs.get("match", []), path, where, "match"),
        not_match=parse_examples(kwargs.get("not_match", []), path, where, "not_match"),
        index=index,
        line=line,
    )
    group = [Rule(program=parse_program(p, path, where), **common) for p in tokens[0]]
    check_examples(group, path, where)
    return group


def _host_executable(kwargs: dict[str, Any], line: int, path: Path) -> tuple[str, tuple[str, ...]]:
    """Validate ``host_executable(name=…, paths=[…])``; ``~/`` expands to this user's home."""
    where = f"host_executable (line {line})"
    unknown = sorted(set(kwargs) - _HOST_KEYS)
    missing = sorted(_HOST_KEYS - set(kwargs))
    if unknown or missing:
        raise fail(path, where, f"takes exactly name= and paths= "
                   f"(unknown: {unknown or 'none'}, missing: {missing or 'none'})")
    name, paths = kwargs["name"], kwargs["paths"]
    if not isinstance(name, str) or not name or "/" in name:
        raise fail(path, where, f"name must be a basename, not {name!r}")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise fail(path, where, "paths must be a list of strings")
    resolved = []
    for p in paths:
        full = os.path.normpath(os.path.expanduser(p)) if p.startswith("~/") else p
        if not os.path.isabs(full):
            raise fail(path, where, f"path {p!r} is not absolute")
        if os.path.basename(full) != name:
            raise fail(path, where, f"path {p!r} does not end in {name!r}")
        resolved.append(os.path.normpath(full))
    return name, tuple(resolved)


__all__ = ["CODEX_DECISIONS", "RulesError", "load_codex"]
