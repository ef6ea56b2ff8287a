"""Conversions between the :mod:`execgate.server.policy` dataclasses and ``execgate.v1`` messages.

Both sides of the gRPC contract use these: the server's client (:mod:`execgate.server.grpc_policy`)
and the policy service (:mod:`execgate.policy_service.servicer`). Decoders validate what a peer
sent and raise :class:`CodecError` for anything the contract forbids (an unset oneof, a relative
path, an empty argv), so that each side can answer with its own failure (INVALID_ARGUMENT on the
service, a fail-closed Deny on the client).
"""

from __future__ import annotations

import os
from typing import Sequence

from execgate.server.fileinfo import FileInfo
from execgate.server.policy import (NO_FACTS, CacheHint, Decision, ExecFacts, Execution, FileIdentity, Permissions,
                                    PreparedExec, SessionContext)
from execgate.server.wiretext import restore_text, wire_text  # noqa: F401 - part of this module's API
from execgate.v1 import policy_pb2 as pb


class CodecError(ValueError):
    """Raised when a message breaks the ``execgate.v1`` contract (missing or invalid field)."""


def permissions_to_pb(perms: Permissions) -> pb.Permissions:
    return pb.Permissions(
        network=perms.network,
        writable_roots=list(perms.writable_roots),
        readable_roots=list(perms.readable_roots),
        masked_dirs=list(perms.masked_dirs),
        hidden_paths=list(perms.hidden_paths),
        protected_paths=list(perms.protected_paths),
        tmp_dir=perms.tmp_dir or "",
    )


def permissions_from_pb(msg: pb.Permissions) -> Permissions:
    """Decode a profile.

    Raises:
        CodecError: a root (or hidden or protected path) is not an absolute path, or there are more
            hidden and protected paths than ``MAX_SANDBOX_ROOTS`` or one is longer than a path may be;
            or ``tmp_dir`` is set but not an absolute, normalised path other than ``/`` and
            ``/tmp``, or longer than a path may be.
    """
    for root in (*msg.writable_roots, *msg.readable_roots, *msg.masked_dirs, *msg.hidden_paths, *msg.protected_paths):
        if not os.path.isabs(root):
            raise CodecError(f"sandbox root {root!r} is not an absolute path")
    if msg.tmp_dir and (not os.path.isabs(msg.tmp_dir) or os.path.normpath(msg.tmp_dir) != msg.tmp_dir
                        or msg.tmp_dir in ("/", "/tmp")):
        raise CodecError(f"sandbox tmp_dir {msg.tmp_dir[:256]!r} is not an absolute, normalised directory "
                         "other than / and /tmp")
    from execgate.server import protocol

    extra = (*msg.hidden_paths, *msg.protected_paths, *((msg.tmp_dir,) if msg.tmp_dir else ()))
    if len(extra) > protocol.MAX_SANDBOX_ROOTS:
        raise CodecError(f"sandbox has {len(extra)} hidden and protected paths, more than the bound of "
                         f"{protocol.MAX_SANDBOX_ROOTS}")
    if (why := protocol.path_bounds_violation({f"sandbox path {i}": r for i, r in enumerate(extra)},
                                              scale=protocol.GRPC_TEXT_EXPANSION)) is not None:
        raise CodecError(why)
    return Permissions(
        network=msg.network,
        writable_roots=tuple(msg.writable_roots),
        readable_roots=tuple(msg.readable_roots),
        masked_dirs=tuple(msg.masked_dirs),
        hidden_paths=tuple(msg.hidden_paths),
        protected_paths=tuple(msg.protected_paths),
        tmp_dir=msg.tmp_dir or None,
    )


def execution_to_pb(execution: Execution) -> pb.Execution:
    if execution.kind == "permissions":
        return pb.Execution(permissions=permissions_to_pb(execution.permissions or Permissions()))
    if execution.kind == "session_default":
        return pb.Execution(session_default=pb.SessionDefault())
    return pb.Execution(unsandboxed=pb.Unsandboxed())


def execution_from_pb(msg: pb.Execution) -> Execution:
    """Decode an execution.

    Raises:
        CodecError: no kind is set, or the profile is invalid.
    """
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise CodecError("execution has no kind set (unsandboxed, session_default or permissions)")
    if kind == "permissions":
        return Execution("permissions", permissions_from_pb(msg.permissions))
    return Execution(kind)  # type: ignore[arg-type]


def session_to_pb(session: SessionContext) -> pb.SessionContext:
    msg = pb.SessionContext(session_id=session.session_id, labels=dict(session.labels))
    if session.sandbox is not None:
        msg.sandbox.CopyFrom(permissions_to_pb(session.sandbox))
    return msg


