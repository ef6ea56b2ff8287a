"""``execgate run`` at a terminal and with piped stdin (issue #12 items 3 and 4).

A real pty plays the user's terminal (tests/e2e/pty_support.py): execgate runs with its slave as
stdin, stdout, stderr and controlling terminal, as from a login shell. Checked: piped stdin
reaches the script; at a terminal the script gets a pty of its own (another device) that input
typed at the terminal reaches; a ``prompt`` rule is asked at the terminal, showing program, argv,
cwd and the environment that will reach the command, and ``y`` runs it while ``n`` + reason
denies it with that reason; the terminal's modes are restored after a normal run, a
``--timeout`` and a SIGTERM; without a sandbox prompts stay denied.
"""

from __future__ import annotations

import os
import signal
import subprocess
import termios
from pathlib import Path

import pytest

from pty_support import PtyUser
from run_support import CLI, execgate

pytestmark = pytest.mark.e2e

RULES = """
[[rule]]
id = "ask-marker"
program = "marker"
decision = "prompt"
execution = "unsandboxed"
justification = "the marker needs a person"
allow_env = ["EG_SHOWN"]
"""


def _marker(work: Path) -> None:
    """``work/marker NAME`` writes ``work/ran-NAME`` (outside any sandbox only if escalated)."""
    path = work / "marker"
    path.write_text(f'#!/bin/sh\necho ran > "{work}/ran-$1"\necho "MARKER $1 RAN"\n')
    path.chmod(0o755)


def _at_terminal(work: Path, *args: str) -> PtyUser:
    return PtyUser().start([*CLI, "run", "--cwd", str(work), *args], cwd=str(work))


