"""The server's identification of an exec's file in the caller's view (execgate.server.identity):
facts from the very fd, symlinks resolved from the caller's root, /proc and /dev never trusted."""

from __future__ import annotations

import os
from pathlib import Path

from execgate.server.identity import identify
from execgate.policy_service.rules import RuleSet
from execgate.server.policy import ExecFacts, FileIdentity

ME = os.getpid()
NOBODY = 65534
GIT = os.path.realpath("/usr/bin/env")


def test_system_file_by_path_for_an_unprivileged_caller() -> None:
    facts = identify("/usr/bin/env", pid=ME, uid=NOBODY)
    st = os.stat("/usr/bin/env")
    assert facts is not None and facts.source == "path"
    assert (facts.device, facts.inode, facts.uid) == (st.st_dev, st.st_ino, 0)
    assert facts.real_path == GIT and facts.root_dir_chain and not facts.caller_can_modify
    assert not facts.pseudo_fs and facts.same_for_server


def test_root_caller_can_modify_what_lies_on_a_read_write_mount() -> None:
    facts = identify("/usr/bin/env", pid=ME, uid=0)
    writable = not os.statvfs("/usr/bin").f_flag & os.ST_RDONLY
    assert facts is not None and facts.caller_can_modify == writable


def test_fd_names_the_real_file_whatever_the_path(tmp_path: Path) -> None:
    fd = os.open("/usr/bin/env", os.O_PATH | os.O_CLOEXEC)
    try:
        facts = identify(f"/dev/fd/{fd}", pid=ME, uid=NOBODY, fd=fd)
    finally:
        os.close(fd)
    # /dev/fd/N cannot be resolved in the caller's view (it goes through /proc): the fd's own name.
    assert facts is not None and facts.source == "fd" and os.path.basename(facts.real_path) == os.path.basename(GIT)
    assert facts.pseudo_fs and not facts.root_dir_chain and facts.caller_can_modify


def test_symlink_resolved_and_its_directory_counted(tmp_path: Path) -> None:
    link = tmp_path / "innocent"
    link.symlink_to("/usr/bin/env")
    facts = identify(str(link), pid=ME, uid=NOBODY)
    assert facts is not None and facts.real_path == GIT
    # The link's own directory (/tmp/…, others may write /tmp) could retarget it: no trust.
    assert not facts.root_dir_chain and facts.caller_can_modify


def test_path_changed_since_the_fd_was_opened(tmp_path: Path) -> None:
    prog = tmp_path / "prog"
    prog.write_text("#!/bin/sh\n")
    fd = os.open(prog, os.O_PATH | os.O_CLOEXEC)
    try:
        prog.unlink()
        prog.write_text("#!/bin/sh\necho other\n")
        facts = identify(str(prog), pid=ME, uid=NOBODY, fd=fd)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    assert facts is not None and facts.inode == st.st_ino
    assert not facts.same_for_server and facts.caller_can_modify and not facts.root_dir_chain


def test_absolute_symlinks_resolve_from_the_callers_root(tmp_path: Path) -> None:
    # A chain of absolute and relative links and "..": resolved by hand, never above the root.
    (tmp_path / "a").symlink_to("/usr/../usr/bin")
    facts = identify(str(tmp_path / "a" / "env"), pid=ME, uid=NOBODY)
    assert facts is not None and facts.real_path == GIT
    assert identify("/../../usr/bin/env", pid=ME, uid=NOBODY).real_path == GIT


def test_unresolvable_without_fd_is_no_identity() -> None:
    assert identify("/nonexistent/x", pid=ME, uid=NOBODY) is None
    assert identify("/proc/self/exe", pid=ME, uid=NOBODY) is None
    assert identify("/usr/bin/env", pid=2**22 + 12345, uid=NOBODY) is None  # no such caller


def test_rules_trust_only_what_the_facts_show(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text('[[rule]]\nprogram = "env"\ndecision = "escalate"\n'
                                     '[[rule]]\nprogram = "sudo"\ndecision = "deny"\n')
    rules = RuleSet.load([tmp_path / "r.toml"])
    good = identify("/usr/bin/env", pid=ME, uid=NOBODY)
    assert rules.evaluate("/usr/bin/env", ["env"], ExecFacts(identity=good)).decision == "escalate"
    assert rules.evaluate("/usr/bin/env", ["env"], None).decision == "run"  # no facts: no trust
    as_root = identify("/usr/bin/env", pid=ME, uid=0)
    assert rules.evaluate("/usr/bin/env", ["env"], ExecFacts(identity=as_root)).decision == ("run" if as_root.caller_can_modify else "escalate")
    dev = FileIdentity(**{**{f: getattr(good, f) for f in good.__slots__}, "real_path": "/dev/env"})
    assert rules.evaluate("/dev/env", ["env"], ExecFacts(identity=dev)).decision == "run"  # /dev is never trusted
    # Restrictive rules follow the real file's name: /dev/fd/3 of sudo is denied.
    fd_sudo = FileIdentity(**{**{f: getattr(good, f) for f in good.__slots__}, "real_path": "/usr/bin/sudo"})
    assert rules.evaluate("/dev/fd/3", ["x"], ExecFacts(identity=fd_sudo)).decision == "deny"


def test_status_holds_root_for_any_root_uid_or_any_capability() -> None:
    """SO_PEERCRED and the effective uid are not who the caller can become: a saved uid of 0,
    or a capability kept across setresuid (PR_SET_KEEPCAPS), is root's power."""
    from execgate.server.identity import status_ids

    def status_holds_root(text: bytes) -> bool:
        return status_ids(text).holds_root

    def status(uids: str, prm: str = "0000000000000000", eff: str = "0000000000000000") -> bytes:
        return f"Name:\tx\nUid:\t{uids}\nGid:\t0\t0\t0\t0\nCapPrm:\t{prm}\nCapEff:\t{eff}\n".encode()

    assert not status_holds_root(status("1000\t1000\t1000\t1000"))
    assert status_holds_root(status("65534\t65534\t0\t65534"))  # saved uid 0: seteuid(0) at will
    assert status_holds_root(status("0\t65534\t65534\t65534"))
    assert status_holds_root(status("65534\t65534\t65534\t65534", prm="000000000000008a"))  # kept CAP_SETUID…
    assert status_holds_root(status("65534\t65534\t65534\t65534", eff="0000000000000001"))
    assert status_holds_root(b"Name:\tx\n")  # unreadable: judged as root
    ids = status_ids(status("0\t65534\t65534\t65534") + b"Tgid:\t7\nPPid:\t3\n")
    assert (ids.tgid, ids.ppid, ids.euid, ids.holds_root) == (7, 3, 65534, True)
