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
from typing import Mapping, Sequence

#: Runs ``argv[1:]`` with fd 0 made the controlling terminal of its (new) session.
_CTTY = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
         "os.execvp(sys.argv[1], sys.argv[1:])")


class PtyUser:
    """Runs ``argv`` on a fresh pty and plays the user at it.

    Args:
        argv: the program (e.g. ``execgate run …``).
        env, cwd: as for subprocess.
        wrap: turns the full argv into the one spawned (e.g. :meth:`Attacker.command`).
        owner: ``(uid, gid)`` to own the terminal (a login terminal belongs to its user).

    Attributes:
        output: everything read from the terminal so far (bytes).
        slave_path: the terminal's name (``/dev/pts/N``).
    """

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                 wrap=None, owner: tuple[int, int] | None = None, rows: int = 30, cols: int = 100) -> None:
        self.master, slave = os.openpty()
        self.slave_path = os.ttyname(slave)
        if owner is not None:
            os.fchown(slave, *owner)
        import fcntl
        import struct

        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.modes_before = termios.tcgetattr(slave)
        full = [sys.executable, "-c", _CTTY, *argv]
        self.proc = subprocess.Popen(list(wrap(full)) if wrap else full, stdin=slave, stdout=slave, stderr=slave,
                                     env=None if env is None else dict(env), cwd=cwd, start_new_session=True)
        self._slave = slave  # kept open: the modes can be read after the program exits
        os.set_blocking(self.master, False)
        self.output = b""

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
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.master, self._slave):
            try:
                os.close(fd)
            except OSError:
                pass
