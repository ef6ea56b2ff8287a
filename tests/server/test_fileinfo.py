"""``describe`` and ``children_unseen`` on real files built here (gcc, gcc -static, gcc -m32), a
setuid copy, scripts, non-ELF and truncated files; non-regular files are refused (issue #9 class 12)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from execgate.server.exec_facts import I386, Coverage, children_unseen, describe_in_root, gather
from execgate.server.fileinfo import NotRegular, describe, kinds
from execgate.server.identity import open_in_root

HELLO = "int main(void) { return 0; }\n"
PRELOAD_64 = Coverage(seccomp=False, preload_abis=frozenset({(64, 62)}))
PRELOAD_BOTH = Coverage(seccomp=False, preload_abis=frozenset({(64, 62), I386}))
BACKSTOP = Coverage(seccomp=True, preload_abis=PRELOAD_64.preload_abis)
NO_SHIM = Coverage()


def _cc(out: Path, *flags: str) -> Path:
    src = out.parent / "hello.c"
    src.write_text(HELLO)
    done = subprocess.run(["gcc", *flags, "-o", str(out), str(src)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"gcc {' '.join(flags)} unavailable: {done.stderr.strip()[:200]}")
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    d = tmp_path_factory.mktemp("fileinfo")
    return {"dynamic": _cc(d / "dyn"), "static": _cc(d / "static", "-static"), "dir": d}


def _describe(path: Path):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return describe(fd)
    finally:
        os.close(fd)


def test_dynamic_elf(built):
    info = _describe(built["dynamic"])
    assert (info.format, info.elf_class, info.machine_name, info.linkage) == ("elf", 64, "x86_64", "dynamic")
    assert info.interpreter and "ld-linux" in info.interpreter
    assert kinds(info) == {"elf64", "dynamic"}
    assert children_unseen(info, PRELOAD_64, no_new_privs=False) is False


def test_static_elf(built):
    info = _describe(built["static"])
    assert (info.format, info.elf_class, info.linkage, info.interpreter) == ("elf", 64, "static", None)
    assert kinds(info) == {"elf64", "static"}
    assert children_unseen(info, PRELOAD_64, no_new_privs=True) is True
    assert children_unseen(info, BACKSTOP, no_new_privs=False) is False  # the backstop sees every exec


def test_32bit_elf(built):
    info = _describe(_cc(built["dir"] / "m32", "-m32"))
    assert (info.elf_class, info.machine_name, info.linkage) == (32, "i386", "dynamic")
    assert kinds(info) == {"elf32", "dynamic"}
    assert children_unseen(info, PRELOAD_64, no_new_privs=False) is True  # no i386 shim
    assert children_unseen(info, PRELOAD_BOTH, no_new_privs=False) is False


def test_setuid_copy_unseen_unless_no_new_privs(built):
    copy = built["dir"] / "suid"
    shutil.copy(built["dynamic"], copy)
    copy.chmod(0o4755)
    info = _describe(copy)
    assert info.setuid and not info.setgid
    assert kinds(info) == {"elf64", "dynamic", "setuid"}
    assert children_unseen(info, PRELOAD_64, no_new_privs=False) is True  # AT_SECURE: LD_PRELOAD ignored
    assert children_unseen(info, PRELOAD_64, no_new_privs=True) is False  # execve ignores the bit
    assert children_unseen(info, PRELOAD_64, no_new_privs=None) is None


def test_setgid_without_group_exec_is_not_setgid(built):
    copy = built["dir"] / "sgid-noexec"
    shutil.copy(built["dynamic"], copy)
    copy.chmod(0o2705)  # S_ISGID without S_IXGRP: mandatory-locking mark, execve does not apply it
    assert not _describe(copy).setgid


def test_script_and_its_interpreter(built):
    script = built["dir"] / "script.sh"
    script.write_text(f"#! {built['static']} -x\necho hi\n")
    info = describe_in_root("/", str(script))
    assert (info.format, info.interpreter) == ("script", str(built["static"]))
    assert kinds(info) == {"script"}
    assert info.interpreter_info is not None and info.interpreter_info.linkage == "static"
    assert children_unseen(info, PRELOAD_64, no_new_privs=True) is True  # a static interpreter
    sh = built["dir"] / "sh-script"
    sh.write_text("#!/bin/sh\necho hi\n")
    assert children_unseen(describe_in_root("/", str(sh)), PRELOAD_64, no_new_privs=True) is False


def test_non_elf_and_truncated(built):
    text = built["dir"] / "notes.txt"
    text.write_text("just words\n")
    assert _describe(text).format == "other"
    assert children_unseen(_describe(text), PRELOAD_64, no_new_privs=False) is False
    cut = built["dir"] / "truncated"
    cut.write_bytes(built["dynamic"].read_bytes()[:40])  # inside the 64-byte ELF header
    info = _describe(cut)
    assert (info.format, info.elf_class, info.linkage) == ("elf", 64, None)
    assert info.problem == "truncated ELF header"
    assert kinds(info) == {"elf64", "malformed"}
    assert children_unseen(info, PRELOAD_64, no_new_privs=False) is None  # unknown, not "seen"
    tiny = built["dir"] / "tiny"
    tiny.write_bytes(b"\x7fELF")
    assert _describe(tiny).problem == "truncated ELF identification"


def test_non_regular_files_are_refused(built):
    fifo = built["dir"] / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, built["dir"]):
        fd = open_in_root("/", str(path))  # O_PATH: opening the FIFO neither blocks nor reads it
        try:
            with pytest.raises(NotRegular):
                describe(fd)
        finally:
            os.close(fd)


def test_o_path_fd_is_reopened(built):
    fd = os.open(built["static"], os.O_PATH | os.O_CLOEXEC)
    try:
        assert describe(fd).linkage == "static"
        assert os.fstat(fd)  # borrowed: still open
    finally:
        os.close(fd)


def test_absolute_symlink_resolves_in_the_callers_root(built, tmp_path):
    """Under ``/proc/PID/root``-style roots, an absolute symlink is the caller's, not the server's."""
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy(built["static"], root / "bin" / "tool")
    (root / "link").symlink_to("/bin/tool")  # /bin/tool of the server is something else, or nothing
    info = describe_in_root(str(root), "/link")
    assert info.linkage == "static"


def test_gather_with_no_shim_and_missing_file(built):
    facts = gather(os.getpid(), str(built["dynamic"]), NO_SHIM)
    assert facts.file is not None and facts.children_unseen is True  # an EXEC_WRAPPER shell only
    missing = gather(os.getpid(), str(built["dir"] / "nope"), PRELOAD_64)
    assert (missing.file, missing.children_unseen) == (None, None)
    assert "No such file" in (missing.problem or "")
    assert missing.kinds == {"unknown"}
