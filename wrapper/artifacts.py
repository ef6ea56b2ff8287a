"""Where the compiled native interception code lives at run time.

``pip install`` (and ``pip install -e``) compile, next to this module (see ``setup.py``): the
LD_PRELOAD shim ``libexecgate_preload.so``, the native execve wrapper ``execgate-wrapper-native``,
the seccomp backstop's launcher ``execgate-seccomp-launch`` (x86_64), the containment helper
``execgate-contain``, the controlling-terminal launcher ``execgate-ctty`` and the shim once per ABI under
``preload/<what ld.so expands $LIB to>/`` (x86_64, and i386 where gcc-multilib is present). All are
platform-specific; the sources are in ``native/``.
"""

from __future__ import annotations

import os
from pathlib import Path

#: File name of the LD_PRELOAD shim (built from ``native/preload.c``).
PRELOAD_LIBRARY_NAME = "libexecgate_preload.so"
#: File name of the native execve wrapper (built from ``native/wrapper.c``).
NATIVE_WRAPPER_NAME = "execgate-wrapper-native"
#: File name of the seccomp backstop's launcher (built from ``native/seccomp_launch.c``).
SECCOMP_LAUNCHER_NAME = "execgate-seccomp-launch"
#: File name of the containment helper (built from ``native/contain_exec.c``; server/containment.py).
CONTAIN_HELPER_NAME = "execgate-contain"
#: File name of the launcher that makes a session's pty its shell's controlling terminal (``native/ctty.c``).
CTTY_LAUNCHER_NAME = "execgate-ctty"
#: Directory of the per-ABI shims; ``$LIB`` (ld.so(8), "Dynamic string tokens") picks one.
PER_ABI_DIR = "preload"

_HERE = Path(__file__).resolve().parent
_REBUILD_HINT = (
    "rebuild execgate with a C compiler present: `pip install --force-reinstall --no-deps .` "
    "(or `pip install -e .` for a checkout)"
)


class NativeArtifactMissing(FileNotFoundError):
    """Raised when a compiled native artifact is not installed (built without a C compiler)."""


def _find(name: str, *, executable: bool) -> Path:
    path = _HERE / name
    if not path.is_file() or (executable and not os.access(path, os.X_OK)):
        raise NativeArtifactMissing(f"execgate: {path} is missing; {_REBUILD_HINT}")
    return path


def preload_library_path() -> Path:
    """Absolute path of ``libexecgate_preload.so``.

    Raises:
        NativeArtifactMissing: the shim was not built; the message says how to rebuild.
    """
    return _find(PRELOAD_LIBRARY_NAME, executable=False)


def native_wrapper_path() -> Path:
    """Absolute path of the ``execgate-wrapper-native`` executable.

    Raises:
        NativeArtifactMissing: the wrapper was not built; the message says how to rebuild.
    """
    return _find(NATIVE_WRAPPER_NAME, executable=True)


def seccomp_launcher_path() -> Path:
    """Absolute path of the ``execgate-seccomp-launch`` executable.

    Raises:
        NativeArtifactMissing: not built (no C compiler, or not x86_64).
    """
    return _find(SECCOMP_LAUNCHER_NAME, executable=True)


def contain_helper_path() -> Path:
    """Absolute path of the ``execgate-contain`` executable (cgroup placement, parent-death signal).

    Raises:
        NativeArtifactMissing: not built (no C compiler).
    """
    return _find(CONTAIN_HELPER_NAME, executable=True)


def ctty_launcher_path() -> Path:
    """Absolute path of the ``execgate-ctty`` executable.

    Raises:
        NativeArtifactMissing: not built (no C compiler).
    """
    return _find(CTTY_LAUNCHER_NAME, executable=True)


def preload_ld_value() -> str:
    """The shim as ``LD_PRELOAD`` names it: ``<dir>/preload/$LIB/libexecgate_preload.so`` when the
    per-ABI builds are installed (a 32-bit program then loads the i386 build; the literal ``$LIB``
    is expanded by the loader of each program, per its ABI), else the single
    :func:`preload_library_path`.

    Raises:
        NativeArtifactMissing: the shim was not built.
    """
    flat = preload_library_path()
    if not any((_HERE / PER_ABI_DIR).glob("**/" + PRELOAD_LIBRARY_NAME)):
        return str(flat)
    return str(_HERE / PER_ABI_DIR / "$LIB" / PRELOAD_LIBRARY_NAME)


def has_32bit_shim() -> bool:
    """True if an i386 build of the shim is installed (see :func:`preload_ld_value`)."""
    for path in (_HERE / PER_ABI_DIR).glob("**/" + PRELOAD_LIBRARY_NAME):
        with open(path, "rb") as f:
            if f.read(5)[4:5] == b"\x01":  # EI_CLASS == ELFCLASS32 (elf(5))
                return True
    return False
