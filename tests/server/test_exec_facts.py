"""One object for what the server learns of an exec's file (execgate.server.exec_facts.gather):
the identity and the file info are of the same file — the wrapper's fd when it sent one, else the
one walk of the path in the caller's view — both cross the wire together (ExecTarget 20, 30-32),
and the service's approvers see and grant by both."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from pathlib import Path

from execgate.policy_service.approvals import ApprovalBroker
from execgate.policy_service.approver import file_text
from execgate.server import policy_codec as codec
from execgate.server.exec_facts import Coverage, gather, learn
from execgate.server.policy import NO_FACTS, Execution, SessionContext
from execgate.v1 import approvals_pb2 as apb
from identity_support import system_facts

ME = os.getpid()
NOBODY = 65534
PRELOAD_64 = Coverage(seccomp=False, preload_abis=frozenset({(64, 62)}))


def _script(path: Path, interpreter: str) -> Path:
    path.write_text(f"#!{interpreter}\necho hi\n")
    path.chmod(0o755)
    return path


def test_by_path_one_walk_gives_identity_and_file_info() -> None:
    facts = gather(ME, "/usr/bin/env", PRELOAD_64, uid=NOBODY)
    st = os.stat("/usr/bin/env")
    assert facts.identity is not None and facts.identity.source == "path"
    assert (facts.identity.device, facts.identity.inode) == (st.st_dev, st.st_ino)
    assert facts.file is not None and facts.file.format == "elf" and facts.problem is None


def test_file_info_is_read_from_the_wrappers_fd_not_the_path(tmp_path: Path) -> None:
    """The path names a script now; the fd (what will run) is an ELF: both parts describe the fd."""
    path = _script(tmp_path / "tool", "/bin/sh")
    fd = os.open("/usr/bin/env", os.O_PATH | os.O_CLOEXEC)
    try:
        facts = gather(ME, str(path), PRELOAD_64, uid=NOBODY, fd=fd)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    assert facts.identity is not None and facts.identity.source == "fd"
    assert (facts.identity.device, facts.identity.inode) == (st.st_dev, st.st_ino)
    assert not facts.identity.root_dir_chain and facts.identity.caller_can_modify  # path disagreed
    assert facts.file is not None and facts.file.format == "elf"  # not the script at the path


def test_script_interpreter_is_resolved_by_the_same_walk(tmp_path: Path) -> None:
    link = tmp_path / "sh-link"
    link.symlink_to(shutil.which("sh") or "/bin/sh")
    facts = gather(ME, str(_script(tmp_path / "s", str(link))), PRELOAD_64, uid=NOBODY)
    assert facts.file is not None and facts.file.format == "script"
    assert facts.file.interpreter_info is not None and facts.file.interpreter_info.format == "elf"


def test_no_uid_no_identity_and_missing_file() -> None:
    assert gather(ME, "/usr/bin/env", PRELOAD_64).identity is None  # caller unknown: nothing trusted
    missing = gather(ME, "/nonexistent/tool", PRELOAD_64, uid=NOBODY)
    assert (missing.identity, missing.file) == (None, None) and "No such file" in (missing.problem or "")
    via_proc = gather(ME, "/proc/self/exe", PRELOAD_64, uid=NOBODY)  # never walked through /proc
    assert via_proc.identity is None and via_proc.file is None


def test_both_parts_cross_the_wire_together() -> None:
    facts = gather(ME, "/usr/bin/env", PRELOAD_64, uid=NOBODY)
    target = codec.target_to_pb("/usr/bin/env", ["env"], "/tmp", facts)
    assert target.HasField("identity") and target.HasField("file")
    assert codec.facts_from_pb(target) == facts
    bare = codec.target_to_pb("/usr/bin/env", ["env"], "/tmp")
    assert codec.facts_from_pb(bare) is NO_FACTS


def test_learn_owns_and_closes_the_fd() -> None:
    fd = os.open("/usr/bin/env", os.O_PATH | os.O_CLOEXEC)
    facts = asyncio.run(learn(ME, "/usr/bin/env", PRELOAD_64, uid=NOBODY, fd=fd))
    assert facts.identity is not None and facts.identity.source == "fd" and stat.S_ISREG(facts.identity.mode)
    try:  # closed by learn's worker (the number may have been reused since, but not for env)
        still = os.readlink(f"/proc/self/fd/{fd}") == os.path.realpath("/usr/bin/env")
    except OSError:
        still = False
    assert not still


def test_a_session_grant_covers_that_very_file_only() -> None:
    """Approved for the session, the same command of another file (another inode at the path) asks again."""

    session = SessionContext("s-grant", {})
    kw = {"rule_id": "tool-prompt", "reason": "asks", "execution": Execution("unsandboxed")}
    first, swapped = system_facts("/w/tool", inode=1), system_facts("/w/tool", inode=2)

    async def scenario() -> tuple[bool, bool, bool]:
        broker = ApprovalBroker(timeout_s=5)
        async with broker.subscribe() as queue:
            asking = asyncio.ensure_future(broker.request(session, "/w/tool", ["tool"], "/w", facts=first, **kw))
            await broker.resolve((await queue.get()).request_id, "session", approver="alice")
            approved = (await asking).approved
            again = (await broker.request(session, "/w/tool", ["tool"], "/w", facts=first, **kw)).result == "granted"
            other = asyncio.ensure_future(broker.request(session, "/w/tool", ["tool"], "/w", facts=swapped, **kw))
            asked = (await asyncio.wait_for(queue.get(), 5)) is not None
            other.cancel()
        return approved, again, asked

    assert asyncio.run(scenario()) == (True, True, True)


def test_approvers_see_the_real_file_when_it_is_not_the_path() -> None:

    facts = system_facts("/tmp/x", real_path="/usr/bin/sudo")
    pending = apb.PendingApproval(request_id="r", target=codec.target_to_pb("/tmp/x", ["x"], "/w", facts))
    assert file_text(pending).endswith("; real file /usr/bin/sudo")
    same = apb.PendingApproval(request_id="s", target=codec.target_to_pb("/usr/bin/env", ["env"], "/w",
                                                                         system_facts("/usr/bin/env")))
    assert "real file" not in file_text(same) and "nothing learnt" not in file_text(same)
