"""The build step's products and their run-time lookup."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from execgate.wrapper import artifacts
from execgate.wrapper.artifacts import (NativeArtifactMissing, native_wrapper_path, preload_ld_value,
                                        preload_library_path)
from execgate.wrapper.interception import preload_env, preload_extra_env

INTERCEPTED = {
    "execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle",
    "fexecve", "execveat", "posix_spawn", "posix_spawnp",
    "system", "popen",  # environment forcing only (the libc-internal /bin/sh spawn is not interposable)
}


def test_artifacts_are_built_next_to_the_package() -> None:
    lib, exe = preload_library_path(), native_wrapper_path()
    assert lib.is_absolute() and lib.parent == exe.parent == Path(artifacts.__file__).resolve().parent
    assert lib.read_bytes()[:4] == exe.read_bytes()[:4] == b"\x7fELF"


def test_shim_exports_only_the_intercepted_calls() -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(preload_library_path())], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
    assert exported == INTERCEPTED


def _elf_class(path: Path) -> int:
    return path.read_bytes()[4]  # EI_CLASS: 1 = 32-bit, 2 = 64-bit (elf(5))


def test_one_shim_per_abi_named_through_the_lib_token(tmp_path: Path) -> None:
    """Issue #9 class 11: an x86_64 and an i386 build (gcc-multilib is installed by setup.sh), each
    in the directory its loader expands $LIB to; LD_PRELOAD names them with the literal token."""
    here = Path(artifacts.__file__).resolve().parent
    value = preload_ld_value()
    assert value == str(here / "preload" / "$LIB" / "libexecgate_preload.so")
    builds = sorted((here / "preload").glob("**/libexecgate_preload.so"))
    assert sorted(_elf_class(b) for b in builds) == [1, 2] and artifacts.has_32bit_shim()
    for build in builds:
        out = subprocess.run(["nm", "-D", "--defined-only", str(build)], capture_output=True, text=True,
                             check=True).stdout
        assert {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]} == INTERCEPTED
    # Each ABI's loader really picks its own build (a wrong one would be "ignored" with a warning).
    (tmp_path / "main.c").write_text("int main(void) { return 0; }\n")
    for flags in ([], ["-m32"]):
        exe = tmp_path / f"probe{''.join(flags)}"
        subprocess.run(["cc", *flags, "-o", str(exe), str(tmp_path / "main.c")], check=True)
        probe = subprocess.run([str(exe)], env={"LD_PRELOAD": value}, capture_output=True, text=True, check=False)
        assert probe.returncode == 0 and probe.stderr == "", (flags, probe.stderr)
        assert _elf_class(exe) == (1 if flags else 2)


def test_seccomp_launcher_is_built() -> None:
    launcher = artifacts.seccomp_launcher_path()
    assert launcher.parent == Path(artifacts.__file__).resolve().parent and _elf_class(launcher) == 2


def test_contain_helper_is_built() -> None:
    helper = artifacts.contain_helper_path()
    assert helper.parent == Path(artifacts.__file__).resolve().parent and _elf_class(helper) == 2


def test_missing_artifact_says_how_to_rebuild(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(artifacts, "_HERE", tmp_path)
    with pytest.raises(NativeArtifactMissing, match="pip install"):
        preload_library_path()
    with pytest.raises(FileNotFoundError, match="execgate-wrapper-native is missing"):
        native_wrapper_path()


def test_preload_env() -> None:
    env = preload_env(socket_fd=0, max_depth=9)
    assert env["LD_PRELOAD"] == preload_ld_value()
    assert env["EXEC_WRAPPER"] == str(native_wrapper_path())
    assert env["EXECGATE_SOCKET_ID"].startswith("0:") and env["EXECGATE_MAX_DEPTH"] == "9"
    assert preload_env("/x/w", base_ld_preload="/a.so")["LD_PRELOAD"].endswith(":/a.so")


def test_preload_extra_env_keeps_the_servers_wrapper() -> None:
    class FakeSession:
        client_fd = 1

    extra = preload_extra_env()(FakeSession())
    assert "EXEC_WRAPPER" not in extra and extra["EXECGATE_SOCKET_ID"].startswith("1:")
