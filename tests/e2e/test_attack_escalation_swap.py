"""Attack: an approval for one file escalates another (red team, decisions applied elsewhere).

The escalation server identifies the file of an exec (the wrapper's fd, in the caller's view) and
checks once, when it learns the facts, that the program's path names that same file in its own
view (``same_for_server``). The prompt then waits for a person; after the approval the command is
spawned *by path* (``PreparedExec.command[0]`` = the lexical program path). A path whose
directory the session can write (a symlink ``bin -> /usr/bin`` in the working directory) is
re-pointed while the question is up: the approver is shown "real file /usr/bin/touch, dynamic
elf64", approves once, and the server spawns whatever the path names by then — here a shell
script of the session's, unsandboxed, on the host.

The same into a *sandboxed* escalation (``execution = { network = true }``): a bwrap command
line names the program by path, resolved again inside the new sandbox, and the session's own
script got the network the session does not have (red team E of 2026-12-02).

Safe behaviour: the approved file runs, or nothing does; never the file swapped in.
"""

from __future__ import annotations

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
execution = EXECUTION
justification = "touching files needs a person"
"""


@pytest.mark.parametrize("execution", ['"unsandboxed"', "{ network = true }"])
def test_symlink_repointed_during_the_prompt_escalates_another_file(attacker: Attacker, execution: str) -> None:
    work = attacker.workdir()
    (work / "rules.toml").write_text(RULES.replace("EXECUTION", execution))
    tag = uuid.uuid4().hex[:8]
    outside = Path(f"/tmp/eg-swap-{tag}")  # the host's /tmp: only an escalation reaches it
    pwned = Path(f"/tmp/eg-swap-{tag}-pwned")
    script = (
        f"mkdir evil && printf '#!/bin/sh\\necho EVIL-RAN; id > {pwned}\\n' > evil/touch && chmod +x evil/touch; "
        "ln -s /usr/bin bin; "
        f"(sleep 1; ln -sfn {work}/evil bin.new && mv -T bin.new bin && echo SWAPPED) & "
        f"./bin/touch {outside}; echo status=$?; wait"
    )
    # a person reads the question (real file /usr/bin/touch), then approves once
    out, err, shown = approved_after(attacker, script, 3)
    try:
        assert "real file /usr/bin/touch" in shown, shown  # what the person approved
        assert "SWAPPED" in out, (out, err)
        assert "EVIL-RAN" not in out and not pwned.exists(), (out, err, shown)
    finally:
        for path in (outside, pwned):
            path.unlink(missing_ok=True)
