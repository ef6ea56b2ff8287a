"""The rule set: merging rules files and deciding one exec (docs/DESIGN.md §5).

Evaluation of ``(program, argv)``, ``program`` absolute:

1. Candidate rules are those naming ``program`` exactly, or its basename. A *permissive* rule
   (run, escalate) named by basename applies only when the file is trusted (below). A
   *restrictive* rule (prompt, deny) named by basename applies to every path with that basename,
   and also when the basename of ``argv[0]`` or of the *real file* the escalation server
   identified (``facts.identity.real_path``) carries the name — so ``/dev/fd/3``,
   ``/proc/self/fd/N``, a renamed symlink or ``exec -a`` cannot dodge a denial.
   Rules that name no program (file-fact rules, ``ANY_PROGRAM``) are candidates for every
   exec; permissive ones apply only to trusted files, as basename rules.
2. A candidate matches when ``argv[1:]`` starts with its prefix and the request's file facts
   (``file_kind``, ``children_unseen``; unknown when the request carries none) satisfy its
   conditions.
3. The strictest matching rule wins (deny > prompt > run > escalate); among equals, the first
   loaded. No match: the configured default.

Trust of a file for basename rules is judged only from the identity the escalation server sent
(``ExecFacts.identity``, a :class:`~execgate.server.policy.FileIdentity` established in the
*caller's* filesystem view, :mod:`execgate.server.identity`), never from this process's own filesystem, which may differ (a
sandbox's private ``/tmp`` and ``/dev``, another host). No facts (another client): not trusted.
Otherwise never trusted when the file or the path as named lies under ``/proc`` or ``/dev``, or it
is not a regular file; then, first that applies:

- a ``host_executable`` entry exists for the basename: trusted only if listed (Codex semantics);
- its directory is one of the configured ``trusted_dirs`` (exactly): trusted. The list *adds*
  to the test below (a virtualenv's ``bin`` listed in a rules file does not take trust away from
  ``/usr/bin/git``). Both lists are the operator's word, even for files the caller owns;
- otherwise: trusted only if every directory holding it (as named and as resolved, up to the
  caller's root) is root-owned and writable by neither group nor others, the file is owned by
  root and not writable by group or others, and the caller could modify none of them.
  ``/usr/bin`` passes, ``/tmp/x`` and ``$HOME/bin`` do not, nor does a root session's
  root-owned working directory (root writes it on its read-write mount).
"""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from execgate.server.policy import ExecFacts, Execution, FileIdentity

from .codex_rules import load_codex
from .rules_model import ANY_PROGRAM, STRICTNESS, Evaluation, Facts, Rule, RulesError, RulesFile, parse_decision
from .rules_toml import load_toml

#: The rules shipped with execgate, loaded when no rules file is given.
DEFAULT_RULES_PATH = Path(__file__).resolve().parent / "rules" / "default.toml"
_SUFFIXES = (".toml", ".rules")
_UNSAFE_MODE = stat.S_IWGRP | stat.S_IWOTH


