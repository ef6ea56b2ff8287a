"""The escalation server's public API: :class:`EscalateServer` (sessions, one-shot ``exec``) and
:class:`ExecResult`.

One server hosts many sessions at once in one event loop (asyncio or uvloop). Hooks for the other
parts of execgate, all optional constructor arguments:

* ``extra_env`` — extra env-overlay variables per session (mapping, or callable given the
  :class:`~execgate.server.session.Session`), e.g. the preload shim's ``LD_PRELOAD`` and
  ``EXECGATE_*`` variables.
* ``launcher`` — a :class:`ShellLauncher` (or :class:`ArgvLauncher`) turning the shell argv into
  the argv actually spawned
  (a bubblewrap sandbox prefixes ``bwrap ...``); ``sandbox`` (or the launcher's ``permissions``
  attribute) is the session's profile sent to the policy in ``SessionContext.sandbox``.
* ``exec(env=..., on_output=..., max_capture=...)`` — the shell's base environment, a callback
  receiving output chunks as they arrive so that a CLI can stream them live (it may push back by
  returning an awaitable), and the cap on captured bytes (:mod:`execgate.server.output`).
* the fallback socket path of each session (``EXECGATE_SOCKET_PATH``, :mod:`.session`).
* ``seccomp_launcher`` — the seccomp backstop: every exec of the session's processes reaches the
  server, whatever made it (:mod:`execgate.server.backstop`).
* ``containment`` — what makes every process of a session die with it
  (:mod:`execgate.server.containment`): ``"auto"`` (default) is a cgroup per session where this
  process may make one, else process groups only; ``"subreaper"`` must be asked for, since it
  makes this whole process a child subreaper and kills its orphans at each session close.

Note: the package ``execgate.server`` re-exports nothing, so that the per-exec wrapper can import
:mod:`execgate.server.protocol` without loading asyncio; import from this module.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Protocol

from execgate.server.containment import Containment, choose
from execgate.server.escalation import Limits
from execgate.server.output import DEFAULT_MAX_CAPTURE, OutputCallback, OutputPipes
from execgate.server.policy import Permissions, Policy
from execgate.server.session import ExtraEnv, Session
from execgate.server.session_start import start_argvs
from execgate.server.spawn import ChildProcess, spawn

#: Exit status reported by :meth:`EscalateServer.exec` when the timeout fired (as timeout(1)).
TIMEOUT_EXIT_CODE = 124
#: Seconds to keep reading the shell's pipes after it exited (background jobs may hold them).
DRAIN_S = 2.0

__all__ = ["DEFAULT_MAX_CAPTURE", "DRAIN_S", "TIMEOUT_EXIT_CODE", "EscalateServer", "ExecResult", "OutputCallback"]


class ShellLauncher(Protocol):
    """Turns the shell argv (``[shell, "-c", script]``) into the argv actually spawned.

    May carry a ``permissions`` attribute (:class:`Permissions`): the sandbox profile reported to
    the policy when the server was given no explicit ``sandbox``. A plain function works too.
    """

    def __call__(self, argv: list[str], *, session: Session, workdir: str) -> list[str]: ...


class ArgvLauncher(Protocol):
    """The other accepted launcher shape (e.g. :class:`execgate.server.sandbox.ShellSandbox`):
    ``launch_argv`` is given the session's fallback-socket directory in ``extra_binds`` so that a
    sandbox can bind it back in."""

    def launch_argv(self, shell_argv: list[str], *, cwd: str, extra_binds: list[str]) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class ExecResult:
    """Outcome of :meth:`EscalateServer.exec`.

    Attributes:
        exit_code: the shell's status (``128 + S`` if killed by signal S; 124 on timeout).
        stdout, stderr: captured output, UTF-8 decoded with replacement; at most ``max_capture``
            bytes of each stream (a prefix, cut before a UTF-8 character the cap would split).
        output: stdout and stderr interleaved in the order execgate read them (exact within a
            stream; across the two pipes, only for writes execgate read before the other stream
            was written to), capped the same way.
        duration: wall-clock seconds from start to the shell's exit.
        timed_out: True if the timeout killed the shell.
        truncated: ``{"stdout"|"stderr"|"output": bytes not captured}`` for each stream that
            was cut at the cap; empty when everything was captured.
    """

    exit_code: int
    stdout: str
    stderr: str
    output: str
    duration: float
    timed_out: bool
    truncated: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


class EscalateServer:
    """Serves the escalation protocol for any number of sessions.

    Args:
        shell: path of the shell run by :meth:`exec` (bash, zsh, dash, …).
        wrapper: path of the execve wrapper exported as ``EXEC_WRAPPER`` (made absolute).
        policy: the :class:`~execgate.server.policy.Policy` consulted for every exec.
        launcher: optional :class:`ShellLauncher` or :class:`ArgvLauncher` hook (sandbox).
        sandbox: the sessions' sandbox profile; default ``launcher.permissions`` if present.
        extra_env: extra env-overlay variables (mapping or ``callable(session) -> mapping``).
        limits: protocol limits and kill grace period.
        socket_dir: parent directory of the sessions' private fallback-socket directories
            (default ``/tmp`` whatever ``TMPDIR`` says; keep it short: AF_UNIX paths are limited
            to 108 bytes).
        seccomp_launcher: path of ``execgate-seccomp-launch``: each session's shell is started under
            the seccomp backstop (:mod:`execgate.server.backstop`); None: no backstop.
        on_note: called with each line for the user that a session has (once per session): why
            a program a rule would escalate stays in the sandbox, which rule sandboxed an
            escalation that failed. Default: a WARNING log line.
        containment: a :class:`~execgate.server.containment.Containment`, or a mode for
            :func:`~execgate.server.containment.choose` ("auto": a cgroup per session where
            possible, else process groups only; "cgroup", "subreaper", "none"), chosen at the
            first session.
        ctty_launcher: path of ``execgate-ctty``, for ``exec(ctty=True)`` (a shell on a pty).
    """

    def __init__(
        self,
        shell: str,
        wrapper: str,
        policy: Policy,
        *,
        launcher: ShellLauncher | ArgvLauncher | None = None,
        sandbox: Permissions | None = None,
        extra_env: ExtraEnv | None = None,
        limits: Limits | None = None,
        socket_dir: str | None = None,
        seccomp_launcher: str | None = None,
        on_note: Callable[[str], None] | None = None,
        containment: Containment | str = "auto",
        ctty_launcher: str | None = None,
    ) -> None:
        self.shell = shell
        self.wrapper = os.path.abspath(wrapper)
        self.policy = policy
        self.launcher = launcher
        self.sandbox = sandbox if sandbox is not None else getattr(launcher, "permissions", None)
        self.extra_env = extra_env
        self.limits = limits or Limits()
        self.socket_dir = socket_dir
        self.seccomp_launcher = seccomp_launcher
        self.on_note = on_note
        self._containment = containment
        self.ctty_launcher = ctty_launcher

    @property
    def containment(self) -> Containment:
        """The containment of this server's sessions (chosen on first use).

        Raises:
            ContainmentError: a mode asked for explicitly is unavailable here.
        """
        if not isinstance(self._containment, Containment):
            self._containment = choose(self._containment, fallback="none")
        return self._containment

    def start_session(self, session_id: str | None = None, labels: Mapping[str, str] | None = None) -> Session:
        """Create a session and start serving it (needs a running event loop).

        Use it as ``async with server.start_session() as s:``; spawn the shell with
        ``env | s.env_overlay`` (passing ``s.client_fd``), then call ``s.close_client_socket()``.

        Raises:
            OSError: the socketpair, the fallback socket or the session's cgroup could not be created.
            ContainmentError: see :attr:`containment`.
        """
        return Session(
            policy=self.policy,
            wrapper=self.wrapper,
            session_id=session_id,
            labels=labels,
            sandbox=self.sandbox,
            extra_env=self.extra_env,
            limits=self.limits,
            socket_dir=self.socket_dir,
            seccomp_launcher=self.seccomp_launcher,
            on_note=self.on_note,
            containment=self.containment,
        )

    def shell_argv(self, command: str, *, login: bool, session: Session, workdir: str,
                   ctty: bool = False) -> list[str]:
        """``[shell, "-c"|"-lc", command]``, passed through the launcher hook if any.

        With ``ctty``, ``execgate-ctty`` runs first inside the sandbox (after bwrap's
        ``--new-session``, before the seccomp backstop): it makes fd 0 the controlling terminal.
        """
        argv = [self.shell, "-lc" if login else "-c", command]
        if session.backstop is not None:  # inside any sandbox: bwrap's own execs stay unnotified
            argv = session.backstop.launch_argv(argv)
        if ctty and self.ctty_launcher is not None:
            argv = [self.ctty_launcher, argv[0], *argv]
        if self.launcher is None:
            return argv
        if hasattr(self.launcher, "launch_argv"):
            return list(self.launcher.launch_argv(argv, cwd=workdir, extra_binds=[session.socket_dir]))
        return list(self.launcher(argv, session=session, workdir=workdir))  # type: ignore[operator]

    async def exec(
        self,
        command: str,
        workdir: str,
        timeout_s: float | None = None,
        login: bool = False,
        *,
        env: Mapping[str, str] | None = None,
        on_output: OutputCallback | None = None,
        session_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        max_capture: int = DEFAULT_MAX_CAPTURE,
        stderr_to_stdout: bool = False,
        stdio: Mapping[int, int] | None = None,
        ctty: bool = False,
    ) -> ExecResult:
        """Run ``SHELL -c|-lc command`` in ``workdir`` in a fresh session and capture its output.

        Args:
            command: the script.
            workdir: working directory of the shell.
            timeout_s: seconds; on expiry the shell's process group gets SIGKILL and the session's
                escalated groups are killed (TERM, then KILL after the grace period).
            login: use ``-lc``.
            env: the shell's base environment (default the server's ``os.environ``); the session's
                overlay is added on top.
            on_output: called on the event loop with each chunk read, in arrival order; if it
                returns an awaitable, that stream is not read again until it is done
                (:data:`~execgate.server.output.OutputCallback`).
            session_id, labels: as :meth:`start_session`.
            max_capture: bytes kept of each of ``stdout``, ``stderr`` and ``output`` (default
                16 MiB; 0 keeps nothing, e.g. when ``on_output`` streams it all). The rest is read
                and discarded, so the script never blocks on a full pipe; ``truncated`` counts it.
            stderr_to_stdout: give the shell one pipe for stdout and stderr (as ``2>&1``):
                ``stdout`` and ``output`` then hold both in exactly the order written, ``stderr``
                is empty (with two pipes the order between them is only the order of reading).
            stdio: fds given to the shell as they are, destination (0, 1, 2) → fd: e.g. the
                caller's own stdin, or the slave of a pty for all three. The caller keeps them
                (and closes them). Destinations not given: stdin ``/dev/null``, stdout and stderr
                the captured pipes; a given stdout or stderr is not captured.
            ctty: make the shell's fd 0 (``stdio[0]``, a terminal) the controlling terminal of
                its new session, through the server's ``ctty_launcher`` (``execgate-ctty``).

        When the shell exits, the session closes (killing any escalated command still running,
        and with a cgroup or the subreaper every other process the session started) and its pipes
        are read for at most ``DRAIN_S`` more seconds.

        Raises:
            ValueError: ``max_capture`` is negative; ``ctty`` without a terminal on ``stdio[0]``
                or without a ``ctty_launcher``.
            OSError: the shell could not be spawned.
        """
        stdio = dict(stdio or {})
        if ctty and (self.ctty_launcher is None or 0 not in stdio or not os.isatty(stdio[0])):
            raise ValueError("ctty needs a terminal on stdio[0] and a server with a ctty_launcher")
        started = time.monotonic()
        capture = OutputPipes(on_output, max_capture, stderr_to_stdout, given=stdio.keys())
        try:
            async with self.start_session(session_id, labels) as session:
                argv = self.shell_argv(command, login=login, session=session, workdir=workdir, ctty=ctty)
                shell_argv = None if session.backstop else [self.shell, "-lc" if login else "-c", command]
                session.policy.expect(start_argvs(argv, shell_argv))
                shell_env = {**(os.environ if env is None else env), **session.env_overlay}
                fds = (session.client_fd,) + ((session.backstop.client_fd,) if session.backstop else ())
                try:
                    shell = spawn(argv, env=shell_env, cwd=workdir, stdio={**capture.write_ends(), **stdio},
                                  pass_fds=fds, placement=session.placement)
                finally:
                    capture.close_write_ends()
                    session.close_client_socket()
                    if session.backstop is not None:
                        session.backstop.close_client()
                capture.start()
                status, timed_out = await _wait_shell(shell, timeout_s)
                duration = time.monotonic() - started
            await capture.finish(DRAIN_S)  # after the session closed: escalated writers are gone
        finally:
            await capture.close()
        text = {name: buf.text() for name, buf in capture.buffers.items()}
        return ExecResult(exit_code=status, duration=duration, timed_out=timed_out,
                          truncated=capture.truncated(), **text)


async def _wait_shell(shell: ChildProcess, timeout_s: float | None) -> tuple[int, bool]:
    """Wait for the shell; on timeout or cancellation SIGKILL its process group and reap it."""
    try:
        async with asyncio.timeout(timeout_s):
            return await shell.wait(), False
    except TimeoutError:
        shell.signal_group(signal.SIGKILL)
        await shell.wait()
        return TIMEOUT_EXIT_CODE, True
    except BaseException:
        shell.signal_group(signal.SIGKILL)
        await asyncio.shield(shell.wait())
        raise
