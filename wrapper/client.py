"""The Python reference execve wrapper: ``execgate-wrapper FILE [ARGV0 ARGS...]``.

A shell honouring ``EXEC_WRAPPER`` (or the preload shim) runs this instead of ``execve(FILE, ARGV)``.
It asks the session's escalation server what to do (docs/DESIGN.md §2; sequence diagram in
:mod:`execgate.server.protocol`) and then:

* **Run** — executes the very file the server judged: ``FILE`` is opened ``O_PATH`` before the
  request and sent with it (execgate extension ``execgate_target_fd``), then executed with
  ``execveat(fd, "", ARGV, environ, AT_EMPTY_PATH)`` (a ``#!`` script by its path, if that still
  names the same file: see :func:`run_in_place`); the inherited ``CODEX_ESCALATE_SOCKET`` fd
  stays open and inheritable so that the program's own children are gated too.
* **Escalate** — sends duplicates of its stdin/stdout/stderr, forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT
  if the server advertises ``execgate_signals``, and exits with the escalated command's status.
* **Deny** — prints ``Execution denied: <reason>`` on stderr and exits 1.

Any failure prints one line prefixed ``execgate-wrapper:`` on stderr and exits non-zero (2 usage,
126 server/protocol failure or non-executable file, 127 file not found); it never runs the program
unchecked. It runs once per exec, so it imports only light stdlib modules, the protocol and fdpass.

Trust: ``CODEX_ESCALATE_SOCKET``, ``EXECGATE_SOCKET_ID`` and ``EXECGATE_SOCKET_PATH`` say which
server to ask. Under the preload shim they are always the values the shim captured when its
process was loaded (it overwrites whatever the caller set), so a caller cannot point the wrapper
at a server of its own; see ``wrapper/native/README.md`` ("What the wrapper trusts").

As the native wrapper does: ``FILE`` alone means the caller exec'd with an empty argv (sent as
``"argv": []`` and kept empty on Run); argv, env and the working directory are taken as the raw
bytes the caller passed (``os.fsencode``, ``os.environb``, ``os.getcwdb``), sent with non-UTF-8
bytes as ``\\udcXX`` escapes (module doc of :mod:`execgate.server.protocol`) and exec'd unchanged.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
from typing import NoReturn, Sequence

from execgate.server import protocol as p
from execgate.server.fdpass import (
    close_fds,
    recv_frame_blocking,
    send_datagram_blocking,
    send_frame_blocking,
)

EXIT_USAGE = 2
EXIT_FAILURE = 126
EXIT_NOT_FOUND = 127
_PREFIX = "execgate-wrapper: "


class WrapperError(Exception):
    """Raised when the wrapper cannot complete the protocol; carries the exit status to use."""

    def __init__(self, message: str, status: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.status = status


_SOCKET_ID_ENV_VAR = "EXECGATE_SOCKET_ID"


def _is_session_socket(fd: int, st: os.stat_result, env: dict[str, str]) -> bool:
    """False when ``EXECGATE_SOCKET_ID`` (``"<fd>:<inode>"``, set by the preload shim) names this fd
    with another inode: the program closed the session's socket and reused the number for a
    datagram socket of its own (syslog, or a fake server), which must never get a handshake."""
    fd_part, colon, ino_part = env.get(_SOCKET_ID_ENV_VAR, "").partition(":")
    if not colon or not fd_part.isdigit() or int(fd_part) != fd:
        return True  # no id for this fd: the type checks decide (as the native wrapper does)
    return ino_part.isdigit() and int(ino_part) == st.st_ino


def _inherited_dgram_socket(env: dict[str, str]) -> socket.socket | None:
    """The ``CODEX_ESCALATE_SOCKET`` fd as a socket, if it names an AF_UNIX SOCK_DGRAM socket that
    ``EXECGATE_SOCKET_ID`` does not disown. The returned socket must be ``detach()``-ed, never
    closed (the fd is shared with descendants)."""
    try:
        fd = int(env.get(p.ESCALATE_SOCKET_ENV_VAR, ""))
        st = os.fstat(fd) if fd >= 0 else None
        if st is None or not stat.S_ISSOCK(st.st_mode) or not _is_session_socket(fd, st, env):
            return None
        sock = socket.socket(fileno=fd)
    except (ValueError, OSError):
        return None
    if sock.family == socket.AF_UNIX and sock.type == socket.SOCK_DGRAM:
        return sock
    sock.detach()
    return None


def connect(env: dict[str, str]) -> socket.socket:
    """Open the per-exec stream to the server: handshake on the inherited datagram socket, or
    connect to ``EXECGATE_SOCKET_PATH`` when that fd is missing, not a datagram socket, or refused.

    Returns:
        a blocking, close-on-exec ``AF_UNIX SOCK_STREAM`` socket, owned by the caller.

    Raises:
        WrapperError: neither way reaches the server.
    """
    dgram = _inherited_dgram_socket(env)
    problem = f"{p.ESCALATE_SOCKET_ENV_VAR} is not set to a datagram socket fd"
    if dgram is not None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            send_datagram_blocking(dgram, p.HANDSHAKE_PAYLOAD, [theirs.fileno()])
            return ours
        except OSError as exc:
            ours.close()
            problem = f"handshake failed: {exc.strerror or exc}"
        finally:
            theirs.close()
            dgram.detach()
    path = env.get(p.SOCKET_PATH_ENV_VAR)
    if not path:
        raise WrapperError(f"cannot reach the escalation server: {problem}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise WrapperError(f"cannot reach the escalation server: {problem}; {path}: {exc.strerror or exc}") from exc
    return sock


def open_target(file: bytes) -> int | None:
    """The exec's target opened ``O_PATH | O_CLOEXEC`` (openat(2)) in our own view, symlinks
    followed as execve would; None if it cannot be opened (the exec will fail with execve's own
    error). The fd is owned by the caller: it rides on the request and Run executes it."""
    try:
        return os.open(file, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None


def request_decision(sock: socket.socket, file: str, argv: Sequence[str], env: dict[str, str],
                     target: int | None = None) -> p.EscalateResponse:
    """Send the request and read the response. ``file``, ``argv`` and ``env`` are in wire form
    (:func:`protocol.wire_str` of the caller's bytes); ``target`` (borrowed, may be None) rides on
    the request frame, marked ``execgate_target_fd`` (execgate extension, docs/DESIGN.md §2).

    Raises:
        WrapperError: the working directory is unknown, the stream broke, or the answer is malformed.
    """
    try:
        workdir = p.wire_str(os.getcwdb())
    except OSError as exc:
        raise WrapperError(f"cannot determine the working directory: {exc.strerror}") from exc
    request_env = {k: v for k, v in env.items() if k not in p.OVERLAY_ENV_VARS}
    request = p.EscalateRequest(file=file, argv=list(argv), workdir=workdir, env=request_env,
                                target_fd=target is not None)
    try:
        send_frame_blocking(sock, request.to_json(), [] if target is None else [target])
        payload, _ = recv_frame_blocking(sock, max_fds=0)
        return p.EscalateResponse.from_obj(p.decode_json(payload))
    except (OSError, p.ProtocolError) as exc:
        raise WrapperError(f"no valid answer from the escalation server: {exc}") from exc


def run_in_place(file: bytes, argv: Sequence[bytes], env: dict[bytes, bytes], target: int | None = None) -> NoReturn:
    """Execute the very file the server judged (the caller's exact argv and env), keeping the
    inherited handshake socket open across it.

    ``target`` (the ``O_PATH`` fd sent with the request, close-on-exec) is executed with
    ``execveat(target, "", argv, envp, AT_EMPTY_PATH)`` (execveat(2)); a ``#!`` script by its path
    instead, if that still names the target's file: the kernel would hand its interpreter
    ``/dev/fd/N``, which a close-on-exec fd no longer is (execveat(2), ENOENT). Without a target
    (it could not be opened), execve by path reports the error.

    Raises:
        WrapperError: the exec failed (status 127 if the file does not exist, else 126), or the
            script's path names another file now.
    """
    try:
        os.set_inheritable(int(env.get(os.fsencode(p.ESCALATE_SOCKET_ENV_VAR), b"")), True)
    except (ValueError, OSError):
        pass
    # CPython ignores SIGPIPE and SIGXFSZ at startup and execve keeps ignored dispositions: give
    # the program the defaults it would have had without us (as subprocess's restore_signals does).
    for name in ("SIGPIPE", "SIGXFSZ"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        if target is not None:
            if not _is_script(target):
                try:
                    _execveat(target, argv, env)
                except FileNotFoundError:
                    pass  # a script we could not read here: by path, as below
            _check_same(file, target)
        if argv and argv[0]:
            os.execve(file, list(argv), env)
        _libc_execve(file, argv, env)
    except OSError as exc:
        status = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_FAILURE
        raise WrapperError(f"cannot execute {p.wire_str(file)}: {exc.strerror}", status) from exc


def _is_script(fd: int) -> bool:
    """True if open file ``fd`` is a regular file starting with ``#!``, read through a new open of
    ``/proc/self/fd/N`` (proc(5); an ``O_PATH`` fd cannot be read). False if it cannot be read."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        readable = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.pread(readable, 2, 0) == b"#!"
    finally:
        os.close(readable)


def _check_same(file: bytes, fd: int) -> None:
    """Raises WrapperError unless path ``file`` names the file open on ``fd`` (device, inode)."""
    try:
        a, b = os.fstat(fd), os.stat(file)
    except OSError as exc:
        raise WrapperError(f"cannot execute {p.wire_str(file)}: {exc.strerror}") from exc
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        raise WrapperError(f"cannot execute {p.wire_str(file)}: it names another file now than the one approved")


def _execveat(fd: int, argv: Sequence[bytes], env: dict[bytes, bytes]) -> NoReturn:
    """``execveat(fd, "", argv, envp, AT_EMPTY_PATH)`` by the raw system call (execveat(2)), for
    any argv (empty included). ctypes is imported only here.

    Raises:
        OSError: the exec failed (the subclass for its errno).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    c_argv = (ctypes.c_char_p * (len(argv) + 1))(*argv, None)
    entries = [k + b"=" + v for k, v in env.items()]
    c_env = (ctypes.c_char_p * (len(entries) + 1))(*entries, None)
    libc.syscall(ctypes.c_long(_SYS_EXECVEAT), ctypes.c_int(fd), b"", c_argv, c_env, ctypes.c_int(_AT_EMPTY_PATH))
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err))


_SYS_EXECVEAT = 322  # x86_64 (asm/unistd_64.h)
_AT_EMPTY_PATH = 0x1000  # linux/fcntl.h


def _libc_execve(file: bytes, argv: Sequence[bytes], env: dict[bytes, bytes]) -> NoReturn:
    """execve(2) through libc for what ``os.execve`` refuses (ValueError): an empty argv or an
    empty argv[0], both legal for the kernel and passed on unchanged by the native wrapper.
    ctypes is imported here only, as such execs are rare and the wrapper runs once per exec.

    Raises:
        OSError: execve failed (the subclass for its errno, e.g. FileNotFoundError).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    c_argv = (ctypes.c_char_p * (len(argv) + 1))(*argv, None)
    entries = [k + b"=" + v for k, v in env.items()]
    c_env = (ctypes.c_char_p * (len(entries) + 1))(*entries, None)
    libc.execve(file, c_argv, c_env)
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err), p.wire_str(file))