class RuleSet:
    """An immutable, merged set of rules that decides execs.

    Build one with :meth:`load`; share it freely (it is never mutated).
    """

    def __init__(
        self,
        rules: Iterable[Rule],
        *,
        default: str = "run",
        trusted_dirs: Iterable[str] | None = None,
        host_executables: Mapping[str, Sequence[str]] | None = None,
        sources: Iterable[Path] = (),
        fingerprint: str | None = None,
    ) -> None:
        """Build a rule set from validated rules.

        Args:
            rules: rules in priority order for ties (load order).
            default: decision for commands no rule matches.
            trusted_dirs: directories whose programs basename rules trust, in addition to the
                root-owned-directory test.
            host_executables: basename → the only absolute paths its permissive rules trust.
            sources: the files the rules came from (informational).
            fingerprint: identifies these rules for the decision cache (:attr:`fingerprint`);
                default: a random value, unique to this object.

        Raises:
            RulesError: ``default`` is not a decision.
        """
        #: Identifies the rules in every DetermineAction answer (docs/DESIGN.md §9): a client
        #: drops its cached decisions when it sees another value. :meth:`load` makes it a hash
        #: of the files' bytes and the settings, so replicas loaded with the same files agree.
        self.fingerprint = fingerprint if fingerprint is not None else uuid.uuid4().hex
        self._rules = tuple(rules)
        self._default = parse_decision(default, Path("<arguments>"), "default")
        self._trusted_dirs = (None if trusted_dirs is None
                              else frozenset(os.path.normpath(d) for d in trusted_dirs))
        self._hosts = {k: frozenset(v) for k, v in (host_executables or {}).items()}
        self._sources = tuple(sources)
        self._by_name: dict[str, list[Rule]] = {}
        for rule in self._rules:
            self._by_name.setdefault(rule.program, []).append(rule)
        self._order = {id(rule): n for n, rule in enumerate(self._rules)}

    @classmethod
    def load(
        cls,
        paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
        *,
        default: str | None = None,
        trusted_dirs: Iterable[str] | None = None,
    ) -> RuleSet:
        """Load rules files (``.toml`` execgate format, ``.rules`` Codex format, by suffix).

        A directory stands for its ``*.toml`` and ``*.rules`` files, sorted by name.

        Args:
            paths: files or directories, in priority order for ties.
            default: decision for unmatched commands. The effective default is the strictest of
                this argument and every file's ``default`` (a caller can tighten, never loosen,
                a file's default); ``run`` when none is set.
            trusted_dirs: overrides every file's ``trusted_dirs`` when given.

        Raises:
            RulesError: a file is missing, unreadable, has an unknown suffix or is invalid; rule
                ids collide across files; or ``default`` is not a decision.
        """
        expanded = expand_paths(paths)
        digest = hashlib.sha256()
        for path in expanded:  # read before parsing: a change in between makes a new fingerprint at the next reload
            try:
                data = path.read_bytes()
            except OSError:
                data = b""
            digest.update(b"%d:%s%d:" % (len(str(path)), str(path).encode("utf-8", "surrogateescape"), len(data)))
            digest.update(data)
        files = [_load_file(p) for p in expanded]
        defaults = [d for d in [default, *(f.default for f in files)] if d is not None]
        for d in defaults:
            parse_decision(d, Path("<arguments>"), "default")
        effective = max(defaults, key=STRICTNESS.__getitem__) if defaults else "run"
        if trusted_dirs is None:
            listed = [d for f in files if f.trusted_dirs is not None for d in f.trusted_dirs]
            if any(f.trusted_dirs is not None for f in files):
                trusted_dirs = listed
        hosts: dict[str, tuple[str, ...]] = {}
        for f in files:
            for name, host_paths in f.host_executables.items():
                hosts[name] = hosts.get(name, ()) + host_paths
        _check_unique_ids(files)
        return cls(
            (rule for f in files for rule in f.rules),
            default=effective,
            trusted_dirs=trusted_dirs,
            host_executables=hosts,
            sources=(f.path for f in files),
            fingerprint=_settings_digest(digest, effective, trusted_dirs),
        )

    @property
    def rules(self) -> tuple[Rule, ...]:
        """Every rule, in load order."""
        return self._rules

    @property
    def default(self) -> str:
        """The decision for commands no rule matches."""
        return self._default

    @property
    def sources(self) -> tuple[Path, ...]:
        """The files this set was loaded from."""
        return self._sources

    def evaluate(self, program: str, argv: Sequence[str], facts: ExecFacts | Facts | None = None) -> Evaluation:
        """Decide one exec. No filesystem access.

        Args:
            program: absolute path of the program executed (resolved by the server).
            argv: the full argv, argv[0] included.
            facts: what the escalation server learnt of the file (:class:`ExecFacts`, or the
                rules' own view of it, :class:`Facts`): its ``identity`` is all trust rests on,
                its file info is what file-fact rules test. None: nothing known (nothing
                trusted, file facts unknown).

        Returns:
            The decision, the winning rule, every matching rule and the rules skipped because
            ``program`` is not trusted for them.
        """
        program = os.path.normpath(program)
        args = tuple(argv[1:])
        known = facts if isinstance(facts, Facts) else Facts.of(facts)
        identity = known.identity
        matched: list[Rule] = []
        skipped: list[Rule] = []
        trusted: bool | None = None
        candidates = self._candidates(program, argv, identity)
        # Whether argv[1:] can matter: only through a candidate's prefix (the cache scope).
        argv_free = not any(rule.pattern for rule in candidates)
        for rule in candidates:
            if not rule.matches_args(args) or not rule.matches_facts(known):
                continue
            if not rule.restrictive and not os.path.isabs(rule.program):
                if trusted is None:
                    trusted = self.is_trusted(program, identity)
                if not trusted:
                    skipped.append(rule)
                    continue
            elif not rule.restrictive and not _names_the_file(identity):
                skipped.append(rule)  # the path as named is not the file that would run
                continue
            matched.append(rule)
        if not matched:
            return self._default_evaluation(program, tuple(skipped), argv_free)
        winner = max(matched, key=lambda r: (STRICTNESS[r.decision], -self._order[id(r)]))
        reason = winner.justification or f"rule {winner.id} ({winner.location}): {winner.decision}"
        return Evaluation(
            decision=winner.decision,
            rule=winner,
            matched=tuple(matched),
            execution=_execution_for(winner.decision, winner.execution),
            reason=reason,
            allow_env=winner.allow_env,
            skipped=tuple(skipped),
            argv_free=argv_free,
        )

    def is_trusted(self, program: str, identity: FileIdentity | None = None) -> bool:
        """True when permissive (run, escalate) basename rules may apply to absolute ``program``,
        judged from ``identity`` alone (module doc); False without it."""
        program = os.path.normpath(program)
        if identity is None or not os.path.isabs(program):
            return False
        if identity.pseudo_fs or _is_pseudo(program) or _is_pseudo(identity.real_path) \
                or not stat.S_ISREG(identity.mode):
            return False
        # An explicit list is the operator's word, even for a file the caller owns (Homebrew).
        listed = self._hosts.get(os.path.basename(program))
        if listed is not None:
            return program in listed
        if self._trusted_dirs is not None and os.path.dirname(program) in self._trusted_dirs:
            return True
        return (identity.root_dir_chain and identity.uid == 0 and not identity.mode & _UNSAFE_MODE
                and not identity.caller_can_modify)

    def _candidates(self, program: str, argv: Sequence[str], identity: FileIdentity | None) -> list[Rule]:
        """Rules naming the program, by path or by name, in load order, without duplicates."""
        found = {id(r): r for r in self._by_name.get(program, ())}
        found.update((id(r), r) for r in self._by_name.get(os.path.basename(program), ()))
        aliases = set()
        if identity is not None and identity.real_path:
            aliases.add(os.path.basename(identity.real_path))
            found.update((id(r), r) for r in self._by_name.get(identity.real_path, ()) if r.restrictive)
        found.update((id(r), r) for r in self._by_name.get(ANY_PROGRAM, ()))
        if argv:
            aliases.add(os.path.basename(argv[0]))
        for alias in aliases:
            found.update((id(r), r) for r in self._by_name.get(alias, ()) if r.restrictive)
        return sorted(found.values(), key=lambda r: self._order[id(r)])

    def _default_evaluation(self, program: str, skipped: tuple[Rule, ...], argv_free: bool = False) -> Evaluation:
        reason = f"no rule matched {program}; default: {self._default}"
        if skipped and os.path.isabs(skipped[0].program):
            reason += (f" (rule {skipped[0].id} names {skipped[0].program} but the file that would "
                       f"run is not the one at that path)")
        elif skipped:
            reason += (f" (rule {skipped[0].id} names {skipped[0].program} but {program} is not "
                       f"in a trusted directory)")
        return Evaluation(
            decision=self._default,
            rule=None,
            matched=(),
            execution=_execution_for(self._default, None),
            reason=reason,
            skipped=skipped,
            argv_free=argv_free,
        )


