"""A person at a terminal, for end-to-end tests: a real pty whose slave is a program's stdin,
stdout, stderr and controlling terminal, and whose master the test reads and types into.

The program starts as the leader of a new session (``setsid``) and takes the slave as its
controlling terminal with ``TIOCSCTTY`` (tty_ioctl(4)) before it execs, exactly as a login shell's
terminal is set up (login_tty(3)).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import termios
import time
from typing import Callable, Mapping, Sequence

#: Runs ``argv[1:]`` with fd 0 made the controlling terminal of its (new) session.
_CTTY = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
         "os.execvp(sys.argv[1], sys.argv[1:])")


class PtyUser:
    """A fresh pty; :meth:`start` runs a program on it, and the test plays the user at it.

    Args:
        owner: ``(uid, gid)`` to own the terminal (a login terminal belongs to its user).
        rows, cols: its window size.

    Attributes:
        output: everything read from the terminal so far (bytes).
        slave_path: the terminal's name (``/dev/pts/N``), known before anything runs on it.
        slave_stat: its ``os.stat_result`` (device, inode, st_rdev).
        modes_before: its termios attributes before the program started.
        proc: the program (its pid is the program's own: the set-up step execs it).
    """

    def __init__(self, *, owner: tuple[int, int] | None = None, rows: int = 30, cols: int = 100) -> None:
        import fcntl
        import struct

        self.master, self._slave = os.openpty()
        self.slave_path = os.ttyname(self._slave)
        self.slave_stat = os.fstat(self._slave)
        if owner is not None:
            os.fchown(self._slave, *owner)
        fcntl.ioctl(self._slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.modes_before = termios.tcgetattr(self._slave)
        os.set_blocking(self.master, False)
        self.output = b""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
              wrap: Callable[[list[str]], list[str]] | None = None) -> PtyUser:
        """Run ``argv`` with the terminal as its stdio and controlling terminal; ``wrap`` turns
        the full argv into the one spawned (e.g. :meth:`Attacker.command`). Returns self."""
        full = [sys.executable, "-c", _CTTY, *argv]
        self.proc = subprocess.Popen(wrap(full) if wrap else full, stdin=self._slave, stdout=self._slave,
                                     stderr=self._slave, env=None if env is None else dict(env), cwd=cwd,
                                     start_new_session=True)
        return self

    def modes(self) -> list:
        """The terminal's termios attributes now."""
        return termios.tcgetattr(self._slave)

    def _read(self, wait_s: float) -> None:
        import select

        ready, _, _ = select.select([self.master], [], [], wait_s)
        if ready:
            try:
                self.output += os.read(self.master, 65536)
            except OSError:
                pass

    def expect(self, pattern: bytes | str, timeout: float = 60) -> re.Match[bytes]:
        """Read until ``pattern`` (a regular expression) appears in :attr:`output`.

        Raises:
            AssertionError: not seen within ``timeout`` seconds (the output so far is shown).
        """
        regex = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.output)
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not seen in {timeout} s; terminal so far:\n"
                                     + self.output.decode(errors="replace"))
            self._read(0.1)

    def type(self, text: str | bytes) -> None:
        """Type ``text`` at the terminal."""
        os.write(self.master, text.encode() if isinstance(text, str) else text)

    def wait(self, timeout: float = 90) -> int:
        """Wait for the program to exit (reading its output meanwhile); its status."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError("the program did not exit; terminal so far:\n"
                                     + self.output.decode(errors="replace"))
            self._read(0.1)
        for _ in range(20):  # what it wrote last
            before = len(self.output)
            self._read(0.05)
            if len(self.output) == before:
                break
        return self.proc.returncode

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.master, self._slave):
            try:
                os.close(fd)
            except OSError:
                pass


#: Rules that ask at the terminal before ``find`` runs, unsandboxed (what a session's fake
#: question imitates in the attack tests).
PROMPT_FIND_RULES = """
[[rule]]
id = "ask-find"
program = "find"
decision = "prompt"
execution = "unsandboxed"
justification = "x"
"""

#: The line an approval question ends with (policy_service/terminal_approver.py).
QUESTION = "[y] once  [s] for session  [n] deny > "


def deny_at_the_prompt(attacker, rules: str, script: str, *, reason: str, questions: int = 1, rows: int = 30,
                       cols: int = 100) -> bytes:
    """``execgate run --sandbox bwrap`` of ``script`` as ``attacker`` (tests/attack_support.py) at
    a terminal of ``rows`` × ``cols``, with ``rules`` (text) as its rules, where ``script`` ends by
    echoing ``find=$?``: the ``questions``-th question line on the wire (the ones before it are
    the session's fakes) is answered ``n`` with ``reason``. Asserts that the run exits 0; returns
    everything the terminal received."""
    work = attacker.workdir()
    (work / "rules.toml").write_text(rules)
    user = PtyUser(owner=(attacker.uid, attacker.gid), rows=rows, cols=cols)
    user.start([sys.executable, "-m", "execgate.server.cli", "run", "--sandbox", "bwrap", "--rules",
                str(work / "rules.toml"), "--approval-timeout", "60", "--cwd", str(work), "--", script],
               cwd=str(work), env=attacker.env(), wrap=attacker.command)
    try:
        user.expect(r"(?s:.*)".join([re.escape(QUESTION)] * questions), timeout=90)
        user.type("n\r")
        user.expect(r"reason \(optional\) > ", timeout=30)
        user.type(reason + "\r")
        user.expect(r"find=\d", timeout=60)
        status = user.wait()
    finally:
        user.close()
    assert status == 0, user.text()
    return user.output


def screen_rows(data: bytes, rows: int = 30, cols: int = 100) -> list[str]:
    """The rows (right-stripped) a VT100/VT220 terminal of ``rows`` × ``cols`` shows after
    ``data``, rendered by pyte."""
    import pyte

    screen = pyte.Screen(cols, rows)
    pyte.ByteStream(screen).feed(data)
    return [row.rstrip() for row in screen.display]
