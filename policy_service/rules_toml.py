"""Load execgate's TOML rules files (stdlib :mod:`tomllib`).

Schema (every key is optional unless marked; unknown keys are errors)::

    default = "run"                   # decision for commands no rule matches
    trusted_dirs = ["/opt/tools/bin"] # adds to the root-owned-directory test (see rules_engine)

    [host_executable]                 # basename -> the only paths its permissive rules apply to
    git = ["/usr/bin/git", "/opt/homebrew/bin/git"]

    [[rule]]
    id = "git-network"                # default: "<file name>#<index>", index 1-based
    program = "git"                   # required: basename, absolute path, or a list of them
    prefix = [["push", "fetch"]]      # argv after argv[0]; a list token lists alternatives
    decision = "escalate"             # required: run | escalate | prompt | deny
    execution = { network = true }    # escalate/prompt only: "unsandboxed" (default),
                                      # "session_default", or a permissions table with
                                      # network (bool), writable_roots, readable_roots (absolute)
    justification = "why"             # shown to approvers and in denials
    allow_env = ["SSH_AUTH_SOCK"]     # names or fnmatch globs kept by env cleaning
    set_env = { GIT_SSH_COMMAND = "ssh -o BatchMode=yes" }  # escalate/prompt only: set after
                                      # cleaning, over the caller's value
    match = ["git push origin main"]  # examples (strings split with shlex, or lists) that
    not_match = [["git", "status"]]   # must / must not match; checked at load

    [[rule]]                          # a file-fact rule (issue #9 class 12); program optional
    children_unseen = true            # true | false | "unknown": what the server said of the exec
    file_kind = ["static", "setuid"]  # any of: static dynamic elf32 elf64 setuid setgid setcap
                                      # script other malformed unknown
    decision = "prompt"
    match = [{ command = "./tool", children_unseen = true, file_kind = ["static"] }]
    not_match = ["./tool"]            # a plain example stands for unknown facts

A file is accepted whole or rejected whole: any error raises :class:`RulesError` naming the
file, the rule (id and index) and, for a failing example, the example.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from execgate.server.policy import Execution, Permissions

from .rules_model import (
    ANY_PROGRAM,
    Rule,
    RulesError,
    RulesFile,
    check_examples,
    fail,
    parse_decision,
    parse_children_unseen,
    parse_examples,
    parse_file_kind,
    parse_program,
    parse_token,
)

_TOP_KEYS = frozenset({"default", "trusted_dirs", "host_executable", "rule"})
_RULE_KEYS = frozenset({
    "id", "program", "prefix", "decision", "execution", "justification", "allow_env", "set_env",
    "match", "not_match", "file_kind", "children_unseen",
})
_PERMISSION_KEYS = frozenset({"network", "writable_roots", "readable_roots"})


def load_toml(path: Path) -> RulesFile:
    """Read and validate one TOML rules file.

    Args:
        path: the file.

    Returns:
        The file's rules and settings.

    Raises:
        RulesError: unreadable file, TOML syntax error, unknown key, wrong type, bad value, or
            a failing ``match``/``not_match`` example; the message names file, rule and example.
    """
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise fail(path, "", f"cannot read rules file: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise fail(path, "", f"TOML syntax error: {exc}") from exc
    _check_keys(data, _TOP_KEYS, path, "")
    default = data.get("default")
    if default is not None:
        default = parse_decision(default, path, "default")
    trusted = data.get("trusted_dirs")
    if trusted is not None:
        trusted = tuple(os.path.normpath(p) for p in _abs_paths(trusted, path, "trusted_dirs"))
    hosts = _host_executables(data.get("host_executable", {}), path)
    tables = data.get("rule", [])
    if not isinstance(tables, list):
        raise fail(path, "", "'rule' must be an array of tables ([[rule]])")
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, table in enumerate(tables, start=1):
        group = _rule_group(table, index, path)
        if group[0].id in seen:
            raise fail(path, f"rule {group[0].id!r} (#{index})", "duplicate rule id")
        seen.add(group[0].id)
        rules.extend(group)
    return RulesFile(path, tuple(rules), default, trusted, hosts)


def _rule_group(table: Any, index: int, path: Path) -> list[Rule]:
    """Validate one ``[[rule]]`` table; one Rule per program it names, examples checked."""
    where = f"rule #{index}"
    if not isinstance(table, dict):
        raise fail(path, where, "must be a table")
    rule_id = table.get("id", f"{path.name}#{index}")
    if not isinstance(rule_id, str) or not rule_id:
        raise fail(path, where, f"id must be a non-empty string, not {rule_id!r}")
    where = f"rule {rule_id!r} (#{index})"
    _check_keys(table, _RULE_KEYS, path, where)
    conditional = "file_kind" in table or "children_unseen" in table
    for required in ("program", "decision"):
        if required not in table and not (required == "program" and conditional):
            raise fail(path, where, f"missing required key {required!r}"
                       + (" (or a file_kind / children_unseen condition)" if required == "program" else ""))
    decision = parse_decision(table["decision"], path, where)
    programs = table.get("program", [ANY_PROGRAM])
    if isinstance(programs, str):
        programs = [programs]
    if not isinstance(programs, list) or not programs:
        raise fail(path, where, "program must be a string or a non-empty list of strings")
    prefix = table.get("prefix", [])
    if not isinstance(prefix, list):
        raise fail(path, where, f"prefix must be a list of tokens, not {prefix!r}")
    common = dict(
        id=rule_id,
        decision=decision,
        execution=_execution(table, decision, path, where),
        justification=_string(table.get("justification", ""), path, where, "justification"),
        allow_env=_allow_env(table.get("allow_env", []), path, where),
        set_env=_set_env(table.get("set_env"), decision, path, where),
        source=str(path),
        pattern=tuple(parse_token(t, path, where) for t in prefix),
        match=parse_examples(table.get("match", []), path, where, "match"),
        not_match=parse_examples(table.get("not_match", []), path, where, "not_match"),
        index=index,
        file_kind=parse_file_kind(table["file_kind"], path, where) if "file_kind" in table else (),
        children_unseen=(parse_children_unseen(table["children_unseen"], path, where)
                         if "children_unseen" in table else None),
    )
    if "program" not in table:
        group = [Rule(program=ANY_PROGRAM, **common)]
    else:
        group = [Rule(program=parse_program(p, path, where), **common) for p in programs]
    check_examples(group, path, where)
    return group


def _execution(table: dict, decision: str, path: Path, where: str) -> Execution | None:
    """Parse ``execution``: only for escalate/prompt, default unsandboxed."""
    value = table.get("execution")
    if decision not in ("escalate", "prompt"):
        if value is not None:
            raise fail(path, where, f"execution is only allowed with escalate or prompt, "
                       f"not with {decision}")
        return None
    if value is None or value == "unsandboxed":
        return Execution("unsandboxed")
    if value == "session_default":
        return Execution("session_default")
    if not isinstance(value, dict):
        raise fail(path, where, f"execution must be \"unsandboxed\", \"session_default\" or a "
                   f"permissions table, not {value!r}")
    _check_keys(value, _PERMISSION_KEYS, path, where + ": execution")
    network = value.get("network", False)
    if not isinstance(network, bool):
        raise fail(path, where, f"execution.network must be true or false, not {network!r}")
    perms = Permissions(
        network=network,
        writable_roots=_abs_paths(value.get("writable_roots", []), path, where, "writable_roots"),
        readable_roots=_abs_paths(value.get("readable_roots", []), path, where, "readable_roots"),
    )
    return Execution("permissions", perms)


def _host_executables(value: Any, path: Path) -> dict[str, tuple[str, ...]]:
    """Parse ``[host_executable]``: basename → absolute paths whose basename is that name."""
    if not isinstance(value, dict):
        raise fail(path, "host_executable", "must be a table of name = [paths]")
    hosts: dict[str, tuple[str, ...]] = {}
    for name, paths in value.items():
        where = f"host_executable {name!r}"
        parse_program(name, path, where)
        if os.path.isabs(name):
            raise fail(path, where, "the name must be a basename")
        resolved = tuple(os.path.normpath(os.path.expanduser(p))
                         for p in _abs_paths(paths, path, where, home_ok=True))
        for p in resolved:
            if os.path.basename(p) != name:
                raise fail(path, where, f"path {p!r} does not end in {name!r}")
        hosts[name] = resolved
    return hosts


def _abs_paths(value: Any, path: Path, where: str, key: str = "",
               *, home_ok: bool = False) -> tuple[str, ...]:
    """Validate a list of absolute paths (``~/…`` too when ``home_ok``)."""
    label = f"{key} " if key else ""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(path, where, f"{label}must be a list of absolute paths, not {value!r}")
    for v in value:
        if not (os.path.isabs(v) or (home_ok and v.startswith("~/"))):
            raise fail(path, where, f"{label}path {v!r} is not absolute")
    return tuple(value)


def _allow_env(value: Any, path: Path, where: str) -> tuple[str, ...]:
    """Validate ``allow_env``: names or fnmatch globs, no ``=``."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v and "=" not in v
                                              for v in value):
        raise fail(path, where, f"allow_env must be a list of variable names or globs, "
                   f"not {value!r}")
    return tuple(value)


