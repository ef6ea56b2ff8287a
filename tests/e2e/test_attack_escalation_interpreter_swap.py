"""Attack: a ``#!`` script is approved, then its interpreter is swapped during the prompt.

Since 0bc8290 the escalated program is re-opened after the decision and must still be the
identified file — for a ``#!`` script the *script* only. The approver is shown the interpreter
(``#!`` path, one level read), but nothing re-checks it: the kernel resolves the interpreter
path again when the server spawns the script, outside the sandbox. An interpreter inside the
session's own tree is ordinary (a project's ``.venv/bin/python`` shebang): the session replaces
it while the question is up, with a plain shell loop, and the approved script runs under the
session's program, unsandboxed, on the host.

Safe behaviour: the approved script runs under the interpreter the approver was shown, or nothing runs.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from attack_support import Attacker
from execgate.server.sandbox import bwrap_usable

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")]

CLI = (sys.executable, "-m", "execgate.server.cli")

RULES = """
[[rule]]
id = "ask-deploy"
program = "deploy"
decision = "prompt"
execution = "unsandboxed"
justification = "deploying needs a person"
"""


def test_interpreter_swapped_during_the_prompt(attacker: Attacker) -> None:
    work = attacker.workdir()
    (work / "rules.toml").write_text(RULES)
    tag = uuid.uuid4().hex[:8]
    outside = Path(f"/tmp/eg-interp-{tag}")  # the host's /tmp: only an escalation reaches it
    pwned = Path(f"/tmp/eg-interp-{tag}-pwned")
    script = (
        "mkdir -p venv/bin && cp /bin/dash venv/bin/sh && "
        f"printf '#!{work}/venv/bin/sh\\ntouch \"$1\"\\n' > deploy && chmod +x deploy && "
        f"printf '#!/bin/sh\\necho EVIL-RAN; id > {pwned}\\n' > evil && chmod +x evil; "
        "(sleep 1; mv -f evil venv/bin/sh && echo SWAPPED) & "
        f"./deploy {outside}; echo status=$?; wait"
    )
    run = subprocess.Popen(
        attacker.command([*CLI, "run", "-q", "--sandbox", "bwrap", "--rules", str(work / "rules.toml"),
                          "--approver-wait", "30", "--cwd", str(work), "--", script]),
        cwd=work, env=attacker.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    approver = None
    try:
        assert run.stderr is not None
        line = run.stderr.readline()
        prefix = "execgate: approvals: execgate approve "
        assert line.startswith(prefix), line
        words = line[len(prefix):].split()
        approver = subprocess.Popen([*CLI, "approve", "--policy", words[1], "--token-file", words[3],
                                     "--name", "person"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert approver.stdin is not None
        time.sleep(3)  # a person reads the question (a script, interpreter .../venv/bin/sh: dash), approves once
        approver.stdin.write("y\n")
        approver.stdin.flush()
        out, err = run.communicate(timeout=60)
        try:
            shown, _ = approver.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            approver.kill()
            shown, _ = approver.communicate()
    finally:
        for proc in (approver, run):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    try:
        assert f"{work}/deploy" in shown, shown  # what the person approved
        assert "SWAPPED" in out, (out, err)
        assert "EVIL-RAN" not in out and not pwned.exists(), (out, err, shown)
    finally:
        for path in (outside, pwned):
            path.unlink(missing_ok=True)
