"""Attack: an escalation whose file was never identified is never pinned (red team E2).

``_escalate`` checks the approved file right before it starts (``_pinned``) only when the
decision's facts carry an identity. A caller that speaks the protocol itself decides whether
they do: it sends no target fd and names the program through a missing directory and ``..``
(``missing/../bin/touch``). The server normalises that to ``bin/touch`` for the policy, but the
kernel's own resolution of the path as named fails (``missing`` does not exist), so
``exec_facts.gather`` sets identity and file info to None: "the file that would run is unknown".
A prompt rule (restrictive rules need no trust) still asks a person about ``/…/bin/touch`` and
the escalation then spawns *by path*, unchecked — ``bin`` (a symlink to ``/usr/bin``) re-pointed
after the Escalate answer, or a program replaced outright, runs instead, unsandboxed, on the host.

Safe behaviour: an escalation of a file that was not identified is refused (or pinned like any
other); never a file swapped in after the answer.
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
id = "ask-touch"
program = "touch"
decision = "prompt"
execution = "unsandboxed"
justification = "touching files needs a person"
"""

#: Run inside the session: ask for missing/../bin/touch without a target fd, swap after Escalate.
CLIENT = r'''
import os, sys
from execgate.server import protocol as p
from execgate.wrapper import client as c
mode, outside, pwned = sys.argv[1:4]
env = {p.wire_str(k): p.wire_str(v) for k, v in os.environb.items()}
sock = c.connect(env)
resp = c.request_decision(sock, "missing/../bin/touch", ["touch", outside], env, None)
print("ANSWER", resp.action, flush=True)
if resp.action != "Escalate":
    sys.exit(3)
os.mkdir("evil")
with open("evil/touch", "w") as f:
    f.write("#!/bin/sh\necho EVIL-RAN; id > %s\n" % pwned)
os.chmod("evil/touch", 0o755)
if mode == "symlink":    # bin -> /usr/bin, re-pointed at the session's own directory
    os.symlink(os.path.abspath("evil"), "bin.new")
    os.rename("bin.new", "bin")
else:                    # bin/touch an ELF of the session's, replaced by a script (another inode, kind)
    os.rename("evil/touch", "bin/touch")
print("SWAPPED", flush=True)
print("status", c.escalate(sock, resp.extensions.get(p.SIGNALS_EXTENSION_FIELD) is True), flush=True)
'''


@pytest.mark.parametrize("mode", ["symlink", "replace"])
def test_unidentified_escalation_is_not_pinned(attacker: Attacker, mode: str) -> None:
    work = attacker.workdir()
    (work / "rules.toml").write_text(RULES)
    (work / "client.py").write_text(CLIENT)
    if mode == "symlink":
        (work / "bin").symlink_to("/usr/bin")
    else:
        (work / "bin").mkdir()
        shutil.copy("/usr/bin/touch", work / "bin" / "touch")
        shutil.chown(work / "bin" / "touch", attacker.uid, attacker.gid)
        shutil.chown(work / "bin", attacker.uid, attacker.gid)
    tag = uuid.uuid4().hex[:8]
    outside = Path(f"/tmp/eg-unid-{tag}")
    pwned = Path(f"/tmp/eg-unid-{tag}-pwned")  # the host's /tmp: only an escalation reaches it
    script = f"{sys.executable} client.py {mode} {outside} {pwned}"
    # a person reads the question about .../bin/touch, then approves once
    out, err, shown = approved_after(attacker, script, 3)
    try:
        print(shown)
        if "ANSWER Escalate" in out:  # approved: what runs must be the file asked about, or nothing
            assert "SWAPPED" in out, (out, err)
        assert "EVIL-RAN" not in out and not pwned.exists(), (out, err, shown)
    finally:
        for path in (outside, pwned):
            path.unlink(missing_ok=True)
