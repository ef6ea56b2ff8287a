"""Sandboxes for the session's shell and bubblewrap command lines (docs/DESIGN.md §7).

One place builds every ``bwrap`` argv in execgate: the shell's own sandbox (``execgate run --sandbox
bwrap``) and the sandboxed forms of escalated commands that the policy service prepares for a
``permissions`` or ``session_default`` execution.

The shell sandbox is: the whole filesystem read-only, a private ``/tmp``, the working directory and
any extra writable roots bound read-write, no network (a fresh network namespace that has only
loopback), ``--unshare-pid`` and ``--die-with-parent`` so that killing the launcher kills
everything inside the sandbox. Inherited fds (the
session's ``CODEX_ESCALATE_SOCKET``) pass through bwrap unchanged; the session's fallback socket
directory is bound back in after ``/tmp`` is replaced.

Flag meanings are from bwrap(1) (bubblewrap 0.8).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal, Sequence

from execgate.server.policy import Permissions

log = logging.getLogger(__name__)

SandboxMode = Literal["auto", "bwrap", "none"]


class SandboxError(Exception):
    """Raised when the requested sandbox cannot be set up (bwrap missing or unusable)."""


def bwrap_argv(
    permissions: Permissions,
    *,
    cwd: str,
    private_tmp: bool = True,
    extra_binds: Sequence[str] = (),
    bwrap: str = "bwrap",
) -> list[str]:
    """The bwrap prefix that confines a command to ``permissions``.

    Args:
        permissions: network on/off; writable roots bound read-write, readable roots read-only
            (the root is read-only already, so readable roots matter only for paths under a
            private ``/tmp``).
        cwd: absolute directory the command starts in (``--chdir``).
        private_tmp: mount a fresh tmpfs on ``/tmp`` (before the binds, so binds under /tmp show).
        extra_binds: more absolute paths bound read-write (e.g. the session's socket directory).
        bwrap: the bwrap executable.

    Returns:
        ``[bwrap, flags…, "--"]``: append the command's argv to it.
    """
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if private_tmp:
        argv += ["--tmpfs", "/tmp"]
    # The start directory stays visible (read-only unless a writable root covers it) under /tmp too.
    for root in (cwd, *permissions.readable_roots):
        argv += ["--ro-bind-try", root, root]
    for root in (*permissions.writable_roots, *extra_binds):
        argv += ["--bind-try", root, root]
    if not permissions.network:
        argv.append("--unshare-net")
    # A pid namespace: when bwrap dies (--die-with-parent, or a kill of its group), the kernel
    # kills every process inside, grandchildren that left the process group included.
    argv += ["--unshare-pid", "--die-with-parent", "--chdir", cwd, "--"]
    return argv


def bwrap_usable(bwrap: str = "bwrap") -> str | None:
    """Return None if ``bwrap`` can start a sandbox here, else a one-line reason why not."""
    path = shutil.which(bwrap)
    if path is None:
        return f"{bwrap} not found on PATH"
    probe = bwrap_argv(Permissions(), cwd="/", bwrap=path) + ["/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} failed to start: {exc}"
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        return f"{path} cannot create a sandbox here: {err[-1] if err else 'status %d' % done.returncode}"
    return None


@dataclass(frozen=True, slots=True)
class ShellSandbox:
    """The chosen sandbox of a session's shell.

    Attributes:
        mode: "bwrap" or "none" (never "auto": that is resolved by :func:`choose_sandbox`).
        permissions: what the shell may do; sent to the policy as the session's sandbox profile
            (None when unconfined).
        note: one line saying what was chosen and why, for the user.
    """

    mode: Literal["bwrap", "none"]
    permissions: Permissions | None
    note: str

    def launch_argv(self, shell_argv: Sequence[str], *, cwd: str, extra_binds: Sequence[str] = ()) -> list[str]:
        """Turn the shell's argv into the argv actually spawned (a bwrap prefix, or unchanged)."""
        if self.mode == "none" or self.permissions is None:
            return list(shell_argv)
        return bwrap_argv(self.permissions, cwd=cwd, extra_binds=extra_binds) + list(shell_argv)


def choose_sandbox(
    mode: SandboxMode, *, workdir: str, writable: Sequence[str] = (), readable: Sequence[str] = ()
) -> ShellSandbox:
    """Resolve ``--sandbox auto|bwrap|none`` for a shell working in ``workdir``.

    ``readable`` lists paths that must stay visible even under the private ``/tmp`` (execgate's
    own install prefix, the wrapper, the preload shim: a virtualenv may live under /tmp).

    Raises:
        SandboxError: ``bwrap`` was asked for and cannot run here.
    """
    if mode == "none":
        return ShellSandbox("none", None, "sandbox: none (the shell runs unconfined; every exec is still gated)")
    reason = bwrap_usable()
    if reason is not None:
        if mode == "bwrap":
            raise SandboxError(reason)
        return ShellSandbox("none", None, f"sandbox: none ({reason})")
    roots = tuple(dict.fromkeys([os.path.abspath(workdir), *map(os.path.abspath, writable)]))
    seen = tuple(dict.fromkeys(os.path.abspath(r) for r in readable if os.path.abspath(r) not in roots))
    perms = Permissions(network=False, writable_roots=roots, readable_roots=seen)
    chosen = "bwrap" if mode == "bwrap" else "bwrap (auto: bubblewrap works here)"
    return ShellSandbox("bwrap", perms, f"sandbox: {chosen}; read-only root, writable {', '.join(roots)} and a private /tmp, no network")