def session_from_pb(msg: pb.SessionContext) -> SessionContext:
    """Decode a session context.

    Raises:
        CodecError: the session id is empty or the sandbox profile is invalid.
    """
    if not msg.session_id:
        raise CodecError("session.session_id is empty")
    sandbox = permissions_from_pb(msg.sandbox) if msg.HasField("sandbox") else None
    return SessionContext(session_id=msg.session_id, labels=dict(msg.labels), sandbox=sandbox)


def target_to_pb(program: str, argv: Sequence[str], workdir: str, facts: ExecFacts | None = None) -> pb.ExecTarget:
    """Encode an exec target; ``facts`` (None: none sent) fill ``identity`` (field 20) and
    ``file``, ``children_unseen``, ``file_problem`` (30-32), each left unset where unknown."""
    msg = pb.ExecTarget(program=wire_text(program), argv=[wire_text(a) for a in argv], workdir=wire_text(workdir))
    if facts is not None:
        if facts.identity is not None:
            msg.identity.CopyFrom(identity_to_pb(facts.identity))
        if facts.file is not None:
            msg.file.CopyFrom(file_to_pb(facts.file))
        if facts.children_unseen is not None:
            msg.children_unseen = facts.children_unseen
        msg.file_problem = wire_text(facts.problem or "")
    return msg


_FORMATS = {"elf": pb.FileInfo.FORMAT_ELF, "script": pb.FileInfo.FORMAT_SCRIPT, "other": pb.FileInfo.FORMAT_OTHER}
_LINKAGES = {"static": pb.FileInfo.LINKAGE_STATIC, "dynamic": pb.FileInfo.LINKAGE_DYNAMIC}


def file_to_pb(info: FileInfo, depth: int = 0) -> pb.FileInfo:
    """Encode a :class:`FileInfo` (a script's interpreter one level deep)."""
    msg = pb.FileInfo(
        format=_FORMATS[info.format], elf_class=info.elf_class or 0, linkage=_LINKAGES.get(info.linkage or "", 0),
        interpreter=wire_text(info.interpreter or ""), setuid=info.setuid, setgid=info.setgid,
        capabilities=info.capabilities, problem=info.problem or "",
    )
    if info.machine is not None:
        msg.machine = info.machine
    if info.interpreter_info is not None and depth == 0:
        msg.interpreter_info.CopyFrom(file_to_pb(info.interpreter_info, 1))
    return msg


def file_from_pb(msg: pb.FileInfo, depth: int = 0) -> FileInfo:
    """Decode a FileInfo (nesting past one interpreter level is ignored).

    Raises:
        CodecError: the format is unset or unknown, or the ELF class is not 0, 32 or 64.
    """
    formats = {v: k for k, v in _FORMATS.items()}
    if msg.format not in formats:
        raise CodecError(f"file.format {msg.format} is not ELF, SCRIPT or OTHER")
    if msg.elf_class not in (0, 32, 64):
        raise CodecError(f"file.elf_class {msg.elf_class} is not 32 or 64")
    linkages = {v: k for k, v in _LINKAGES.items()}
    interp = None
    if msg.HasField("interpreter_info") and depth == 0:
        interp = file_from_pb(msg.interpreter_info, 1)
    return FileInfo(
        format=formats[msg.format], elf_class=msg.elf_class or None,  # type: ignore[arg-type]
        machine=msg.machine if msg.HasField("machine") else None,
        linkage=linkages.get(msg.linkage),  # type: ignore[arg-type]
        interpreter=msg.interpreter or None, setuid=msg.setuid, setgid=msg.setgid,
        capabilities=msg.capabilities, problem=msg.problem or None, interpreter_info=interp,
    )


def facts_from_pb(msg: pb.ExecTarget) -> ExecFacts:
    """What an exec target carries of its file: identity (field 20) and file info (30-32);
    :data:`NO_FACTS` when it carries none.

    Raises:
        CodecError: ``identity`` or ``file`` is invalid (see :func:`identity_from_pb`,
            :func:`file_from_pb`).
    """
    identity = identity_from_pb(msg)
    if identity is None and not msg.HasField("file") and not msg.HasField("children_unseen") \
            and not msg.file_problem:
        return NO_FACTS
    info = file_from_pb(msg.file) if msg.HasField("file") else None
    unseen = msg.children_unseen if msg.HasField("children_unseen") else None
    return ExecFacts(info, unseen, msg.file_problem or None, identity)


def identity_to_pb(identity: FileIdentity) -> pb.FileIdentity:
    return pb.FileIdentity(
        source=identity.source, device=identity.device, inode=identity.inode, uid=identity.uid,
        mode=identity.mode, real_path=wire_text(identity.real_path), root_dir_chain=identity.root_dir_chain,
        caller_can_modify=identity.caller_can_modify, pseudo_fs=identity.pseudo_fs,
        same_for_server=identity.same_for_server,
    )


