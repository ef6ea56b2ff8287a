"""The policy interface the escalation server consults, and the values that cross it.

The server asks any object satisfying :class:`Policy` two questions per intercepted exec
(docs/DESIGN.md §4): ``determine_action`` (Run / Escalate / Deny) and, for Escalate,
``prepare_escalated_exec`` (exactly what to spawn). In production the object is the gRPC client
(:mod:`execgate.server.grpc_policy`); tests and embedders may pass an in-process object.
These dataclasses are the Python mirror of the ``execgate.v1`` messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, Protocol, Sequence, runtime_checkable

from execgate.server.fileinfo import FileInfo, kinds

ExecutionKind = Literal["unsandboxed", "session_default", "permissions"]
Action = Literal["run", "escalate", "deny"]


@dataclass(frozen=True, slots=True)
class Permissions:
    """A sandbox permission profile: network on/off and filesystem roots (absolute paths).

    ``masked_dirs`` are emptied (a tmpfs) before the roots are bound: the user's real HOME when
    the session has a private one (:mod:`execgate.server.home`).

    ``hidden_paths`` are files that must not be reachable inside (a remote policy service's socket,
    the token and key files of ``execgate run``): their directory is masked, or the file covered
    (:func:`execgate.server.sandbox.bwrap_argv`). ``protected_paths`` are bound read-only after
    the writable roots (execgate's own installed package, which runs outside the sandbox later),
    so that a writable root above them cannot change them. Both only take away; the escalation
    server fills them in the session's profile, and a sandboxed escalation inherits them
    (docs/DESIGN.md §7).

    ``tmp_dir`` is a host directory bound read-write at ``/tmp`` instead of an empty tmpfs: the
    session's private ``/tmp`` (made by ``execgate run``, :mod:`execgate.server.home`). It comes
    from the session's profile only (the escalation server's own state): every sandboxed
    escalation of that session binds the same directory there, so that ``cd "$(mktemp -d)"``
    followed by an escalated ``git clone`` works; a granted profile's ``tmp_dir`` is ignored.
    None: a fresh tmpfs, as for the Python API by default.
    """

    network: bool = False
    writable_roots: tuple[str, ...] = ()
    readable_roots: tuple[str, ...] = ()
    masked_dirs: tuple[str, ...] = ()
    hidden_paths: tuple[str, ...] = ()
    protected_paths: tuple[str, ...] = ()
    tmp_dir: str | None = None


@dataclass(frozen=True, slots=True)
class Execution:
    """How an escalated command runs: unsandboxed, in the session's own profile, or a given profile."""

    kind: ExecutionKind = "unsandboxed"
    permissions: Permissions | None = None


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What the policy sees of the session with every request.

    Attributes:
        session_id: unique id of the session (one sandboxed shell / one agent).
        labels: free-form key/value labels given by the orchestrator.
        sandbox: the session's own sandbox profile, or None when the shell runs unconfined.
    """

    session_id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    sandbox: Permissions | None = None


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What the escalation server identified of the file an exec will run, in the caller's view
    (:mod:`execgate.server.identity`; the ``execgate.v1.FileIdentity`` message).

    Attributes:
        source: "fd" (the very file the wrapper opened and will execute) or "path" (the request's
            path resolved through the caller's ``/proc/PID/root``).
        device, inode: ``st_dev``, ``st_ino`` (stat(2)).
        uid, mode: owner and ``st_mode`` of the file.
        real_path: its path in the caller's view, symlinks resolved; when that could not be
            resolved, the kernel's name of the open file (whose basename is still the file's).
        root_dir_chain: every directory holding it (as named and as resolved), up to the caller's
            root, is root-owned and writable by neither group nor others.
        caller_can_modify: the caller could change the file or one of those directories.
        pseudo_fs: the file, or the path as named, lies under ``/proc`` or ``/dev``.
        same_for_server: the program path, in the server's own view, is this very file.
        changed_ns, size: ``st_ctime_ns`` and ``st_size`` when it was identified (the escalation
            server's own: not sent to a policy service, and not part of equality, so not of the
            decision cache's key either): an approved exec of the same inode whose contents or
            mode changed since is decided again (:mod:`.backstop`).
    """

    source: str
    device: int
    inode: int
    uid: int
    mode: int
    real_path: str
    root_dir_chain: bool
    caller_can_modify: bool
    pseudo_fs: bool
    same_for_server: bool
    changed_ns: int = field(default=0, compare=False)
    size: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class ExecFacts:
    """What the escalation server learnt of the file an exec will run, in the caller's view
    (:func:`execgate.server.exec_facts.learn`; ``ExecTarget`` fields 20 and 30-32). One object
    carries it from the server's request handler (or the backstop) through the policy client and
    codec to the service's decisions, rules, audit log and approvers.

    Both parts describe one file: the one the wrapper's target fd names, else the one the
    request's path resolves to in the caller's view (one walk, :mod:`execgate.server.identity`).

    Attributes:
        file: the file's headers and mode (:func:`execgate.server.fileinfo.describe`), or None
            if nothing was learnt (not readable, not a regular file, or a client that sends
            nothing).
        children_unseen: True if what the program execs would not be seen by the session's
            interception (:mod:`execgate.server.exec_facts`); None when unknown, which is kept
            distinct from False.
        problem: why ``file`` is None (or a fact is missing), for the audit log; else None.
        identity: which file it is and who could change it (:class:`FileIdentity`, issue #9
            class 4), the only ground for trusting it; None when it could not be identified
            (then no basename rule's trust applies).
    """

    file: FileInfo | None = None
    children_unseen: bool | None = None
    problem: str | None = None
    identity: FileIdentity | None = None

    @property
    def kinds(self) -> frozenset[str]:
        """The file's tags (:func:`execgate.server.fileinfo.kinds`; ``{"unknown"}`` without facts)."""
        return kinds(self.file)

    @property
    def summary(self) -> str:
        """One line for people: ``static elf64 x86_64; children unseen`` (approvers, check)."""
        info = self.file
        if info is None:
            what = "file not read" + (f" ({self.problem})" if self.problem else "")
        else:
            words = sorted(self.kinds - {"elf32", "elf64"}) + sorted(self.kinds & {"elf32", "elf64"})
            words += [info.machine_name] if info.machine_name else []
            if info.interpreter:
                words.append(f"interpreter {info.interpreter}")
            what = " ".join(words)
        unseen = {True: "children unseen", False: "children seen", None: "children: unknown"}
        return f"{what}; {unseen[self.children_unseen]}"


