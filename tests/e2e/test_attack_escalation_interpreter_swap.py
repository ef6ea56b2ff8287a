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

import uuid
from pathlib import Path

import pytest

from attack_support import Attacker, approved_after

pytestmark = pytest.mark.e2e

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
    # a person reads the question (a script, interpreter .../venv/bin/sh: dash), approves once
    out, err, shown = approved_after(attacker, script, 3)
    try:
        assert f"{work}/deploy" in shown, shown  # what the person approved
        assert "SWAPPED" in out, (out, err)
        assert "EVIL-RAN" not in out and not pwned.exists(), (out, err, shown)
    finally:
        for path in (outside, pwned):
            path.unlink(missing_ok=True)
