"""Environment extras that switch a session's shell to preload interception (docs/DESIGN.md §6).

The session's env overlay (``CODEX_ESCALATE_SOCKET``, ``EXEC_WRAPPER``; see
:mod:`execgate.server.protocol`) is enough for shells that honour ``EXEC_WRAPPER``. For stock shells
the overlay also needs ``LD_PRELOAD`` naming the shim; :func:`preload_env` builds those extras.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from execgate.wrapper.artifacts import native_wrapper_path, preload_ld_value, preload_library_path

#: The shim's variables (all ``EXECGATE_``-prefixed, docs/DESIGN.md §2).
SOCKET_ID_ENV_VAR = "EXECGATE_SOCKET_ID"
DEPTH_ENV_VAR = "EXECGATE_DEPTH"
MAX_DEPTH_ENV_VAR = "EXECGATE_MAX_DEPTH"
#: Set by the shim only for the wrapper process; never put it in an overlay.
IN_WRAPPER_ENV_VAR = "EXECGATE_IN_WRAPPER"


def socket_id(fd: int) -> str:
    """``"<fd>:<inode>"`` of the session's client socket: lets the wrapper tell the inherited
    socket from another datagram socket that reuses its fd number after a program closed it."""
    return f"{fd}:{os.fstat(fd).st_ino}"


def preload_env(
    wrapper_path: str | os.PathLike[str] | None = None,
    *,
    socket_fd: int | None = None,
    base_ld_preload: str | None = None,
    max_depth: int | None = None,
) -> dict[str, str]:
    """Env overlay extras for preload mode.

    Args:
        wrapper_path: the execve wrapper the shell's execs are turned into; default the native
            wrapper. Returned as ``EXEC_WRAPPER`` (the same value the session overlay carries).
        socket_fd: the session's client ``SOCK_DGRAM`` fd (``CODEX_ESCALATE_SOCKET``); when given,
            ``EXECGATE_SOCKET_ID`` pins its inode (the shim computes it at load otherwise).
        base_ld_preload: an ``LD_PRELOAD`` value to keep after the shim (e.g. the caller's own).
        max_depth: limit of gated execs along one ancestry (``EXECGATE_MAX_DEPTH``; default 128).

    Returns:
        ``{"LD_PRELOAD": ..., "EXEC_WRAPPER": ..., [EXECGATE_* ...]}``; all paths absolute
        (``LD_PRELOAD`` may contain the loader's ``$LIB`` token, see
        :func:`~execgate.wrapper.artifacts.preload_ld_value`).

    Raises:
        NativeArtifactMissing: the shim (or the default wrapper) was not built.
    """
    wrapper = Path(wrapper_path) if wrapper_path is not None else native_wrapper_path()
    preload = preload_ld_value()  # per-ABI ($LIB) when installed: 32-bit programs are gated too
    if base_ld_preload:
        preload = f"{preload}:{base_ld_preload}"
    env = {"LD_PRELOAD": preload, "EXEC_WRAPPER": str(wrapper.absolute())}
    if socket_fd is not None:
        env[SOCKET_ID_ENV_VAR] = socket_id(socket_fd)
    if max_depth is not None:
        env[MAX_DEPTH_ENV_VAR] = str(max_depth)
    return env


def preload_extra_env(
    wrapper_path: str | os.PathLike[str] | None = None,
    *,
    max_depth: int | None = None,
    base_ld_preload: str | None = None,
) -> Callable[[Any], dict[str, str]]:
    """An ``extra_env`` callable for ``EscalateServer``/``Session``: :func:`preload_env` for each
    session, pinning the session's client socket (``session.client_fd``). ``EXEC_WRAPPER`` is
    included only when ``wrapper_path`` is given; otherwise the server's wrapper stays in force.
    ``base_ld_preload`` is kept after the shim in ``LD_PRELOAD`` (e.g. the caller's own value).

    Raises:
        NativeArtifactMissing: the shim (or the default wrapper) was not built; raised here, at
            configuration time, not when a session starts.
    """
    preload_library_path()
    wrapper = Path(wrapper_path) if wrapper_path is not None else native_wrapper_path()

    def extra(session: Any) -> dict[str, str]:
        fd = getattr(session, "client_fd", -1)
        env = preload_env(wrapper, socket_fd=fd if fd >= 0 else None, max_depth=max_depth,
                          base_ld_preload=base_ld_preload)
        if wrapper_path is None:
            del env["EXEC_WRAPPER"]  # keep the server's own wrapper (normally the native one)
        return env

    return extra
