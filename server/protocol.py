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
* **Target fd.** An execgate wrapper opens the target itself (``open(file, O_PATH|O_CLOEXEC)``,
  following symlinks, in its own view) and attaches that fd to the request frame's first byte,
  marking the request with ``"execgate_target_fd": true`` (:data:`TARGET_FD_EXTENSION_FIELD`,
  after ``env``). The server identifies that very file (:mod:`execgate.server.identity`) and the
  policy judges it; on Run the wrapper executes the same fd (``execveat(fd, "", argv, envp,
  AT_EMPTY_PATH)``, execveat(2)), so a decision is about the file that runs. A ``#!`` script is
  executed by its path instead, after checking that the path still names the fd's file: the
  kernel hands an interpreter ``/dev/fd/N``, which a close-on-exec fd no longer is (execveat(2),
  ENOENT). A target that cannot be opened is sent without fd (the exec fails as it would have).
  A request carrying the field without exactly one fd, or an fd without the field, breaks the
  protocol. Codex peers never set it; a Codex server ignores the field (and the fd).
* **Cached-only query.** The preload shim asks before it execs anything itself: a request with
  ``"execgate_cached_only": true`` (:data:`CACHED_ONLY_EXTENSION_FIELD`, after the target-fd
  field; ``env`` is sent empty) is answered only with a Run the policy gives without asking
  anyone (docs/DESIGN.md §9) — a cached Run covering this very file (a gRPC policy's decision
  cache), or the rules' own Run (the in-process embedded service) — audited as any such answer:
  ``{"action":"Run"}``; else ``{"action":"Undecided"}`` (:data:`UNDECIDED_ACTION`) with nothing
  decided, prompted or audited. On Run the shim executes the target fd in the calling process
  (no second exec of the wrapper); on anything else it closes the stream and execs the wrapper,
  which asks again with a full request. Only execgate's shim sends the field; the Python and
  native wrappers never do. For a ``posix_spawn`` the shim adds
  ``"execgate_cached_for_child": true`` (:data:`CACHED_FOR_CHILD_EXTENSION_FIELD`): the exec
  will be made by the child it spawns (by path), and the seccomp backstop lets one exec of that
  file and argv by a child of the caller through undecided.
