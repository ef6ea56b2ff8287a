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

ExecutionKind = Literal["unsandboxed", "session_default", "permissions"]
Action = Literal["run", "escalate", "deny"]


@dataclass(frozen=True, slots=True)
class Permissions:
    """A sandbox permission profile: network on/off and filesystem roots (absolute paths)."""

    network: bool = False
    writable_roots: tuple[str, ...] = ()
    readable_roots: tuple[str, ...] = ()


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
    """

    action: Action
    execution: Execution | None = None
    reason: str | None = None
    rule_id: str = ""
    decision_id: str = ""
    error: bool = False

    @classmethod
    def run(cls, **kw: object) -> Decision:
        return cls(action="run", **kw)  # type: ignore[arg-type]

    @classmethod
    def escalate(cls, execution: Execution | None = None, **kw: object) -> Decision:
        return cls(action="escalate", execution=execution or Execution(), **kw)  # type: ignore[arg-type]

    @classmethod
    def deny(cls, reason: str | None, **kw: object) -> Decision:
        return cls(action="deny", reason=reason, **kw)  # type: ignore[arg-type]


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
    the command); others are called without it. Likewise ``accepts_identity = True``: it gets
    ``identity=`` (a :class:`FileIdentity` or None) in both calls, the facts its trust judgement
    must rest on (docs/DESIGN.md §5).
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
