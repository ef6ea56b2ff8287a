"""Attack: a session at a terminal answers its own prompt through the user's terminal (issue #12
item 3, docs/DESIGN.md §8).

``execgate run`` runs on a real pty owned by the attacker (the user's login terminal), as root
and as an unprivileged user, with a ``prompt`` rule on a marker program. Inside, in bwrap,
``tests/e2e/data/tty_attack.py`` is told the terminal's path and execgate's pid outright and,
while the marker's prompt is pending, keeps opening every terminal it can name (the path,
``/dev/pts/*``, ``/dev/tty``, ``/dev/console``, ``/proc/PID/fd/0-2``), writing to them and pushing
``y`` + Enter into them with ``TIOCSTI``, its own fds included. Nobody types. The marker must not
run (the prompt ends by its deadline), nothing the session writes may appear on the terminal
while the question is up, and nothing it opened may be the user's terminal.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from attack_support import Attacker
from pty_support import PtyUser

pytestmark = pytest.mark.e2e

ATTACK = Path(__file__).parent / "data" / "tty_attack.py"
PYTHON = os.path.realpath(sys.executable)
QUESTION = "[y] once  [s] for session  [n] deny > "

RULES = """
[[rule]]
id = "ask-marker"
program = "pwned"
decision = "prompt"
execution = "unsandboxed"
justification = "the marker needs a person"
"""


def _script(real_tty: str) -> str:
    return (f"rm -f ready done; {PYTHON} tty_attack.py {real_tty} execgate.pid ready done tty-attack.log & "
            "i=0; while [ ! -e ready ] && [ $i -lt 400 ]; do sleep 0.1; i=$((i+1)); done; "
            './pwned; echo "pwned=$?"; touch done; wait; echo finished')


def test_session_cannot_answer_its_prompt_through_the_terminal(attacker: Attacker) -> None:
    work = attacker.workdir()
    attacker.marker_program(work, "pwned")
    # Run from the working directory: CI copies the repository under the host's /tmp, which the
    # sandbox hides.
    shutil.copy(ATTACK, work / "tty_attack.py")
    rules = work / "rules.toml"
    rules.write_text(RULES)
    user = PtyUser(owner=(attacker.uid, attacker.gid))
    user.start([sys.executable, "-m", "execgate.server.cli", "run", "--sandbox", "bwrap", "--rules", str(rules),
                "--approval-timeout", "8", "--cwd", str(work), "--", _script(user.slave_path)],
               cwd=str(work), env=attacker.env(), wrap=attacker.command)
    assert user.proc is not None
    pidfile = work / "execgate.pid"  # told outright: the attacker could guess it anyway
    pidfile.write_text(str(user.proc.pid))
    os.chown(pidfile, attacker.uid, attacker.gid)
    try:
        user.expect(r"pwned=\d", timeout=90)
        status = user.wait()
    finally:
        user.close()
    text = user.text()
    assert status == 0, text
    assert not attacker.marker_ran("pwned"), text
    assert "pwned=1" in text and "MARKER pwned RAN" not in text, text
    # The question was asked, and ended by its deadline: nobody answered it.
    asked, _, rest = text.partition(QUESTION)
    assert rest, text
    held, sep, _ = rest.partition("no answer in time: denied")
    assert sep, text
    assert "EG-ATTACK" not in held and "y" not in held.strip(), held
    # The attack was real: it ran before and after, its own writes reached its own pty.
    assert "EG-ATTACK-WRITE" in asked + rest
    records = json.loads((work / "tty-attack.log").read_text())
    real = user.slave_stat
    opened = [r for r in records.values() if r.get("opened")]
    assert opened, records  # its own /dev/tty, /dev/console at least
    theirs = (real.st_dev, real.st_rdev, real.st_ino)
    assert not [r for r in opened if (r.get("dev"), r.get("rdev"), r.get("ino")) == theirs], records
    assert not records[user.slave_path].get("opened"), records
