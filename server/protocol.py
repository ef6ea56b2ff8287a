"""Wire messages, environment variable names and limits of the local escalation protocol.

Source of the facts: OpenAI Codex's ``shell-escalation`` protocol (see docs/DESIGN.md §2 and the byte-exact
vectors in ``tests/data/protocol.json``). This module holds only data: no sockets, no fds. Framing
and ``SCM_RIGHTS`` live in :mod:`execgate.server.fdpass`.

Sequence of one intercepted exec::

    wrapper                                   server
      | -- datagram b"\\x00" + fd (SCM_RIGHTS) --> |   handshake on CODEX_ESCALATE_SOCKET
      | == frame EscalateRequest ===============> |   on the passed SOCK_STREAM
      | <============== frame EscalateResponse == |   Run | Escalate | Deny
      |  Run:  exec in place                      |
      |  Deny: "Execution denied: ..." exit 1     |
      | == frame SuperExecMessage + fds 0,1,2 ==> |   Escalate only
      | == frame {"signal": N} (0 or more) ======> |   execgate extension, see below
      | <================= frame SuperExecResult == |   when the escalated child ends

execgate extensions (Codex peers ignore unknown fields, so both are backward compatible):

* **Signal forwarding.** The server's Escalate response carries ``"execgate_signals": true``
  (:data:`SIGNALS_EXTENSION_FIELD`). A wrapper that sees it installs handlers for
  :data:`FORWARDED_SIGNALS` after sending the fds and forwards each caught signal as a frame
  ``{"signal": N}`` (:class:`SignalMessage`, N the Linux signal number) on the same stream. The server
  sends N to the escalated child's process group. A wrapper that does not know the field never sends
  such frames; a server that does not know them never advertises the field.
* **Fallback socket path.** Each session also listens on a ``SOCK_STREAM`` Unix socket whose path is
  exported as ``EXECGATE_SOCKET_PATH`` (:data:`SOCKET_PATH_ENV_VAR`); its directory is private
  (mode 0700) and the socket mode 0600. A wrapper whose ``CODEX_ESCALATE_SOCKET`` fd is missing or
  is not an ``AF_UNIX SOCK_DGRAM`` socket (e.g. a CPython ``subprocess`` child whose parent used
  ``close_fds=True``) connects there instead. The server checks the peer's uid (``SO_PEERCRED``,
  see unix(7)): it must equal the server's uid or be root. An accepted connection is then treated
  exactly like the stream end received in a handshake: the Request frame comes next::

    wrapper                                   server (fallback listener)
      | -- connect(EXECGATE_SOCKET_PATH) -------> |   SO_PEERCRED uid check
      | == frame EscalateRequest ===============> |   ... then as above

Bytes that are not UTF-8 (execgate extension of the encoding, same in both wrappers): argv, env
and paths are byte strings on Linux, JSON strings are Unicode. A wrapper decodes each byte string
as UTF-8 with Python's ``surrogateescape`` handler (PEP 383): every byte that is not part of a
valid UTF-8 sequence (RFC 3629: no overlongs, no encoded surrogates, nothing above U+10FFFF)
becomes the lone surrogate U+DC80..U+DCFF, which the encoder writes as the JSON escape
``\\udcXX`` (lower-case hex; see :func:`wire_str`, :func:`_dumps`). The frame stays valid UTF-8;
a strict peer (Codex's serde) rejects such a request and the exec fails closed. The server turns
the strings back into the exact bytes with :func:`wire_bytes` (``os.fsencode`` under a UTF-8
locale): the policy sees ``program``/``argv``/``workdir``/``env`` as these ``str`` values
(``wire_bytes(s)`` is the byte string the caller used), and an escalated command is spawned with
the bytes themselves. :meth:`EscalateRequest.from_obj` refuses any other lone surrogate and
canonicalises escapes of bytes that do form valid UTF-8 (``"\\udcc3\\udca9"`` becomes ``"é"``),
so a policy rule on a name cannot be dodged by spelling the same bytes differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: Decimal fd number of the client end of the per-session SOCK_DGRAM socketpair (Codex name).
ESCALATE_SOCKET_ENV_VAR = "CODEX_ESCALATE_SOCKET"
#: Absolute path of the execve wrapper; patched shells run ``WRAPPER FILE ARGV0 ARGV1 ...``.
EXEC_WRAPPER_ENV_VAR = "EXEC_WRAPPER"
#: The two variables of the session's env overlay, removed from ``EscalateRequest.env``.
OVERLAY_ENV_VARS = (ESCALATE_SOCKET_ENV_VAR, EXEC_WRAPPER_ENV_VAR)
#: Prefix of execgate's own environment variables.
EXECGATE_ENV_PREFIX = "EXECGATE_"
#: Path of the session's fallback SOCK_STREAM listener (execgate extension, see module doc).
SOCKET_PATH_ENV_VAR = "EXECGATE_SOCKET_PATH"
#: Variables a wrapper removes from the environment it sends in ``EscalateRequest.env``.
REQUEST_ENV_EXCLUDED = OVERLAY_ENV_VARS

#: Extra field of an Escalate response: the server accepts ``{"signal": N}`` frames.
SIGNALS_EXTENSION_FIELD = "execgate_signals"
#: Signals (by name) a wrapper forwards to the escalated child's process group.
FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")

#: Payload of the handshake datagram (ignored by the server).
HANDSHAKE_PAYLOAD = b"\x00"
#: Length prefix of a frame: 4 bytes, little-endian, unsigned.
LENGTH_PREFIX_BYTES = 4

#: Default limits enforced by the server (docs/DESIGN.md §2).
MAX_FRAME_BYTES = 1 << 20
MAX_FDS_PER_MESSAGE = 16
REQUEST_READ_TIMEOUT_S = 10.0
MAX_CONCURRENT_REQUESTS_PER_SESSION = 64

#: Exit status printed by wrappers for a Deny (docs/DESIGN.md §2 step 7).
DENY_EXIT_CODE = 1
DENY_MESSAGE_PREFIX = "Execution denied"


class ProtocolError(Exception):
    """Raised when a peer's frame or message breaks the escalation protocol."""


