"""``execgate policy check``: show what the rules decide for one command, without running it.

Usage::

    execgate policy check [--rules FILE]… [--no-default-rules] [--default D] [--trusted-dir DIR]… \\
        [--seccomp on|off] [--no-new-privs] [--json] -- PROGRAM [ARGS…]

PROGRAM is resolved through ``PATH`` unless it contains a ``/`` (then made absolute), exactly
as the server resolves an exec before asking the policy. ``--rules`` files layer on top of the
shipped default rules (unless ``--no-default-rules``); the files in force are printed first. Prints every matching rule (id, source, decision), the rules skipped because
the program path is not trusted, and the winner. The program's file is read as the server reads
it (:mod:`execgate.server.exec_facts`: ELF class, static or dynamic, set-ID bits) and its
``children_unseen`` judged for a session with the preload shim alone (``--seccomp on``: with the
backstop; ``--no-new-privs``: as inside a sandbox, where set-ID bits do not apply); rules that
test file facts see those. Exit status: 0 after printing a decision, 2
when a rules file is bad (the RulesError is printed) or PROGRAM cannot be resolved.

:mod:`execgate.policy_service.cli` registers this as a sub-command with :func:`add_arguments`
and :func:`run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import sys
from typing import Any, TextIO

from execgate.server.exec_facts import Coverage, children_unseen, gather
from execgate.server.policy import ExecFacts, Execution

from .rules_engine import RuleSet
from .rules_model import DECISIONS, Evaluation, Rule, RulesError
from .rules_store import describe_paths, layered_paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``policy check``'s options and the command to ``parser``."""
    parser.add_argument("--rules", action="append", metavar="FILE", default=None,
                        help="rules file (.toml or Codex .rules) or directory, layered on top of the "
                             "shipped rules; repeatable ('default' names the shipped file)")
    parser.add_argument("--no-default-rules", action="store_true",
                        help="do not load the shipped default rules under --rules")
    parser.add_argument("--default", choices=DECISIONS, default=None,
                        help="decision for unmatched commands (can tighten a file's default)")
    parser.add_argument("--trusted-dir", action="append", metavar="DIR", dest="trusted_dirs",
                        default=None, help="directory whose programs basename rules trust; "
                                           "repeatable (default: root-owned system directories)")
    parser.add_argument("--seccomp", choices=("on", "off"), default="off",
                        help="judge children_unseen as in a session with the seccomp backstop on, or with the "
                             "preload shim alone (default: off)")
    parser.add_argument("--no-new-privs", action="store_true",
                        help="judge children_unseen as inside a sandbox (no_new_privs: set-ID bits do not apply)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("command", nargs="+", metavar="PROGRAM [ARGS…]",
                        help="the command to check (put it after --)")


def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Evaluate ``args.command`` against the rules and print the result.

    Args:
        args: parsed by a parser set up with :func:`add_arguments`.
        out: where the result goes (default ``sys.stdout``).
        err: where errors go (default ``sys.stderr``).

    Returns:
        0 when a decision was printed; 2 for a bad rules file or an unresolvable program.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        paths = layered_paths(args.rules or [], defaults=not args.no_default_rules)
        rules = RuleSet.load(paths, default=args.default, trusted_dirs=args.trusted_dirs)
    except RulesError as exc:
        print(f"execgate policy check: bad rules: {exc}", file=err)
        return 2
    argv = list(args.command)
    program = resolve_program(argv[0])
    if program is None:
        print(f"execgate policy check: {argv[0]}: not found on PATH (give an absolute path)",
              file=err)
        return 2
    facts = local_facts(program, seccomp=args.seccomp == "on", no_new_privs=args.no_new_privs)
    evaluation = rules.evaluate(program, argv, facts)
    if args.json:
        report = evaluation_to_json(program, argv, evaluation)
        report["rules_files"] = [str(p) for p in rules.sources]
        report["file_kind"] = None if facts.file is None else sorted(facts.kinds)
        report["children_unseen"] = facts.children_unseen
        report["file"] = facts.summary
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        out.write(f"rules:    {describe_paths(paths)}\n")
        judged = "the seccomp backstop" if args.seccomp == "on" else "the preload shim alone"
        out.write(f"file:     {facts.summary} (for a session with {judged})\n")
        out.write(format_text(program, argv, evaluation))
    return 0


def resolve_program(name: str) -> str | None:
    """Absolute path of ``name``: made absolute if it has a ``/``, else searched on PATH."""
    if "/" in name:
        return os.path.normpath(os.path.abspath(name))
    found = shutil.which(name)
    return os.path.normpath(os.path.abspath(found)) if found else None