#: The facts of a request that carries none (an older client, or a caller with no file).
NO_FACTS = ExecFacts()


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to ``determine_action``.

    Attributes:
        action: "run", "escalate" or "deny".
        execution: for "escalate", how the command runs.
        reason: for "deny", the text shown to the caller (None allowed); otherwise a justification.
        rule_id: id of the rule that decided ("" if none), for the audit trail.
        decision_id: unique id of this decision, for the audit trail.
        error: True when the decision is a fail-closed Deny caused by an error (policy service down,
            slow, garbage), kept apart from a real policy denial in logs and metrics.
        note: a line for the caller's terminal ("" for none): e.g. why a program that a rule would
            escalate stays in the sandbox, and how to allow it.
    """

    action: Action
    execution: Execution | None = None
    reason: str | None = None
    rule_id: str = ""
    decision_id: str = ""
    error: bool = False
    note: str = ""

    @classmethod
    def run(cls, **kw: object) -> Decision:
        return cls(action="run", **kw)  # type: ignore[arg-type]

    @classmethod
    def escalate(cls, execution: Execution | None = None, **kw: object) -> Decision:
        return cls(action="escalate", execution=execution or Execution(), **kw)  # type: ignore[arg-type]

    @classmethod
    def deny(cls, reason: str | None, **kw: object) -> Decision:
        return cls(action="deny", reason=reason, **kw)  # type: ignore[arg-type]


CacheScope = Literal["program", "exact"]


@dataclass(frozen=True, slots=True)
class CacheHint:
    """The policy service's word that a decision may be reused (``execgate.v1.CacheHint``;
    :mod:`execgate.server.decision_cache`, docs/DESIGN.md §9).

    Attributes:
        scope: ``"program"`` — reuse for the same session, program, argv[0] and file facts,
            whatever the other arguments and the working directory; ``"exact"`` — only for the
            same session, program, argv, working directory and file facts.
        ttl_s: how long the entry may be used, in seconds from its answer (> 0).
        fingerprint: the rules the answer was decided by (a client drops its entries when it
            sees another fingerprint).
    """

    scope: CacheScope
    ttl_s: float
    fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class PreparedExec:
    """Exactly what the server spawns for an escalated command.

    Attributes:
        command: argv of the process to spawn; ``command[0]`` is the path executed.
        cwd: absolute working directory.
        env: the complete environment (nothing of the server's own environment is added).
        arg0: argv[0] seen by the program, if it differs from ``command[0]``.
    """

    command: Sequence[str]
    cwd: str
    env: Mapping[str, str]
    arg0: str | None = None


class PolicyError(Exception):
    """Raised by a :class:`Policy` that failed (service down, slow, garbage answer); the message
    names the cause and is shown to the caller as the Deny reason, unchanged."""


@runtime_checkable
class Policy(Protocol):
    """What the escalation server needs from a policy (in-process object or gRPC client).

    Implementations must not raise for ordinary denials; the server turns any exception into a
    fail-closed Deny whose reason names the cause (a :class:`PolicyError`'s message as is, any
    other exception's text after ``policy error:``).

    A policy whose class sets ``accepts_env = True`` also gets the caller's environment in
    ``determine_action(..., env=...)`` (so that a prompt can show the approver what will reach
    the command); others are called without it. Likewise a policy that sets
    ``accepts_facts = True`` gets ``facts=`` (:class:`ExecFacts`: the file's identity, the
    facts its trust judgement must rest on, docs/DESIGN.md §5, and its file info) in both
    ``determine_action`` and ``prepare_escalated_exec``.
    """

    async def determine_action(
        self, program: str, argv: Sequence[str], workdir: str, session: SessionContext
    ) -> Decision:
        """Decide one exec. ``program`` is absolute (resolved against ``workdir``)."""
        ...

    async def prepare_escalated_exec(
        self,
        program: str,
        argv: Sequence[str],
        workdir: str,
        env: Mapping[str, str],
        execution: Execution,
        session: SessionContext,
    ) -> PreparedExec:
        """Say exactly what to spawn for an escalated exec."""
        ...