def _dup_stdio() -> list[int]:
    fds = []
    try:
        for fd in (0, 1, 2):
            try:
                fds.append(os.dup(fd))
            except OSError:  # a closed std fd: the child gets /dev/null there
                fds.append(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
    except BaseException:
        close_fds(fds)
        raise
    return fds


def escalate(sock: socket.socket, forward_signals: bool) -> int:
    """Hand our stdio to the server, forward signals if advertised, and return the exit status.

    Raises:
        WrapperError: the stream broke or the result is malformed.
    """
    signums = [getattr(signal, n) for n in p.FORWARDED_SIGNALS] if forward_signals else []
    # Block forwarded signals until the fds frame is out, so a signal frame never precedes it;
    # signals that were ignored on entry stay ignored (POSIX convention for background jobs).
    signums = [s for s in signums if signal.getsignal(s) != signal.SIG_IGN]
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    fds = _dup_stdio()
    try:
        for signum in signums:
            signal.signal(signum, lambda num, _frame: _forward(sock, num))
        send_frame_blocking(sock, p.SuperExecMessage(fds=[0, 1, 2]).to_json(), fds)
    except (OSError, p.ProtocolError) as exc:
        raise WrapperError(f"cannot pass stdio to the escalation server: {exc}") from exc
    finally:
        close_fds(fds)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        payload, _ = recv_frame_blocking(sock, max_fds=0)
        return p.SuperExecResult.from_obj(p.decode_json(payload)).exit_code
    except (OSError, p.ProtocolError) as exc:
        raise WrapperError(f"no exit status from the escalation server: {exc}") from exc


def _forward(sock: socket.socket, signum: int) -> None:
    try:
        send_frame_blocking(sock, p.SignalMessage(signal=signum).to_json())
    except OSError:
        pass  # the server is gone; the recv in progress will report it


def main(argv: Sequence[str | bytes] | None = None) -> int:
    """Entry point: ``execgate-wrapper FILE [ARGV0 ARGS...]``; returns the exit status (or execs).

    ``FILE`` alone is an exec with an empty argv. ``str`` arguments stand for ``os.fsencode`` of them.
    """
    args = [os.fsencode(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not args:
        sys.stderr.write(f"{_PREFIX}usage: execgate-wrapper FILE [ARGV0 ARGS...]\n")
        return EXIT_USAGE
    file, exec_argv = args[0], args[1:]
    raw_env = dict(os.environb)
    env = {p.wire_str(k): p.wire_str(v) for k, v in raw_env.items()}
    target = open_target(file)
    try:
        with connect(env) as sock:
            response = request_decision(sock, p.wire_str(file), [p.wire_str(a) for a in exec_argv], env, target)
            if response.action == "Escalate":
                status = escalate(sock, response.extensions.get(p.SIGNALS_EXTENSION_FIELD) is True)
                return status if 0 <= status <= 255 else status & 0xFF
        if response.action == "Deny":
            sys.stderr.write(p.deny_message(response.reason) + "\n")
            return p.DENY_EXIT_CODE
        run_in_place(file, exec_argv, raw_env, target)
    except WrapperError as exc:
        sys.stderr.write(f"{_PREFIX}{exc}\n")
        return exc.status
    finally:
        if target is not None:
            os.close(target)
