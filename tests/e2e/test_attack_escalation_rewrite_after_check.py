"""Attack: the approved file is rewritten after the server's re-open check, before the spawn.

Since 0bc8290 the escalation server re-opens the program after the decision, checks that it is
still the identified file (device, inode, ctime, size: ``reopen_identified``) and executes that
fd (``/proc/self/fd/N``); a ``#!`` script is checked, then run *by path*. But the check happens
before the server sends ``Escalate`` and then **waits for the caller's stdio frame** — a frame the
caller sends whenever it likes. The caller is the session: it speaks the protocol itself (the
inherited ``CODEX_ESCALATE_SOCKET``, the reference client in ``execgate.wrapper.client``), reads
the ``Escalate`` answer, then rewrites the approved file in place (same inode: the fd follows
it) or renames another over the script's path, and only then hands its stdio over. The server
spawns whatever the file holds by then, unsandboxed, on the host.

Safe behaviour: the approved contents run, or nothing does; never the contents written after.
"""

from __future__ import annotations

import shutil
import sys
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

#: Run inside the session: ask for ./tool like the wrapper does, wait for Escalate, then rewrite.
CLIENT = r'''
import os, sys
from execgate.server import protocol as p
from execgate.wrapper import client as c
mode, outside, pwned = sys.argv[1:4]
env = {p.wire_str(k): p.wire_str(v) for k, v in os.environb.items()}
target = c.open_target(b"./tool")
sock = c.connect(env)
resp = c.request_decision(sock, "./tool", ["tool", outside], env, target)
print("ANSWER", resp.action, flush=True)
if resp.action != "Escalate":
    sys.exit(3)
evil = "#!/bin/sh\necho EVIL-RAN; id > %s\n" % pwned
if mode == "inplace":   # same inode: what the server's O_PATH fd names
    with open("tool", "r+b") as f:
        f.write(evil.encode()); f.truncate()
else:                   # a #! script, run by its path after the check
    with open("tool.new", "w") as f:
        f.write(evil)
    os.chmod("tool.new", 0o755)
    os.rename("tool.new", "tool")
print("REWRITTEN", flush=True)
print("status", c.escalate(sock, resp.extensions.get(p.SIGNALS_EXTENSION_FIELD) is True), flush=True)
'''


@pytest.mark.parametrize("mode", ["inplace", "script"])
def test_approved_file_rewritten_after_the_check(attacker: Attacker, mode: str) -> None:
    work = attacker.workdir()
    (work / "rules.toml").write_text(RULES)
    (work / "client.py").write_text(CLIENT)
    tool = work / "tool"
    if mode == "inplace":
        shutil.copy("/usr/bin/touch", tool)  # an ELF: executed by the server's fd
    else:
        tool.write_text("#!/bin/sh\nexec touch \"$@\"\n")
    tool.chmod(0o755)
    shutil.chown(tool, attacker.uid, attacker.gid)
    tag = uuid.uuid4().hex[:8]
    outside = Path(f"/tmp/eg-rw-{tag}")
    pwned = Path(f"/tmp/eg-rw-{tag}-pwned")  # the host's /tmp: only an escalation reaches it
    script = f"{sys.executable} client.py {mode} {outside} {pwned}"
    # a person reads the question about ./tool, then approves once
    out, err, shown = approved_after(attacker, script, 3)
    try:
        assert "ANSWER Escalate" in out, (out, err, shown)  # the person approved ./tool
        assert "REWRITTEN" in out, (out, err)
        assert "EVIL-RAN" not in out and not pwned.exists(), (out, err, shown)
    finally:
        for path in (outside, pwned):
            path.unlink(missing_ok=True)