def test_piped_stdin_reaches_the_script(tmp_path: Path) -> None:
    """(a) ``echo x | execgate run -- cat`` prints x (before: nothing, stdin was /dev/null)."""
    done = execgate("run", "-q", "--cwd", str(tmp_path), "--", "cat", stdin="x\n", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "x\n"
    # An escalated command gets the wrapper's fds, hence the same stdin.
    both = execgate("run", "-q", "--cwd", str(tmp_path), "--", "read -r a; echo first=$a; cat", stdin="1\n2\n",
                    cwd=tmp_path)
    assert both.stdout == "first=1\n2\n", both.stderr


def test_script_gets_a_pty_of_its_own_and_typed_input(tmp_path: Path) -> None:
    """(b) at a terminal: the shell's stdin is a terminal, another one than the user's, and it
    is the shell's controlling terminal; a line typed at the user's terminal reaches ``read``."""
    user = _at_terminal(tmp_path, "--", 'tty; stat -L -c "dev=%t:%T" /dev/stdin; '
                        '{ : </dev/tty; } 2>/dev/null && echo ctty=yes; read -r line; echo "got=$line"')
    try:
        found = user.expect(rb"dev=([0-9a-f]+):([0-9a-f]+)")
        real = user.slave_stat.st_rdev
        assert (int(found[1], 16), int(found[2], 16)) != (os.major(real), os.minor(real)), user.text()
        user.expect("ctty=yes")
        user.type("hello there\r")
        user.expect("got=hello there")
        assert user.wait() == 0, user.text()
        assert "not a tty" not in user.text()
    finally:
        user.close()


def test_prompt_is_asked_at_the_terminal(tmp_path: Path) -> None:
    """(c) y runs the command; n + a reason denies it, the reason on the script's stderr."""
    _marker(tmp_path)
    (tmp_path / "rules.toml").write_text(RULES)
    script = ('EG_SHOWN=visible ./marker one; echo "one=$?"; '
              './marker two 2> err.txt; echo "two=$?"')
    user = _at_terminal(tmp_path, "--rules", str(tmp_path / "rules.toml"), "--approval-timeout", "60", "--", script)
    try:
        user.expect(r"\[y\] once  \[s\] for session  \[n\] deny > ")
        question = user.text()
        assert f"program: {tmp_path}/marker" in question
        assert "argv:    ./marker one" in question
        assert f"cwd:     {tmp_path}" in question
        assert "EG_SHOWN=visible" in question and "PATH=" in question
        user.type("y\r")
        user.expect("one=0")
        user.expect(r"argv:    ./marker two[\s\S]*deny > ")
        user.type("n\r")
        user.expect(r"reason \(optional\) > ")
        user.type("not on a friday\r")
        user.expect("two=1")
        assert user.wait() == 0, user.text()
    finally:
        user.close()
    assert (tmp_path / "ran-one").exists()
    assert not (tmp_path / "ran-two").exists()
    assert "Execution denied: not on a friday" in (tmp_path / "err.txt").read_text()


def test_at_a_terminal_with_approver_wait_an_external_approver_answers(short_tmp: Path) -> None:
    """--approver-wait at a terminal: the `execgate approve` command printed there answers the
    prompt that the terminal is asking too; the terminal's question then ends."""
    work = short_tmp / "work"
    work.mkdir()
    _marker(work)
    (work / "rules.toml").write_text(RULES)
    user = _at_terminal(work, "--rules", str(work / "rules.toml"), "--approver-wait", "30", "--",
                        './marker one; echo "one=$?"; read -r x')  # the script waits for the user
    try:
        found = user.expect(r"execgate: approvals: execgate approve --policy (\S+) --token-file (\S+)\r\n")
        user.expect(r"\[y\] once  \[s\] for session  \[n\] deny > ")
        approve = subprocess.run([*CLI, "approve", "--policy", found[1].decode(), "--token-file", found[2].decode(),
                                  "--name", "elsewhere"], input="y\n", capture_output=True, text=True, timeout=60)
        assert "sent" in approve.stdout, approve.stdout + approve.stderr
        user.expect("answered elsewhere")
        user.expect("one=0")
        user.type("\r")
        assert user.wait() == 0, user.text()
    finally:
        user.close()
    assert (work / "ran-one").exists()


def test_no_sandbox_at_a_terminal_still_denies_prompts(tmp_path: Path) -> None:
    """--sandbox none: the shell could reach any approver of this process; no question is asked."""
    _marker(tmp_path)
    (tmp_path / "rules.toml").write_text(RULES)
    user = _at_terminal(tmp_path, "--sandbox", "none", "--rules", str(tmp_path / "rules.toml"), "--",
                        './marker one; echo "one=$?"')
    try:
        user.expect("one=1")
        assert user.wait() == 0
    finally:
        user.close()
    assert "without a sandbox (--sandbox none)" in user.text()
    assert "[y] once" not in user.text()
    assert not (tmp_path / "ran-one").exists()


def _raw_meanwhile(user: PtyUser) -> None:
    """The terminal is raw while the script runs (so restoring it below is a real check)."""
    lflag = user.modes()[3]
    assert not lflag & (termios.ICANON | termios.ECHO), "the terminal was not put in raw mode"


@pytest.mark.parametrize("ending", ["exit", "timeout", "sigterm"])
def test_terminal_modes_are_restored(tmp_path: Path, ending: str) -> None:
    """(e) after a run, a --timeout and a SIGTERM the terminal has exactly its modes of before."""
    args = ["--timeout", "3"] if ending == "timeout" else []
    script = "echo started; read -r x" if ending == "exit" else "echo started; sleep 120"
    user = _at_terminal(tmp_path, *args, "--", script)
    try:
        before = user.modes_before
        user.expect("started")
        _raw_meanwhile(user)
        if ending == "exit":
            user.type("bye\r")
        elif ending == "sigterm":
            user.proc.send_signal(signal.SIGTERM)
        status = user.wait()
        assert status == {"exit": 0, "timeout": 124, "sigterm": 128 + signal.SIGTERM}[ending], user.text()
        assert user.modes() == before
    finally:
        user.close()


def test_json_at_a_terminal_never_hands_over_the_terminal(tmp_path: Path) -> None:
    """--json captures the output, so there is no pty: the script's stdin is /dev/null, never the
    user's terminal."""
    user = _at_terminal(tmp_path, "--json", "--", "readlink /proc/self/fd/0")
    try:
        user.expect(r'"exit_code": 0')
        assert user.wait() == 0
    finally:
        user.close()
    assert '"stdout": "/dev/null\\n"' in user.text(), user.text()
