"""Attack: a *sandboxed* escalation (``execution = { network = true }``) runs another program than the approved one.

0bc8290 re-opens the approved program and runs it by fd — only where ``command[0]`` is the
program: an escalation into a permissions profile is a bwrap command line, which names the
program by path, resolved again inside the new sandbox when it starts. The session re-points a
symlinked directory (``bin -> /usr/bin``) while the question is up: the approver is shown
/usr/bin/touch, approves once, and the session's own script runs with the network the session
does not have.

Safe behaviour: the approved file runs, or nothing does; never the file swapped in.
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
id = "ask-touch"
program = "touch"
decision = "prompt"
execution = { network = true }
justification = "touching files needs a person"
"""


def test_sandboxed_escalation_path_repointed_during_the_prompt(attacker: Attacker) -> None:
    work = attacker.workdir()
    (work / "rules.toml").write_text(RULES)
    tag = uuid.uuid4().hex[:8]
    outside = Path(f"/tmp/eg-swap-{tag}")  # the host's /tmp: only an escalation reaches it
    pwned = Path(f"/tmp/eg-swap-{tag}-pwned")
    script = (
        f"mkdir evil && printf '#!/bin/sh\\necho EVIL-RAN; cat /proc/net/dev | grep -c : \\n' > evil/touch && chmod +x evil/touch; "
        "ln -s /usr/bin bin; "
        f"(sleep 1; ln -sfn {work}/evil bin.new && mv -T bin.new bin && echo SWAPPED) & "
        f"./bin/touch {outside}; echo status=$?; wait"
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
        time.sleep(3)  # a person reads the question (real file /usr/bin/touch), then approves once
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
        assert "real file /usr/bin/touch" in shown, shown  # what the person approved
        assert "SWAPPED" in out, (out, err)
        assert "EVIL-RAN" not in out and not pwned.exists(), (out, err, shown)
    finally:
        for path in (outside, pwned):
            path.unlink(missing_ok=True)
