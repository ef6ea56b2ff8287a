"""Where the compiled native interception code lives at run time.

``pip install`` (and ``pip install -e``) compile two files next to this module (see ``setup.py``):
the LD_PRELOAD shim ``libexecgate_preload.so`` and the native execve wrapper
``execgate-wrapper-native``. Both are platform-specific; the sources are in ``native/``.
"""

from __future__ import annotations

import os
from pathlib import Path

#: File name of the LD_PRELOAD shim (built from ``native/preload.c``).
PRELOAD_LIBRARY_NAME = "libexecgate_preload.so"
#: File name of the native execve wrapper (built from ``native/wrapper.c``).
NATIVE_WRAPPER_NAME = "execgate-wrapper-native"

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
