"""End-to-end support for tests/e2e: real shells under the preload shim, a real escalation server,
an in-process policy that denies one marker program and runs everything else.

Loaded as a pytest plugin by tests/conftest.py, which provides the ``gate`` fixture (no conftest.py
below tests/: pytest would shadow the root ``conftest`` module that other tests import from).

The server is the real ``execgate.server.escalate_server.EscalateServer``, run on a uvloop event
loop as in production, with the shim's variables added per session by ``preload_extra_env`` and,
as ``execgate run`` does by default, the seccomp backstop on (``Gate.seccomp``).
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest
import uvloop

from execgate.wrapper.artifacts import native_wrapper_path, seccomp_launcher_path
from execgate.wrapper.interception import preload_extra_env

from execgate.server.escalate_server import EscalateServer
from execgate.server.policy import Decision, Execution, PreparedExec

DENIED = "eg-denied-marker"
ESCALATED = "eg-escalated-marker"
ALLOWED = "eg-allowed-marker"
ALLOWED_OUTPUT = "allowed-marker-ran"
DENIED_OUTPUT = "DENIED-MARKER-RAN"
DENY_REASON = "marker denied"


class MarkerPolicy:
    """Denies programs whose basename is ``eg-denied-marker``, escalates ``eg-escalated-marker``
    (run by the server, unsandboxed), runs everything else.

    Attributes:
        calls: ``(program, argv)`` of every ``determine_action``, in order.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    async def determine_action(self, program: str, argv: Sequence[str], workdir: str, session: Any) -> Decision:
        return self.decide(program, argv)

    def decide(self, program: str, argv: Sequence[str]) -> Decision:
        self.calls.append((program, list(argv)))
        if posixpath.basename(program) == DENIED:
            return Decision.deny(DENY_REASON)
        if posixpath.basename(program) == ESCALATED:
            return Decision.escalate()
        return Decision.run()

    async def prepare_escalated_exec(
        self, program: str, argv: Sequence[str], workdir: str, env: Mapping[str, str], execution: Execution, session: Any
    ) -> PreparedExec:
        return PreparedExec(command=[program, *argv[1:]], cwd=workdir, env=dict(env))

    def programs(self) -> list[str]:
        return [program for program, _ in self.calls]


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


@dataclass
class Gate:
    """Runs ``SHELL -c SCRIPT`` in one session under the preload shim and the native wrapper."""

    policy: MarkerPolicy
    bindir: Path
    workdir: Path
    socket_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    #: Optional sandbox hook: ``(shell_argv, workdir, socket_dir) -> argv actually spawned``.
    launcher: Callable[[list[str], str, str], list[str]] | None = None
    #: ``EXEC_WRAPPER``; default the native wrapper.
    wrapper: str | None = None
    #: Start the shell under the seccomp backstop (as ``execgate run`` does by default).
    seccomp: bool = True

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EXECGATE_", "LD_", "CODEX_"))}
        env.pop("EXEC_WRAPPER", None)
        env["PATH"] = f"{self.bindir}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        return env | self.extra_env

    def run(self, shell: str, script: str, timeout: float = 60, env: Mapping[str, str] | None = None) -> Result:
        """Run ``SHELL -c SCRIPT`` in the work dir; ``env`` adds to the shell's base environment."""
        shell_path = shutil.which(shell) or shell
        self.extra_env = {**self.extra_env, **(env or {})}
        return self._run(shell_path, script, timeout)

    def _run(self, shell: str, script: str, timeout: float) -> Result:
        hook = self.launcher

        def launcher(argv: list[str], *, session: Any, workdir: str) -> list[str]:
            assert hook is not None
            return hook(argv, workdir, os.path.dirname(session.socket_path))

        server = EscalateServer(
            shell, self.wrapper or str(native_wrapper_path()), self.policy,
            launcher=launcher if hook else None, extra_env=preload_extra_env(), socket_dir=str(self.socket_dir),
            seccomp_launcher=str(seccomp_launcher_path()) if self.seccomp else None,
        )
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            res = runner.run(server.exec(script, str(self.workdir), timeout_s=timeout, env=self.base_env()))
        assert not res.timed_out, f"timed out: {res.output}"
        return Result(res.exit_code, res.stdout, res.stderr)


def write_script(path: Path, text: str, mode: int = 0o755) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def gate(short_tmp: Path) -> Gate:
    """A gate with marker programs on PATH: ``eg-allowed-marker ARGS`` prints
    ``allowed-marker-ran ARGS``; ``eg-denied-marker`` is denied by the policy."""
    bindir, workdir, socket_dir = short_tmp / "bin", short_tmp / "work", short_tmp / "s"
    for d in (bindir, workdir, socket_dir):
        d.mkdir()
    write_script(bindir / ALLOWED, f'#!/bin/sh\necho {ALLOWED_OUTPUT} "$@"\n')
    write_script(bindir / DENIED, f"#!/bin/sh\necho {DENIED_OUTPUT}\n")
    write_script(bindir / ESCALATED, '#!/bin/sh\necho escalated-marker-ran "$@"; exit 7\n')
    return Gate(MarkerPolicy(), bindir, workdir, socket_dir)
