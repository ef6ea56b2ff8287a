"""How ``execgate run`` intercepts every exec (docs/DESIGN.md §2, §6).

The execve wrapper run per exec (native or the Python reference client), the way execs reach it —
the preload shim for stock shells, or a shell that honours ``EXEC_WRAPPER`` (checked, since a
stock shell would run everything unchecked) — and the seccomp backstop's launcher, probed here.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from execgate.server.run_cmd import RunSetupError


def wrapper_path(kind: str) -> Path:
    """The execve wrapper executable for ``--wrapper native|python``. Raises RunSetupError."""
    if kind == "native":
        from execgate.wrapper.artifacts import NativeArtifactMissing, native_wrapper_path

        try:
            return native_wrapper_path()
        except NativeArtifactMissing as exc:
            raise RunSetupError(str(exc)) from exc
    beside = Path(sys.executable).parent / "execgate-wrapper"
    found = beside if beside.exists() else shutil.which("execgate-wrapper")
    if not found:
        raise RunSetupError("the Python wrapper `execgate-wrapper` is not installed next to this interpreter")
    return Path(found).absolute()


def shell_honours_exec_wrapper(shell: str) -> bool:
    """True if ``shell`` runs ``EXEC_WRAPPER FILE ARGV…`` instead of exec'ing FILE itself (Codex's
    patched bash and zsh do; stock shells do not, and would run everything unchecked)."""
    import subprocess

    env = {"PATH": os.environ.get("PATH", os.defpath), "EXEC_WRAPPER": "/bin/echo"}
    try:
        done = subprocess.run([shell, "-c", "/bin/true execgate-probe"], env=env, capture_output=True,
                              timeout=10, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"execgate-probe" in done.stdout


def interception_env(kind: str, wrapper: Path, shell: str) -> tuple[list[str], object]:
    """Paths the sandbox must keep visible, and the server's ``extra_env`` hook.

    Raises:
        RunSetupError: ``exec-wrapper`` with a shell that does not honour ``EXEC_WRAPPER``.
    """
    if kind == "exec-wrapper":
        if not shell_honours_exec_wrapper(shell):
            raise RunSetupError(
                f"--intercept exec-wrapper: {shell} does not honour EXEC_WRAPPER (a stock shell would "
                "run every command unchecked); use --intercept preload, or a patched shell"
            )
        return [str(wrapper.parent)], None
    from execgate.wrapper.artifacts import NativeArtifactMissing, preload_library_path
    from execgate.wrapper.interception import preload_extra_env

    try:
        shim = preload_library_path()
        extra_env = preload_extra_env(wrapper, base_ld_preload=os.environ.get("LD_PRELOAD") or None)
    except NativeArtifactMissing as exc:
        raise RunSetupError(str(exc)) from exc
    return [str(wrapper.parent), str(shim.parent)], extra_env


def choose_seccomp(mode: str) -> tuple[str | None, str]:
    """Resolve ``--seccomp auto|on|off``: the launcher to use (None: no backstop) and a note
    ("seccomp backstop: on" / "off (why)") for the user.

    Raises:
        RunSetupError: ``on`` and the backstop cannot work here.
    """
    import subprocess

    from execgate.wrapper.artifacts import NativeArtifactMissing, seccomp_launcher_path

    if mode == "off":
        return None, "seccomp backstop: off (--seccomp off)"
    try:
        launcher = str(seccomp_launcher_path())
        done = subprocess.run([launcher, "--probe"], capture_output=True, text=True, timeout=10, check=False)
        reason = None if done.returncode == 0 else (done.stderr.strip() or f"probe status {done.returncode}")
    except (NativeArtifactMissing, OSError, subprocess.TimeoutExpired) as exc:
        launcher, reason = "", str(exc)
    if reason is None:
        return launcher, "seccomp backstop: on"
    if mode == "on":
        raise RunSetupError(f"--seccomp on: {reason}")
    return None, f"seccomp backstop: off ({reason})"