def wire_str(raw: bytes) -> str:
    """The JSON string for a byte string (argv item, env name or value, path): UTF-8, with every
    byte outside a valid sequence as the lone surrogate U+DC00+byte (see the module doc)."""
    return raw.decode("utf-8", "surrogateescape")


def wire_bytes(text: str) -> bytes:
    """Inverse of :func:`wire_str`: the exact bytes a request's string stands for.

    Raises:
        ProtocolError: ``text`` holds a lone surrogate outside U+DC80..U+DCFF.
    """
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"string holds a surrogate that stands for no byte: {exc}") from exc


def _canonical(text: str) -> str:
    # Fast path: almost every string is plain Unicode without surrogates.
    return text if text.isascii() else wire_str(wire_bytes(text))


def _dumps(obj: Any) -> bytes:
    # Compact separators and insertion order reproduce serde_json's output byte for byte. Lone
    # surrogates (non-UTF-8 bytes, see the module doc) cannot be encoded as UTF-8: backslashreplace
    # writes them as the JSON escape \udcXX, exactly as the native wrapper does.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")


def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise ProtocolError(what)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


@dataclass(frozen=True, slots=True)
class EscalateRequest:
    """Wrapper → server: the exec being attempted.

    Attributes:
        file: path the caller passed to exec; may be relative to ``workdir``.
        argv: full argv including argv[0].
        workdir: absolute working directory of the caller.
        env: the caller's environment minus :data:`OVERLAY_ENV_VARS`.
    """

    file: str
    argv: list[str]
    workdir: str
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return _dumps({"file": self.file, "argv": self.argv, "workdir": self.workdir, "env": self.env})

    @classmethod
    def from_obj(cls, obj: Any) -> EscalateRequest:
        """Build from decoded JSON; unknown fields are ignored. Raises ProtocolError on a wrong shape."""
        _expect(isinstance(obj, dict), "request is not a JSON object")
        file, argv, workdir, env = obj.get("file"), obj.get("argv"), obj.get("workdir"), obj.get("env")
        _expect(isinstance(file, str) and file != "", "request.file must be a non-empty string")
        _expect(_is_str_list(argv), "request.argv must be a list of strings")
        _expect(isinstance(workdir, str), "request.workdir must be a string")
        _expect(
            isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()),
            "request.env must be an object of strings",
        )
        return cls(
            file=_canonical(file),
            argv=[_canonical(a) for a in argv],
            workdir=_canonical(workdir),
            env={_canonical(k): _canonical(v) for k, v in env.items()},
        )