#: The caller ``policy check`` judges trust for: an unprivileged one (nobody), as most sessions run.
CHECK_CALLER_UID = 65534


def local_facts(program: str, *, seccomp: bool, no_new_privs: bool) -> ExecFacts:
    """What an escalation server would learn of ``program`` seen in this process's own
    filesystem view (:func:`execgate.server.exec_facts.gather`): its identity for an unprivileged
    caller (:data:`CHECK_CALLER_UID`; a root session's trust is narrower: nothing on a read-write
    mount), its file info, and ``children_unseen`` for a session with the installed preload shim
    (and the backstop if ``seccomp``). A file that cannot be read gives unknown facts."""
    from execgate.wrapper.artifacts import NativeArtifactMissing, preload_ld_value

    try:
        overlay = {"LD_PRELOAD": preload_ld_value()}
    except NativeArtifactMissing:
        overlay = {"LD_PRELOAD": "libexecgate_preload.so"}  # judged as if the native shim were built
    coverage = Coverage.of_session(overlay, seccomp=seccomp)
    facts = gather(os.getpid(), program, coverage, uid=CHECK_CALLER_UID)
    return dataclasses.replace(facts, children_unseen=children_unseen(facts.file, coverage, no_new_privs))


def format_text(program: str, argv: list[str], ev: Evaluation) -> str:
    """The human-readable report."""
    lines = [f"program:  {program}", f"argv:     {shlex.join(argv)}"]
    lines.append("matched:" if ev.matched else "matched:  (no rule)")
    lines += [f"  {_rule_line(rule, rule is ev.rule)}" for rule in ev.matched]
    if ev.skipped:
        lines.append("skipped (program not in a trusted directory):")
        lines += [f"  {_rule_line(rule, False)}" for rule in ev.skipped]
    winner = f"rule {ev.rule.id}" if ev.rule else "default"
    lines.append(f"decision: {ev.decision} ({winner})")
    if ev.execution is not None:
        lines.append(f"execution: {_execution_text(ev.execution)}")
    if ev.allow_env:
        lines.append(f"allow_env: {' '.join(ev.allow_env)}")
    if set_env := _set_env(ev):
        lines.append("set_env:  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in set_env))
    lines.append(f"reason:   {ev.reason}")
    return "\n".join(lines) + "\n"


def evaluation_to_json(program: str, argv: list[str], ev: Evaluation) -> dict[str, Any]:
    """The JSON report: ``decision``, ``rule`` (id or null), ``matched``, ``skipped``, …"""
    return {
        "program": program,
        "argv": argv,
        "decision": ev.decision,
        "rule": ev.rule.id if ev.rule else None,
        "matched": [_rule_json(r) for r in ev.matched],
        "skipped": [_rule_json(r) for r in ev.skipped],
        "execution": _execution_json(ev.execution),
        "reason": ev.reason,
        "allow_env": list(ev.allow_env),
        "set_env": dict(_set_env(ev)),
    }


def _set_env(ev: Evaluation) -> tuple[tuple[str, str], ...]:
    """The winning rule's ``set_env`` pairs (none without a rule)."""
    return tuple(getattr(ev.rule, "set_env", ()) or ()) if ev.rule is not None else ()


def _rule_line(rule: Rule, winner: bool) -> str:
    mark = "*" if winner else " "
    return f"{mark} {rule.id}  {rule.decision}  {rule.pattern_text()}  ({rule.location})"


def _rule_json(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "source": rule.source,
        "location": rule.location,
        "decision": rule.decision,
        "program": rule.program,
        "prefix": [list(t) for t in rule.pattern],
        "justification": rule.justification,
    }


def _execution_json(execution: Execution | None) -> dict[str, Any] | None:
    if execution is None:
        return None
    out: dict[str, Any] = {"kind": execution.kind}
    if execution.permissions is not None:
        p = execution.permissions
        out["permissions"] = {"network": p.network, "writable_roots": list(p.writable_roots),
                              "readable_roots": list(p.readable_roots)}
    return out


def _execution_text(execution: Execution) -> str:
    if execution.permissions is None:
        return execution.kind
    p = execution.permissions
    parts = [f"network={'on' if p.network else 'off'}"]
    if p.writable_roots:
        parts.append("writable=" + ",".join(p.writable_roots))
    if p.readable_roots:
        parts.append("readable=" + ",".join(p.readable_roots))
    return (f"permissions ({' '.join(parts)}; in a sandboxed session joined by the session's own roots; "
            "in a session without a sandbox, unconfined)")
