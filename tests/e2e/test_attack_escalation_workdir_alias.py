"""Attack (red team C): an escalated command named, in the request, by a symlink to the directory
it runs in — the policy, the audit log and an approver see a path in the project, the command runs
somewhere else (README ``--sandbox``: "an escalated command starts in the caller's own working
directory, opened from ``/proc/PID/cwd``: a request naming another directory (through a symlink,
or forged) is refused"; server/identity.py ``caller_directory``).

``caller_directory`` compares the caller's cwd with ``os.stat(workdir)`` — which follows
symlinks. The session makes ``build -> /`` in its working directory, ``cd /`` (the sandbox's
read-only root: the host's ``/``, same device and inode), and sends its own request (the Python
wrapper, ``os.getcwdb`` patched) naming ``WORK/build`` as its workdir: same inode, accepted. The
unsandboxed ``ls`` runs in the host's ``/`` and lists it; the audit record (and a prompt's
``cwd:`` line, and any rule or approver that judges the directory) says ``WORK/build``.

Seen on e7e61ec: ``forged=0``, ``ls`` printed ``etc`` and ``proc`` (the host root's), the audit
record's workdir is ``WORK/build``. The escalation must be refused, or be recorded (and shown) with
the directory it really runs in.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from attack_support import Attacker

pytestmark = pytest.mark.e2e

LS = shutil.which("ls") or "/usr/bin/ls"

RULES = f"""
[[rule]]
id = "ls-outside"
program = "{LS}"
decision = "escalate"
execution = "unsandboxed"
justification = "stands for any escalated command that works in its working directory"
"""

FORGE = ("import os, sys; fake = sys.argv[1].encode(); os.getcwdb = lambda: fake; "
         "from execgate.wrapper.client import main; sys.argv = ['wrapper'] + sys.argv[2:]; sys.exit(main())")


def test_a_symlink_cannot_name_the_directory_an_escalation_runs_in(attacker: Attacker) -> None:
    work = attacker.workdir()
    rules = work / "rules.toml"
    rules.write_text(RULES)
    audit = work / "logs" / "audit.jsonl"
    audit.parent.mkdir()
    audit.parent.chmod(0o777)
    script = (f"ln -s / build && cd / && {sys.executable} -c \"{FORGE}\" {work}/build {LS} ls -d etc proc; "
              "echo \"forged=$?\"")
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--rules", str(rules), "--audit-log", str(audit),
                             "--cwd", str(work), "--", script, cwd=work)
    out = done.stdout + done.stderr
    records = [json.loads(line) for line in audit.read_text().splitlines() if line.strip()]
    escalated = [r for r in records if r.get("program") == LS and r.get("decision") == "escalate"]
    assert escalated, out
    if "forged=0" not in done.stdout:
        return  # refused: safe
    for record in escalated:
        assert os.path.realpath(record["workdir"]) == record["workdir"], (
            f"the escalated ls ran in {os.path.realpath(record['workdir'])} (it listed: "
            f"{done.stdout.split()[:2]}), recorded and judged as working in {record['workdir']}:\n{out}")