#: What ``set_env`` accepts as a variable name.
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Longest ``set_env`` value, in characters.
_MAX_SET_ENV_VALUE = 4096


def _set_env(value: Any, decision: str, path: Path, where: str) -> tuple[tuple[str, str], ...]:
    """Validate ``set_env``: a table of variable names (``[A-Za-z_][A-Za-z0-9_]*``) to strings
    (no NUL, at most 4096 characters), only with escalate or prompt."""
    if value is None:
        return ()
    if decision not in ("escalate", "prompt"):
        raise fail(path, where, f"set_env is only allowed with escalate or prompt, not with {decision}")
    if not isinstance(value, dict):
        raise fail(path, where, f"set_env must be a table of NAME = \"value\", not {value!r}")
    pairs = []
    for name, text in value.items():
        if not _VARIABLE_NAME.fullmatch(name):
            raise fail(path, where, f"set_env: {name!r} is not a variable name (letters, digits, _)")
        if not isinstance(text, str) or "\0" in text or len(text) > _MAX_SET_ENV_VALUE:
            raise fail(path, where, f"set_env: {name} must be a string without NUL of at most "
                       f"{_MAX_SET_ENV_VALUE} characters, not {text!r}")
        pairs.append((name, text))
    return tuple(pairs)


def _string(value: Any, path: Path, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise fail(path, where, f"{key} must be a string, not {value!r}")
    return value


def _check_keys(table: dict, allowed: frozenset[str], path: Path, where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise fail(path, where, f"unknown key(s) {', '.join(map(repr, unknown))}; "
                   f"allowed: {', '.join(sorted(allowed))}")


__all__ = ["load_toml", "RulesError"]
