"""The Python reference execve wrapper: ``execgate-wrapper FILE ARGV0 [ARGS...]``.

A shell honouring ``EXEC_WRAPPER`` (or the preload shim) runs this instead of ``execve(FILE, ARGV)``.
It asks the session's escalation server what to do (DESIGN.md §2; sequence diagram in
:mod:`execgate.server.protocol`) and then:

* **Run** — ``execve(FILE, ARGV, environ)`` in place; the inherited ``CODEX_ESCALATE_SOCKET`` fd
  stays open and inheritable so that the program's own children are gated too.
* **Escalate** — sends duplicates of its stdin/stdout/stderr, forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT
  if the server advertises ``execgate_signals``, and exits with the escalated command's status.
* **Deny** — prints ``Execution denied: <reason>`` on stderr and exits 1.

Any failure prints one line prefixed ``execgate-wrapper:`` on stderr and exits non-zero (2 usage,
126 server/protocol failure or non-executable file, 127 file not found); it never runs the program
unchecked. It runs once per exec, so it imports only light stdlib modules, the protocol and fdpass.
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


def _inherited_dgram_socket(env: dict[str, str]) -> socket.socket | None:
    """The ``CODEX_ESCALATE_SOCKET`` fd as a socket, if it names an AF_UNIX SOCK_DGRAM socket.
    The returned socket must be ``detach()``-ed, never closed (the fd is shared with descendants)."""
    try:
        fd = int(env.get(p.ESCALATE_SOCKET_ENV_VAR, ""))
        if fd < 0 or not stat.S_ISSOCK(os.fstat(fd).st_mode):
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


def request_decision(sock: socket.socket, file: str, argv: Sequence[str], env: dict[str, str]) -> p.EscalateResponse:
    """Send the request and read the response.

    Raises:
        WrapperError: the working directory is unknown, the stream broke, or the answer is malformed.
    """
    try:
        workdir = os.getcwd()
    except OSError as exc:
        raise WrapperError(f"cannot determine the working directory: {exc.strerror}") from exc
    request_env = {k: v for k, v in env.items() if k not in p.OVERLAY_ENV_VARS}
    request = p.EscalateRequest(file=file, argv=list(argv), workdir=workdir, env=request_env)
    try:
        send_frame_blocking(sock, request.to_json())
        payload, _ = recv_frame_blocking(sock, max_fds=0)
        return p.EscalateResponse.from_obj(p.decode_json(payload))
    except (OSError, p.ProtocolError) as exc:
        raise WrapperError(f"no valid answer from the escalation server: {exc}") from exc


def run_in_place(file: str, argv: Sequence[str], env: dict[str, str]) -> NoReturn:
    """execve the original program, keeping the inherited handshake socket open across it.

    Raises:
        WrapperError: execve failed (status 127 if the file does not exist, else 126).
    """
    try:
        os.set_inheritable(int(env.get(p.ESCALATE_SOCKET_ENV_VAR, "")), True)
    except (ValueError, OSError):
        pass
    # CPython ignores SIGPIPE and SIGXFSZ at startup and execve keeps ignored dispositions: give
    # the program the defaults it would have had without us (as subprocess's restore_signals does).
    for name in ("SIGPIPE", "SIGXFSZ"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execve(file, list(argv), env)
    except OSError as exc:
        status = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_FAILURE
        raise WrapperError(f"cannot execute {file}: {exc.strerror}", status) from exc


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``execgate-wrapper FILE ARGV0 [ARGS...]``; returns the exit status (or execs)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        sys.stderr.write(f"{_PREFIX}usage: execgate-wrapper FILE ARGV0 [ARGS...]\n")
        return EXIT_USAGE
    file, exec_argv = args[0], args[1:]
    env = dict(os.environ)
    try:
        with connect(env) as sock:
            response = request_decision(sock, file, exec_argv, env)
            if response.action == "Escalate":
                status = escalate(sock, response.extensions.get(p.SIGNALS_EXTENSION_FIELD) is True)
                return status if 0 <= status <= 255 else status & 0xFF
        if response.action == "Deny":
            sys.stderr.write(p.deny_message(response.reason) + "\n")
            return p.DENY_EXIT_CODE
        run_in_place(file, exec_argv, env)
    except WrapperError as exc:
        sys.stderr.write(f"{_PREFIX}{exc}\n")
        return exc.status