* **Query by exec.** Where the session has the seccomp backstop and its policy answers queries,
  the overlay holds ``EXECGATE_BACKSTOP_QUERY=<token>`` (:data:`BACKSTOP_QUERY_ENV_VAR`) and the
  shim asks without a socket: it opens the file (``O_PATH``) and makes the exec itself, by the
  raw ``execveat(fd, "", argv, envp, AT_EMPTY_PATH)`` system call — no path for the kernel to
  look up again after the backstop's answer, in any thread's fd table or any ``/proc`` — whose
  unused 6th argument points at three words of the caller's size: :data:`QUERY_EXEC_MARK`, the
  token, and the address of the name it was asked to run (the kernel ignores the argument;
  seccomp's notification carries it). The backstop, which stops every exec of the session
  anyway, answers such an exec as the cached-only query above — the name as the request's
  ``file``, the open file as its target fd: a Run the policy gives without asking anyone lets it
  continue (audited as any such Run); anything else fails it with :data:`QUERY_UNDECIDED_ERRNO`,
  nothing decided, prompted or audited, and the shim execs the wrapper, which asks with a full
  request. So is a mark with another token. A process that forges the mark gains nothing: it
  gets a Run only where the policy gives one to that file and argv. A ``#!`` script keeps the
  socket query (its interpreter would be handed ``/dev/fd/N`` of a descriptor closed at the
  exec). The variable is forced by the shim's chain of trust like the socket's
  (wrapper/native/preload.c), so a session's processes use the query by exec only where their
  own session's backstop stops their execs.
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

import errno
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

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

#: Extra field of a request (execgate extension): ``true`` when exactly one fd rides on the
#: request frame's first byte, the target the wrapper opened (``O_PATH``) and will execute.
TARGET_FD_EXTENSION_FIELD = "execgate_target_fd"
#: execgate extension: the shim's query, answered only with a Run given without a prompt (module doc).
CACHED_ONLY_EXTENSION_FIELD = "execgate_cached_only"
#: execgate extension, with the cached-only field: the Run is for an exec by the caller's child
#: (the shim's ``posix_spawn``), not by the caller itself (module doc).
CACHED_FOR_CHILD_EXTENSION_FIELD = "execgate_cached_for_child"
#: The action of the answer to a cached-only request that the policy does not answer Run.
UNDECIDED_ACTION = "Undecided"
#: Set to "1" in a session's env overlay when its policy answers queries (``answers_queries``: a
#: decision cache, or the in-process embedded service): the preload shim then sends a
#: cached-only query before it falls back to the wrapper (module doc).
CACHED_QUERY_ENV_VAR = "EXECGATE_CACHED_QUERY"
#: Set in a session's env overlay when its seccomp backstop answers queries by exec (module doc):
#: the backstop's token, decimal, 1 .. 2**31 - 1.
BACKSTOP_QUERY_ENV_VAR = "EXECGATE_BACKSTOP_QUERY"
#: A query by exec: ``execveat(fd, "", argv, envp, AT_EMPTY_PATH)`` made by the raw system call,
#: its otherwise unused 6th argument the address of three words of the caller's size: this
#: value, the backstop's token, the address of the name the caller gave the file (module doc).
QUERY_EXEC_MARK = 0x45584547  # "GEXE" little-endian
#: The errno of a query by exec that the policy does not answer Run: the shim then execs the
#: wrapper (module doc). execve(2) never fails with it for a reason of its own.
QUERY_UNDECIDED_ERRNO = errno.EOPNOTSUPP
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
#: Decisions a session works on at once; further connections wait (queued, never refused)...
MAX_CONCURRENT_REQUESTS_PER_SESSION = 64
#: ... until a session holds this many connections (waiting, deciding or supervising an escalated
#: command; one file descriptor each): past it an exec is denied, with a reason saying so.
MAX_CONNECTIONS_PER_SESSION = 4096

# Input bounds (docs/DESIGN.md §2 "Input bounds"): checked before any work is done on a request,
# by the escalation server (:func:`exec_bounds_violation`, a Deny naming the bound) and by the
# policy service (its EscalationPolicy servicer answers INVALID_ARGUMENT). Sizes are bytes: of
# the bytes a wire string stands for (:func:`wire_bytes`) here, of UTF-8 text in gRPC messages.
#: PATH_MAX (linux/limits.h): the kernel refuses longer paths with ENAMETOOLONG (path_resolution(7)).
MAX_PATH_BYTES = 4096
#: Most argv items, and their total size. A frame (1 MiB) bounds the total already; the service
#: gets argv over gRPC, where only the 4 MiB message limit would.
MAX_ARGV_ITEMS = 1 << 16
MAX_ARGV_BYTES = MAX_FRAME_BYTES
#: Most environment variables, and their total size (names and values).
MAX_ENV_ITEMS = 1 << 14
MAX_ENV_BYTES = MAX_FRAME_BYTES
#: A session id, and a session's labels (count; bytes of each key plus value).
MAX_SESSION_ID_BYTES = 256
MAX_LABELS = 64
MAX_LABEL_BYTES = 1024
#: Most roots (writable plus readable) in a sandbox profile; each is a path (MAX_PATH_BYTES).
MAX_SANDBOX_ROOTS = 256
#: gRPC strings carry each non-UTF-8 byte as the 4 characters ``\xNN`` (``policy_codec.wire_text``),
#: so the policy service allows byte sizes this many times the bounds above.
GRPC_TEXT_EXPANSION = 4
#: Largest gRPC message either side of the policy hop accepts (gRPC's default is 4 MiB): a
#: DetermineAction may carry argv and env at their bounds times the text expansion (~8 MiB), a
#: cached decision argv at its bound (~4 MiB); both must fit, or a request would be refused and
#: a cache hit could not reach the audit log.
GRPC_MAX_MESSAGE_BYTES = 16 << 20
#: Most bytes (estimated) of cached decisions sent in one RecordCachedDecisions call.
CACHED_AUDIT_BATCH_BYTES = 4 << 20

#: Exit status printed by wrappers for a Deny (docs/DESIGN.md §2 step 7).
DENY_EXIT_CODE = 1
DENY_MESSAGE_PREFIX = "Execution denied"


class ProtocolError(Exception):
    """Raised when a peer's frame or message breaks the escalation protocol."""


class BoundsError(ProtocolError):
    """Raised when a well-formed request exceeds an input bound (the message names it); the
    server answers it with a Deny carrying that message rather than just closing the stream."""


def _nbytes(text: str) -> int:
    """Bytes ``text`` stands for: UTF-8, each lone surrogate U+DC80..U+DCFF one byte (module doc)."""
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # another lone surrogate: refused later; count it as UTF-8 would
        return len(text.encode("utf-8", "surrogatepass"))


def _over(text: str, limit: int) -> int | None:
    """Size of ``text`` in bytes if above ``limit``, else None. O(limit) for any longer text:
    a character is at least one byte, so a long string is refused before it is encoded."""
    if len(text) > limit:
        return len(text)
    size = _nbytes(text)
    return size if size > limit else None


def path_bounds_violation(paths: Mapping[str, str], *, scale: int = 1) -> str | None:
    """The first of ``paths`` (what → path) longer than :data:`MAX_PATH_BYTES` × ``scale``, as a
    message naming it; None if all are within."""
    for what, path in paths.items():
        size = _over(path, MAX_PATH_BYTES * scale)
        if size is not None:
            return f"{what} is at least {size} bytes, longer than PATH_MAX ({MAX_PATH_BYTES * scale} bytes)"
    return None


def strings_bounds_violation(
    what: str, items: Sequence[str] | Mapping[str, str], max_items: int, max_bytes: int
) -> str | None:
    """Message if the strings ``items`` (a list, or a dict whose keys and values count) number more
    than ``max_items`` or total more than ``max_bytes``; None if within. Stops at the first excess."""
    if len(items) > max_items:
        return f"{what} has {len(items)} items, more than the bound of {max_items}"
    strings = (s for kv in items.items() for s in kv) if isinstance(items, Mapping) else iter(items)
    total = 0
    for text in strings:
        total += _nbytes(text) if len(text) <= max_bytes else len(text)
        if total > max_bytes:
            return f"{what} totals more than the bound of {max_bytes} bytes"
    return None


def exec_bounds_violation(
    paths: Mapping[str, str], argv: Sequence[str], env: Mapping[str, str] | None = None, *, scale: int = 1
) -> str | None:
    """The first input bound an exec breaks, as a message; None if within all of them.

    Args:
        paths: what → path (e.g. ``{"request.file": ..., "request.workdir": ...}``).
        argv: list of strings. env: dict of strings, or None when there is none to check.
        scale: multiplier of the byte bounds (:data:`GRPC_TEXT_EXPANSION` for gRPC text).
    """
    return (
        path_bounds_violation(paths, scale=scale)
        or strings_bounds_violation("argv", argv, MAX_ARGV_ITEMS, MAX_ARGV_BYTES * scale)
        or (None if env is None else strings_bounds_violation("env", env, MAX_ENV_ITEMS, MAX_ENV_BYTES * scale))
    )


def session_bounds_violation(
    session_id: str, labels: Mapping[str, str], roots: Sequence[str] = (), *, scale: int = 1
) -> str | None:
    """The first input bound a session context breaks (id, labels dict, sandbox roots list), as a
    message; None if within all of them."""
    if _over(session_id, MAX_SESSION_ID_BYTES * scale) is not None:
        return f"session id is longer than {MAX_SESSION_ID_BYTES * scale} bytes"
    if len(labels) > MAX_LABELS:
        return f"session has {len(labels)} labels, more than the bound of {MAX_LABELS}"
    for key, value in labels.items():
        if len(key) + len(value) > MAX_LABEL_BYTES * scale or _nbytes(key) + _nbytes(value) > MAX_LABEL_BYTES * scale:
            return f"label {key[:64]!r} is longer than {MAX_LABEL_BYTES * scale} bytes (key and value)"
    if len(roots) > MAX_SANDBOX_ROOTS:
        return f"sandbox has {len(roots)} roots, more than the bound of {MAX_SANDBOX_ROOTS}"
    return path_bounds_violation({f"sandbox root {i}": r for i, r in enumerate(roots)}, scale=scale)


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


_STR_TYPE = frozenset({str})


def _ascii_strings_violation(what: str, items: list[str] | dict[str, str], max_items: int,
                             max_bytes: int) -> str | None:
    """:func:`strings_bounds_violation` for strings known to be ASCII (a byte per character):
    the same bounds and messages, summed in C."""
    if len(items) > max_items:
        return f"{what} has {len(items)} items, more than the bound of {max_items}"
    total = sum(map(len, items)) + (sum(map(len, items.values())) if isinstance(items, dict) else 0)
    return f"{what} totals more than the bound of {max_bytes} bytes" if total > max_bytes else None


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
        target_fd: True when the target's fd rides on the frame (execgate extension, see the
            module doc); the field is written only then, so Codex frames stay byte-exact.
        cached_only: True for the shim's cached-only query (execgate extension, module doc).
        cached_for_child: with ``cached_only``, the exec will be made by the caller's child.
    """

    file: str
    argv: list[str]
    workdir: str
    env: dict[str, str] = field(default_factory=dict)
    target_fd: bool = False
    cached_only: bool = False
    cached_for_child: bool = False

    def to_json(self) -> bytes:
        obj: dict[str, Any] = {"file": self.file, "argv": self.argv, "workdir": self.workdir, "env": self.env}
        if self.target_fd:
            obj[TARGET_FD_EXTENSION_FIELD] = True
        if self.cached_only:
            obj[CACHED_ONLY_EXTENSION_FIELD] = True
            if self.cached_for_child:
                obj[CACHED_FOR_CHILD_EXTENSION_FIELD] = True
        return _dumps(obj)

    @classmethod
    def from_payload(cls, payload: bytes) -> EscalateRequest:
        """Decode a request frame's payload (:func:`decode_json`, then :meth:`from_obj`).

        The server's path for every exec: when the payload is ASCII and holds no ``\\u`` escape,
        every string in it is ASCII (JSON's other escapes are ASCII), so none needs
        canonicalising and each string's size in bytes is its length: the bounds of argv and of
        the caller's whole environment are then checked with C-level sums instead of a Python
        loop over every name and value, and the strings are kept as decoded. Same checks, same
        answers, same errors as :meth:`from_obj` on the decoded object.

        Raises:
            BoundsError, ProtocolError: as :meth:`from_obj` and :func:`decode_json`.
        """
        return cls.from_obj(decode_json(payload), ascii_only=payload.isascii() and b"\\u" not in payload)

    @classmethod
    def from_obj(cls, obj: Any, *, ascii_only: bool = False) -> EscalateRequest:
        """Build from decoded JSON; unknown fields are ignored.

        Args:
            ascii_only: the caller knows that every string in ``obj`` is ASCII and exactly a
                ``str`` (:meth:`from_payload`): no canonicalising, sizes are lengths.

        Raises:
            BoundsError: a path, argv or env exceeds its bound (``MAX_*`` above).
            ProtocolError: a wrong shape.
        """
        _expect(isinstance(obj, dict), "request is not a JSON object")
        file, argv, workdir, env = obj.get("file"), obj.get("argv"), obj.get("workdir"), obj.get("env")
        _expect(isinstance(file, str) and file != "", "request.file must be a non-empty string")
        _expect(_is_str_list(argv), "request.argv must be a list of strings")
        _expect(isinstance(workdir, str), "request.workdir must be a string")
        if ascii_only:  # JSON object keys are always str; the values' types in one C-level pass
            _expect(isinstance(env, dict) and set(map(type, env.values())) <= _STR_TYPE,
                    "request.env must be an object of strings")
            # Before any work on the strings (issue #9, below): ASCII, so bytes are lengths.
            violation = (path_bounds_violation({"request.file": file, "request.workdir": workdir})
                         or _ascii_strings_violation("argv", argv, MAX_ARGV_ITEMS, MAX_ARGV_BYTES)
                         or _ascii_strings_violation("env", env, MAX_ENV_ITEMS, MAX_ENV_BYTES))
            if violation is not None:
                raise BoundsError(violation)
        else:
            _expect(
                isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()),
                "request.env must be an object of strings",
            )
            # Before any work on the strings: a request of 500,000 path components once kept the
            # policy service in realpath for minutes (issue #9).
            violation = exec_bounds_violation({"request.file": file, "request.workdir": workdir}, argv, env)
            if violation is not None:
                raise BoundsError(violation)
            file, argv, workdir = _canonical(file), [_canonical(a) for a in argv], _canonical(workdir)
            env = {_canonical(k): _canonical(v) for k, v in env.items()}
        return cls(
            file=file,
            argv=argv,
            workdir=workdir,
            env=env,
            target_fd=obj.get(TARGET_FD_EXTENSION_FIELD) is True,
            cached_only=obj.get(CACHED_ONLY_EXTENSION_FIELD) is True,
            cached_for_child=obj.get(CACHED_ONLY_EXTENSION_FIELD) is True
            and obj.get(CACHED_FOR_CHILD_EXTENSION_FIELD) is True,
        )


@dataclass(frozen=True, slots=True)
class EscalateResponse:
    """Server → wrapper: the decision.

    ``action`` is ``"Run"``, ``"Escalate"`` or ``"Deny"`` (or, only to a cached-only request,
    :data:`UNDECIDED_ACTION`); ``reason`` only for Deny (may be None).
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
        if action in ("Run", "Escalate", UNDECIDED_ACTION):
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
