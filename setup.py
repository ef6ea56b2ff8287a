"""Build step for the native interception code (wrapper/native/*.c).

``pip install`` and ``pip install -e`` compile, with the system C compiler (``$CC`` or ``cc``):

- ``libexecgate_preload.so`` — the LD_PRELOAD shim (``preload.c`` + ``preload.map``), and
- ``execgate-wrapper-native`` — the native execve wrapper (``wrapper.c``),

into the installed ``execgate/wrapper/`` package directory (for an editable install: into the source
``wrapper/`` directory). The wheel is marked platform-specific. At run time
:mod:`execgate.wrapper.artifacts` finds the two files. Set ``EXECGATE_SKIP_NATIVE=1`` to build
without them (only exec-wrapper shells then work); a missing compiler is an error otherwise.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
NATIVE = HERE / "wrapper" / "native"
PRELOAD_LIB = "libexecgate_preload.so"
NATIVE_WRAPPER = "execgate-wrapper-native"
CFLAGS = ["-O2", "-g0", "-Wall", "-Wextra", "-Wno-nonnull-compare", "-fno-delete-null-pointer-checks"]


def _compiler() -> list[str]:
    cc = shlex.split(os.environ.get("CC", "")) or ["cc"]
    if shutil.which(cc[0]) is None:
        raise SystemExit(
            f"execgate: no C compiler ({cc[0]!r} not found); install gcc, or set "
            "EXECGATE_SKIP_NATIVE=1 to build without the preload shim and native wrapper"
        )
    return cc


def _run(cmd: list[str]) -> None:
    print(" ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True)


def build_native(out_dir: Path) -> list[str]:
    """Compile both artifacts into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = _compiler()
    extra = shlex.split(os.environ.get("CFLAGS", ""))
    lib, exe = out_dir / PRELOAD_LIB, out_dir / NATIVE_WRAPPER
    _run([*cc, *CFLAGS, *extra, "-shared", "-fPIC", f"-Wl,--version-script={NATIVE / 'preload.map'}",
          "-o", str(lib), str(NATIVE / "preload.c"), "-ldl"])
    _run([*cc, *CFLAGS, *extra, "-o", str(exe), str(NATIVE / "wrapper.c")])
    return [str(lib), str(exe)]


class BuildPyWithNative(build_py):
    """build_py that also compiles the native interception code into execgate/wrapper/."""

    def run(self) -> None:
        super().run()
        self._native_outputs: list[str] = []
        if os.environ.get("EXECGATE_SKIP_NATIVE") == "1":
            print("execgate: EXECGATE_SKIP_NATIVE=1, not building the native interception code")
            return
        if getattr(self, "editable_mode", False):
            out = HERE / self.get_package_dir("execgate.wrapper")
        else:
            out = Path(self.build_lib) / "execgate" / "wrapper"
        self._native_outputs = build_native(out)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs += getattr(self, "_native_outputs", [])
        return outputs


class BinaryDistribution(Distribution):
    """The wheel carries compiled code: it is platform-specific (platlib, not py3-none-any)."""

    def has_ext_modules(self) -> bool:
        return True


class BdistWheelPlatform(bdist_wheel):
    """Tag ``py3-none-<platform>``: the binaries run under any CPython 3 but only on this platform."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": BdistWheelPlatform},
    distclass=BinaryDistribution,
)