def identity_from_pb(msg: pb.ExecTarget) -> FileIdentity | None:
    """The target's identity (field 20), or None when the client sent none.

    Raises:
        CodecError: an unknown ``source``, or a ``real_path`` that is neither empty nor absolute.
    """
    if not msg.HasField("identity"):
        return None
    i = msg.identity
    if i.source not in ("fd", "path"):
        raise CodecError(f"identity.source {i.source!r} is neither 'fd' nor 'path'")
    if i.real_path and not os.path.isabs(i.real_path):
        raise CodecError(f"identity.real_path {i.real_path!r} is not an absolute path")
    return FileIdentity(
        source=i.source, device=i.device, inode=i.inode, uid=i.uid, mode=i.mode, real_path=i.real_path,
        root_dir_chain=i.root_dir_chain, caller_can_modify=i.caller_can_modify, pseudo_fs=i.pseudo_fs,
        same_for_server=i.same_for_server,
    )


def target_from_pb(msg: pb.ExecTarget) -> tuple[str, tuple[str, ...], str]:
    """Decode and check an exec target.

    Returns:
        ``(program, argv, workdir)``.

    Raises:
        CodecError: argv is empty, or program / workdir is not absolute.
    """
    if not msg.argv:
        raise CodecError("argv is empty (it must include argv[0])")
    if not os.path.isabs(msg.program):
        raise CodecError(f"program {msg.program!r} is not an absolute path")
    if not os.path.isabs(msg.workdir):
        raise CodecError(f"workdir {msg.workdir!r} is not an absolute path")
    return msg.program, tuple(msg.argv), msg.workdir


def decision_to_pb(decision: Decision) -> pb.Decision:
    msg = pb.Decision(
        rule_id=decision.rule_id, decision_id=decision.decision_id, reason=decision.reason or "",
        note=decision.note,
    )
    if decision.action == "run":
        msg.run.SetInParent()
    elif decision.action == "escalate":
        msg.escalate.execution.CopyFrom(execution_to_pb(decision.execution or Execution()))
    else:
        msg.deny.reason = decision.reason or ""
    return msg


def decision_from_pb(msg: pb.Decision) -> Decision:
    """Decode a decision.

    Raises:
        CodecError: no action is set, or an escalation carries no valid execution.
    """
    action = msg.WhichOneof("action")
    common = {"rule_id": msg.rule_id, "decision_id": msg.decision_id, "note": msg.note}
    if action == "run":
        return Decision.run(reason=msg.reason or None, **common)
    if action == "escalate":
        if not msg.escalate.HasField("execution"):
            raise CodecError("escalate decision carries no execution")
        return Decision.escalate(execution_from_pb(msg.escalate.execution), reason=msg.reason or None, **common)
    if action == "deny":
        return Decision.deny(msg.deny.reason or None, **common)
    raise CodecError("decision has no action set (run, escalate or deny)")


_SCOPES = {"program": pb.CacheHint.SCOPE_PROGRAM, "exact": pb.CacheHint.SCOPE_EXACT}
_SCOPE_NAMES = {v: k for k, v in _SCOPES.items()}


def cache_hint_to_pb(hint: CacheHint) -> pb.CacheHint:
    """Encode a cache hint (TTL in whole milliseconds, at least 1)."""
    return pb.CacheHint(scope=_SCOPES[hint.scope], ttl_ms=max(1, min(int(hint.ttl_s * 1000), 2**32 - 1)))


def cache_hint_from_pb(response: pb.DetermineActionResponse) -> CacheHint | None:
    """The cache hint of an answer, or None when it is absent, has no known scope or a zero TTL
    (then the decision is not cached)."""
    if not response.HasField("cache"):
        return None
    scope = _SCOPE_NAMES.get(response.cache.scope)
    if scope is None or response.cache.ttl_ms == 0:
        return None
    return CacheHint(scope=scope, ttl_s=response.cache.ttl_ms / 1000.0, fingerprint=response.rules_fingerprint)


def prepared_to_pb(prepared: PreparedExec) -> pb.PreparedExec:
    msg = pb.PreparedExec(command=list(prepared.command), cwd=prepared.cwd, env=dict(prepared.env))
    if prepared.arg0 is not None:
        msg.arg0 = prepared.arg0
    return msg


def prepared_from_pb(msg: pb.PreparedExec) -> PreparedExec:
    """Decode what to spawn.

    Raises:
        CodecError: the command is empty or its cwd is not absolute.
    """
    if not msg.command:
        raise CodecError("prepared command is empty")
    if not os.path.isabs(msg.cwd):
        raise CodecError(f"prepared cwd {msg.cwd!r} is not an absolute path")
    arg0 = msg.arg0 if msg.HasField("arg0") else None
    return PreparedExec(command=tuple(msg.command), cwd=msg.cwd, env=dict(msg.env), arg0=arg0)