def expand_paths(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> list[Path]:
    """Turn files and directories into the list of rules files to load, in order.

    Raises:
        RulesError: a path does not exist, or a directory cannot be listed or holds no rules file.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            try:
                found = sorted(p for p in path.iterdir() if p.suffix in _SUFFIXES)
            except OSError as exc:
                raise RulesError(f"{path}: cannot list rules directory: {exc}") from exc
            if not found:
                # e.g. a bind mount whose source was missing: never fall back to the default silently.
                raise RulesError(f"{path}: rules directory holds no .toml or .rules file")
            out.extend(found)
        elif not path.exists():
            raise RulesError(f"{path}: no such rules file")
        else:
            out.append(path)
    return out


def _load_file(path: Path) -> RulesFile:
    if path.suffix == ".toml":
        loaded = load_toml(path)
    elif path.suffix == ".rules":
        loaded = load_codex(path)
    else:
        raise RulesError(f"{path}: unknown rules file type (expected .toml or .rules)")
    if not (loaded.rules or loaded.default or loaded.trusted_dirs is not None or loaded.host_executables):
        # An empty file (a truncated write, a missing bind-mount source) must not quietly replace
        # the rules a user meant with "no rules, default run".
        raise RulesError(f"{path}: holds no rule and no setting (an empty rules file)")
    return loaded


def _check_unique_ids(files: Sequence[RulesFile]) -> None:
    owner: dict[str, Path] = {}
    for f in files:
        for rule_id in dict.fromkeys(r.id for r in f.rules):
            if rule_id in owner and owner[rule_id] != f.path:
                raise RulesError(f"{f.path}: rule {rule_id!r}: id already used in {owner[rule_id]}")
            owner[rule_id] = f.path


def _settings_digest(digest: "hashlib._Hash", default: str, trusted_dirs: Iterable[str] | None) -> str:
    """The rules fingerprint: the files' digest, then the effective default and trusted_dirs."""
    digest.update(b"\0default=" + default.encode())
    if trusted_dirs is not None:
        for d in sorted(trusted_dirs):
            digest.update(b"\0dir=" + d.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32]


def _execution_for(decision: str, execution: Execution | None) -> Execution | None:
    if decision in ("escalate", "prompt"):
        return execution or Execution("unsandboxed")
    return None


def _names_the_file(identity: FileIdentity | None) -> bool:
    """True when the program's path, as named, is the file that would run: the server identified
    the file and found it at that path, outside ``/proc`` and ``/dev`` (a permissive rule named by
    absolute path needs this: ``link/../../usr/bin/id`` is lexically ``/usr/bin/id`` but the
    kernel runs another file)."""
    return identity is not None and not identity.pseudo_fs


def _is_pseudo(path: str) -> bool:
    """True if ``path`` lies under ``/proc`` or ``/dev`` (never trusted, issue #9)."""
    return any(path == root or path.startswith(root + "/") for root in ("/proc", "/dev"))
