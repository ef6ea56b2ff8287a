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
