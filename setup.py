"""Build step for the native interception code (wrapper/native/*.c).

``pip install`` and ``pip install -e`` compile, with the system C compiler (``$CC`` or ``cc``):

- ``libexecgate_preload.so`` — the LD_PRELOAD shim (``preload.c`` + ``preload.map``), and
- ``execgate-wrapper-native`` — the native execve wrapper (``wrapper.c``),
- ``execgate-seccomp-launch`` — the seccomp backstop's launcher (``seccomp_launch.c``, x86_64 only),
- ``execgate-contain`` — puts each spawned process in its session's cgroup or gives it a
  parent-death signal before it runs (``contain_exec.c``; server/containment.py),
- ``execgate-ctty`` — makes a session's pty its shell's controlling terminal (``ctty.c``),
- ``preload/<$LIB>/libexecgate_preload.so`` — the shim once more per ABI (x86_64 and, where a 32-bit
  toolchain is present (gcc-multilib), i386), in the directory the loader expands ``$LIB`` to for
  that ABI (probed here), so that ``LD_PRELOAD=.../preload/$LIB/libexecgate_preload.so`` loads the
  right one in 64-bit and 32-bit programs alike,

into the installed ``execgate/wrapper/`` package directory (for an editable install: into the source
``wrapper/`` directory). The wheel is marked platform-specific. At run time
:mod:`execgate.wrapper.artifacts` finds the two files. Set ``EXECGATE_SKIP_NATIVE=1`` to build
without them (only exec-wrapper shells then work); a missing compiler is an error otherwise.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
NATIVE = HERE / "wrapper" / "native"
PRELOAD_LIB = "libexecgate_preload.so"
NATIVE_WRAPPER = "execgate-wrapper-native"
SECCOMP_LAUNCHER = "execgate-seccomp-launch"
CONTAIN_HELPER = "execgate-contain"
CTTY_LAUNCHER = "execgate-ctty"
#: What ld.so may expand ``$LIB`` to (ld.so(8)); the probe below finds which one it is per ABI.
LIB_CANDIDATES = ("lib/x86_64-linux-gnu", "lib/i386-linux-gnu", "lib64", "lib32", "lib", "libx32")
_PROBE_LIB = r'''
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
__attribute__((constructor)) static void probe(void)
{
    Dl_info i;
    if (dladdr((void *)probe, &i) && i.dli_fname) printf("%s\n", i.dli_fname);
}
'''
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


def _shim(cc: list[str], flags: list[str], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    _run([*cc, *CFLAGS, *flags, "-shared", "-fPIC", f"-Wl,--version-script={NATIVE / 'preload.map'}",
          "-o", str(out), str(NATIVE / "preload.c"), "-ldl"])


def lib_expansion(cc: list[str], abi: list[str]) -> str | None:
    """What the loader expands ``$LIB`` to for programs built with ``abi`` flags (e.g. ``-m32``):
    a probe library is put in every candidate directory and reports which one a probe program
    loaded. None if the toolchain cannot build for ``abi`` or no candidate matched."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp, "probe.c"), Path(tmp, "probe")
        src.write_text(_PROBE_LIB)
        Path(tmp, "main.c").write_text("int main(void) { return 0; }\n")
        quiet = {"capture_output": True, "check": False}
        if subprocess.run([*cc, *abi, "-o", str(exe), str(Path(tmp, "main.c"))], **quiet).returncode != 0:
            return None
        for cand in LIB_CANDIDATES:
            Path(tmp, "t", cand).mkdir(parents=True, exist_ok=True)
            done = subprocess.run([*cc, *abi, "-shared", "-fPIC", "-o", str(Path(tmp, "t", cand, "p.so")),
                                   str(src), "-ldl"], **quiet)
            if done.returncode != 0:
                return None
        env = {**os.environ, "LD_PRELOAD": f"{tmp}/t/$LIB/p.so"}
        out = subprocess.run([str(exe)], env=env, text=True, **quiet).stdout.strip()
        prefix = f"{tmp}/t/"
        if out.startswith(prefix) and out.endswith("/p.so"):
            return out[len(prefix):-len("/p.so")]
    return None


def _wrapper(cc: list[str], extra: list[str], exe: Path) -> None:
    """The native wrapper, linked statically where the C library allows it (glibc's libc.a, Debian
    libc6-dev): it runs once for every exec the decision cache does not cover, and a static
    program starts without the dynamic loader and without loading the preload shim (measured
    here: ~0.75 vs ~1.5 ms per fork and exec with the shim in LD_PRELOAD; BENCHMARKS.md). Linked
    dynamically otherwise: the same code, one loader's start more per exec."""
    try:
        _run([*cc, *CFLAGS, *extra, "-static", "-o", str(exe), str(NATIVE / "wrapper.c")])
    except subprocess.CalledProcessError:
        print("execgate: no static C library; the native wrapper is linked dynamically")
        _run([*cc, *CFLAGS, *extra, "-o", str(exe), str(NATIVE / "wrapper.c")])


def build_native(out_dir: Path) -> list[str]:
    """Compile every artifact into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = _compiler()
    extra = shlex.split(os.environ.get("CFLAGS", ""))
    lib, exe, launcher = out_dir / PRELOAD_LIB, out_dir / NATIVE_WRAPPER, out_dir / SECCOMP_LAUNCHER
    _shim(cc, extra, lib)
    _wrapper(cc, extra, exe)
    _run([*cc, *CFLAGS, *extra, "-o", str(out_dir / CONTAIN_HELPER), str(NATIVE / "contain_exec.c")])
    ctty = out_dir / CTTY_LAUNCHER
    _run([*cc, *CFLAGS, *extra, "-o", str(ctty), str(NATIVE / "ctty.c")])
    built = [str(lib), str(exe), str(out_dir / CONTAIN_HELPER), str(ctty)]
    if platform.machine() in ("x86_64", "amd64"):
        _run([*cc, *CFLAGS, *extra, "-o", str(launcher), str(NATIVE / "seccomp_launch.c")])
        built.append(str(launcher))
    lib64 = lib_expansion(cc, [])
    if lib64 is None:
        print("execgate: cannot tell what the loader expands $LIB to; only the flat shim is built")
        return built
    abis = [([], lib64)]
    lib32 = lib_expansion(cc, ["-m32"]) if platform.machine() in ("x86_64", "amd64") else None
    if lib32 is not None and lib32 != lib64:
        abis.append((["-m32"], lib32))
    else:
        print("execgate: no 32-bit toolchain (gcc-multilib): 32-bit programs load no shim")
    for flags, expansion in abis:
        out = out_dir / "preload" / expansion / PRELOAD_LIB
        _shim(cc, [*flags, *extra, f'-DEG_LIB_DIR="{expansion}"'], out)
        built.append(str(out))
    return built


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