@dataclass(frozen=True, slots=True)
class EscalateResponse:
    """Server → wrapper: the decision.

    ``action`` is ``"Run"``, ``"Escalate"`` or ``"Deny"``; ``reason`` only for Deny (may be None).
    ``extensions`` are extra top-level fields execgate adds (Codex peers ignore them), e.g.
    ``{"execgate_signals": true}`` on Escalate to say that the wrapper may forward signals.
    """

    action: str
    reason: str | None = None
    extensions: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        if self.action == "Deny":
            obj: dict[str, Any] = {"action": {"Deny": {"reason": self.reason}}}
        else:
            obj = {"action": self.action}
        obj.update(self.extensions)
        return _dumps(obj)

    @classmethod
    def from_obj(cls, obj: Any) -> EscalateResponse:
        _expect(isinstance(obj, dict), "response is not a JSON object")
        action = obj.get("action")
        extensions = {k: v for k, v in obj.items() if k != "action"}
        if action in ("Run", "Escalate"):
            return cls(action=action, extensions=extensions)
        if isinstance(action, dict) and isinstance(action.get("Deny"), dict):
            reason = action["Deny"].get("reason")
            _expect(reason is None or isinstance(reason, str), "Deny.reason must be a string or null")
            return cls(action="Deny", reason=reason, extensions=extensions)
        raise ProtocolError(f"unknown action {action!r}")


@dataclass(frozen=True, slots=True)
class SuperExecMessage:
    """Wrapper → server after Escalate: destination fd numbers of the attached fds, in order."""

    fds: list[int]

    def to_json(self) -> bytes:
        return _dumps({"fds": self.fds})

    @classmethod
    def from_obj(cls, obj: Any) -> SuperExecMessage:
        _expect(isinstance(obj, dict), "super-exec message is not a JSON object")
        fds = obj.get("fds")
        _expect(
            isinstance(fds, list) and all(isinstance(f, int) and not isinstance(f, bool) and f >= 0 for f in fds),
            "fds must be a list of non-negative integers",
        )
        return cls(fds=list(fds))


@dataclass(frozen=True, slots=True)
class SuperExecResult:
    """Server → wrapper: the escalated command's exit status (128+S if killed by signal S)."""

    exit_code: int

    def to_json(self) -> bytes:
        return _dumps({"exit_code": self.exit_code})

    @classmethod
    def from_obj(cls, obj: Any) -> SuperExecResult:
        _expect(isinstance(obj, dict), "super-exec result is not a JSON object")
        code = obj.get("exit_code")
        _expect(isinstance(code, int) and not isinstance(code, bool), "exit_code must be an integer")
        return cls(exit_code=code)


@dataclass(frozen=True, slots=True)
class SignalMessage:
    """Wrapper → server after SuperExec (execgate extension): deliver signal ``signal`` (a Linux
    signal number, e.g. 2 for SIGINT) to the escalated child's process group."""

    signal: int

    def to_json(self) -> bytes:
        return _dumps({"signal": self.signal})

    @classmethod
    def from_obj(cls, obj: Any) -> SignalMessage:
        _expect(isinstance(obj, dict), "signal message is not a JSON object")
        num = obj.get("signal")
        _expect(isinstance(num, int) and not isinstance(num, bool) and 0 < num < 65, "signal must be 1..64")
        return cls(signal=num)


def decode_json(payload: bytes) -> Any:
    """Decode a frame's UTF-8 JSON payload (any JSON value; the caller checks its shape).

    Raises:
        ProtocolError: bad UTF-8, bad JSON, a number too long to convert (``ValueError``), or
            nesting deeper than the interpreter's recursion limit (``RecursionError``): a hostile
            peer must not get a traceback out of either side.
    """
    try:
        return json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ProtocolError(f"frame is not UTF-8 JSON: {exc}") from exc


def deny_message(reason: str | None) -> str:
    """The line a wrapper prints on stderr for a Deny (docs/DESIGN.md §2 step 7)."""
    return f"{DENY_MESSAGE_PREFIX}: {reason}" if reason else DENY_MESSAGE_PREFIX
