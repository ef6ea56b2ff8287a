"""A session's own pseudoterminal, relayed to the user's terminal (docs/DESIGN.md §3, §8).

When ``execgate run`` is started at a terminal, the session's shell never gets that terminal: it
gets the slave of a fresh pty (pty(7)) as its stdin, stdout and (with ``2>&1``-like wiring)
stderr, made its controlling terminal inside its new session by ``execgate-ctty``. execgate keeps
the master and copies bytes both ways:

* the user's terminal (:class:`RealTerminal`, execgate's fd 0 and fd 1) is put in raw mode
  (termios(3) ``cfmakeraw``: no echo, no line editing, no signals from keys, no output
  processing), so every key reaches the pty, whose own line discipline — set up from the user's
  saved modes — echoes, edits lines and turns ^C into SIGINT for the session's foreground
  process group; the saved mode is restored on every way out (:func:`raw_mode`);
* the window size is copied to the pty at start and on every ``SIGWINCH`` (tty_ioctl(4)
  ``TIOCGWINSZ``/``TIOCSWINSZ``: the kernel then signals the session's foreground group);
* what the session writes is read from the master in chunks of at most 64 KiB, each written
  before the next is read (:class:`~execgate.server.output.StdioWriter`): a stalled terminal
  holds back the session, never grows a buffer; typed input waits in at most
  :data:`MAX_INPUT_PENDING` bytes, after which the terminal is not read until the pty takes it.

A session can therefore write only into its own pty; ``TIOCSTI`` there pushes input into its own
input queue. The user's terminal is not in its sandbox (bwrap mounts a fresh ``/dev`` and
``/proc``), so nothing inside can open it.

While an approval is asked (:meth:`PtyRelay.held`), the relay stops reading the master (the
session's output waits in the kernel's pty buffer, a few KiB, then the writer blocks) and the
user's keys go to :meth:`PtyRelay.read_line` instead of the pty: only the person at the terminal
can answer, and nothing the session prints can land inside the question. The terminal state the
session's output left (an unterminated OSC string, concealed text, a line-drawing character set,
a one-line scrolling region) is reset first (:data:`SANE_TERMINAL`), so that nothing it printed
before can hide or garble the question either.

File descriptors: :class:`SessionPty` owns the master and the slave and closes both; the caller
closes the slave (:meth:`SessionPty.close_slave`) once the shell has ended, so that the master
reads EIO when the last holder inside is gone. :class:`RealTerminal` borrows fds 0 and 1 and
closes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import select
import signal
import struct
import termios
import tty
from typing import AsyncIterator, Iterator

from execgate.server.fdpass import close_fds, wait_readable
from execgate.server.output import READ_CHUNK, OutputCallback, StdioWriter

#: Most typed bytes held for the pty before the terminal is no longer read.
MAX_INPUT_PENDING = 64 * 1024
#: Written before anything asked while the session is held (:meth:`PtyRelay.held`): the terminal
#: state the session's earlier output may have left open, reset, so that the question shows as
#: written (ECMA-48, the VT100/VT220 and xterm control sequences): ``ESC \\`` (ST) ends an OSC, DCS,
#: APC, PM or SOS string — an unterminated window title swallows all text up to its terminator — and
#: CAN aborts an escape or control sequence in progress; the cursor saved (DECSC), the scrolling
#: region reset to the whole screen (DECSTBM, which homes the cursor), the cursor restored (DECRC);
#: the terminal's colours reset to its own (xterm OSC 104 palette, 110/111/112 default foreground,
#: background, cursor: SGR 0 returns to the *defaults*, which the session may have set to black on
#: black); then SGR 0 (no concealed text, no foreground drawn in the background colour), G0 and G1
#: ASCII and G0 shifted in (no line-drawing glyphs for letters), insert mode and reverse video off,
#: autowrap on (a long argv is not cut at the screen's edge), the cursor shown; last, everything
#: from the cursor to the end of the screen erased (ED 0), so that no text the session drew there
#: shows through after the question's shorter lines. The question itself starts on a new line below.
#: Terminal features beyond these (window resizing, fonts) are the terminal's to refuse.
SANE_TERMINAL = ("\x1b\\\x18" "\x1b7\x1b[r\x1b8" "\x1b]104\x1b\\\x1b]110\x1b\\\x1b]111\x1b\\\x1b]112\x1b\\"
                 "\x1b[0m\x1b(B\x1b)B\x0f" "\x1b[4l\x1b[?5l\x1b[?7h\x1b[?25h" "\x1b[J")
#: Longest answer line :meth:`PtyRelay.read_line` keeps (longer input is not echoed or kept).
MAX_LINE = 1024
_ERASE = (0x08, 0x7F)  # ^H, DEL
_END = (0x03, 0x04)  # ^C, ^D: no answer


class RealTerminal:
    """The user's terminal: execgate's ``fd_in`` (read) and ``fd_out`` (written, the same terminal).

    Args:
        fd_in, fd_out: borrowed, never closed here.

    Attributes:
        saved: its termios attributes when this object was made (termios(3) ``tcgetattr``).

    Raises:
        termios.error: ``fd_in`` is not a terminal.
    """

    def __init__(self, fd_in: int = 0, fd_out: int = 1) -> None:
        self.fd_in = fd_in
        self.fd_out = fd_out
        self.saved = termios.tcgetattr(fd_in)

    def raw(self) -> None:
        """Raw mode (``cfmakeraw``), after the output already written has drained."""
        tty.setraw(self.fd_in, termios.TCSADRAIN)

    def restore(self) -> None:
        """Back to :attr:`saved` (after pending output drains); a terminal gone is ignored."""
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(self.fd_in, termios.TCSADRAIN, self.saved)

    def window_size(self) -> bytes:
        """The packed ``struct winsize`` (tty_ioctl(4) ``TIOCGWINSZ``)."""
        return fcntl.ioctl(self.fd_out, termios.TIOCGWINSZ, bytes(8))

    def discard_input(self) -> None:
        """Drop what was typed but not read yet (termios(3) ``tcflush(TCIFLUSH)``)."""
        with contextlib.suppress(termios.error, OSError):
            termios.tcflush(self.fd_in, termios.TCIFLUSH)


@contextlib.contextmanager
def raw_mode(terminal: RealTerminal) -> Iterator[None]:
    """``terminal`` in raw mode for the ``with`` block; its saved mode restored however it ends."""
    try:
        terminal.raw()
        yield
    finally:
        terminal.restore()


class SessionPty:
    """A new pty for one session's shell, set up like the user's terminal.

    The slave gets the terminal's saved modes (so erase and interrupt keys work as the user is
    used to) and its window size. Both fds are close-on-exec here (``os.openpty``; the slave is
    opened ``O_NOCTTY``, so it is nobody's controlling terminal until ``execgate-ctty``);
    :func:`~execgate.server.spawn.spawn` dups the slave onto the shell's 0, 1, 2.

    Attributes:
        master: kept by execgate (non-blocking).
        slave: for the shell; -1 once closed.

    Raises:
        OSError: no pty could be made.
    """

    def __init__(self, terminal: RealTerminal) -> None:
        self.master, self.slave = os.openpty()
        try:
            termios.tcsetattr(self.slave, termios.TCSANOW, terminal.saved)
            self.resize(terminal)
            os.set_blocking(self.master, False)
        except BaseException:
            self.close()
            raise

    def resize(self, terminal: RealTerminal) -> None:
        """Copy the terminal's window size to the pty (the session's foreground group gets SIGWINCH)."""
        with contextlib.suppress(OSError):
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, terminal.window_size())

    def close_slave(self) -> None:
        if self.slave >= 0:
            os.close(self.slave)
            self.slave = -1

    def close(self) -> None:
        """Close both ends. Idempotent."""
        self.close_slave()
        if self.master >= 0:
            close_fds([self.master])
            self.master = -1


class PtyRelay:
    """Copies the user's terminal to a session's pty master and back (module doc).

    Args:
        terminal: the user's terminal, already in raw mode.
        pty: the session's pty (its master is borrowed).
        writer: where the session's output goes (default a
            :class:`~execgate.server.output.StdioWriter` on ``terminal.fd_out``).
    """

    def __init__(self, terminal: RealTerminal, pty: SessionPty, writer: OutputCallback | None = None) -> None:
        self.terminal = terminal
        self.pty = pty
        self._writer = writer or StdioWriter({"stdout": terminal.fd_out})
        self._loop = asyncio.get_running_loop()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._to_master = bytearray()
        self._answer: bytearray | None = None  # keys typed while held
        self._typed = asyncio.Event()
        self._input_open = True
        self._reading = False
        self._broken = False  # our own output failed: the session's is read and dropped
        self._pump: asyncio.Future[None] | None = None

    def start(self) -> None:
        """Start relaying (and following the window size)."""
        self._pump = asyncio.ensure_future(self._pump_output())
        self._update_reader()
        self._loop.add_signal_handler(signal.SIGWINCH, self.pty.resize, self.terminal)

    async def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for the master to reach its end (EIO: every slave fd
        closed) — call it after :meth:`SessionPty.close_slave`."""
        self._flowing.set()
        if self._pump is not None:
            await asyncio.wait({self._pump}, timeout=timeout_s)

    async def close(self) -> None:
        """Stop relaying. Idempotent; closes no fd."""
        self._loop.remove_signal_handler(signal.SIGWINCH)
        self._input_open = False
        self._update_reader()
        self._loop.remove_writer(self.pty.master)
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)

    async def _pump_output(self) -> None:
        master = self.pty.master
        while True:
            await self._flowing.wait()
            try:
                data = os.read(master, READ_CHUNK)
            except BlockingIOError:
                await wait_readable(master)
                continue
            except OSError as exc:
                if exc.errno == errno.EIO:  # the last slave fd is closed
                    return
                raise
            if not data:
                return
            if not self._broken:
                try:
                    await self._writer("stdout", data)
                except OSError:
                    self._broken = True

    # -- input -------------------------------------------------------------------------------

    def _update_reader(self) -> None:
        """Read the terminal while input is open and either an answer is read or the pty has room."""
        want = self._input_open and (self._answer is not None or len(self._to_master) < MAX_INPUT_PENDING)
        if want and not self._reading:
            self._loop.add_reader(self.terminal.fd_in, self._on_input)
        elif not want and self._reading:
            self._loop.remove_reader(self.terminal.fd_in)
        self._reading = want

    def _on_input(self) -> None:
        data = self._read_available()
        if data is None:
            return
        if not data:  # hung up
            self._input_open = False
            self._typed.set()
            self._update_reader()
            return
        if self._answer is not None:
            if len(self._answer) < 4 * MAX_LINE:
                self._answer += data
            self._typed.set()
            return
        self._to_master += data
        self._flush_input()

    def _read_available(self) -> bytes | None:
        """What the terminal holds, read without ever blocking the loop (FIONREAD says how much);
        b"" when it hung up, None when there was nothing after all."""
        fd = self.terminal.fd_in
        try:
            count = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, bytes(4)))[0]
            if count > 0:
                return os.read(fd, min(count, READ_CHUNK))
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            events = poller.poll(0)
        except OSError:
            return b""
        return b"" if any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in events) else None

    def _flush_input(self) -> None:
        master = self.pty.master
        while self._to_master:
            try:
                del self._to_master[: os.write(master, self._to_master)]
            except BlockingIOError:
                break
            except OSError:  # the pty is gone
                self._to_master.clear()
        self._loop.remove_writer(master)
        if self._to_master:
            self._loop.add_writer(master, self._flush_input)
        self._update_reader()

    # -- asking the person at the terminal ---------------------------------------------------

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[PtyRelay]:
        """For the ``async with`` block: the session's output held, the terminal's state reset
        (:data:`SANE_TERMINAL`, after whatever the session printed last), the keys kept for
        :meth:`read_line`, type-ahead dropped. Then back to relaying."""
        self._flowing.clear()
        self._answer = bytearray()
        self._update_reader()
        try:
            await self.write(SANE_TERMINAL)
            yield self
        finally:
            self._answer = None
            self._flowing.set()
            self._update_reader()

    def discard_typeahead(self) -> None:
        """Forget keys typed before now (so that nothing typed for the session answers a question)."""
        self.terminal.discard_input()
        if self._answer is not None:
            self._answer.clear()

    async def write(self, text: str) -> None:
        """Write ``text`` to the terminal (newlines as CR LF: the terminal is raw), in order with
        the session's output."""
        try:
            await self._writer("stdout", text.replace("\n", "\r\n").encode())
        except OSError:
            self._broken = True

    async def read_line(self) -> str | None:
        """One line typed at the terminal (inside :meth:`held`), echoed, with erase (^H, DEL);
        None on ^C, ^D or a terminal that hung up."""
        line = bytearray()
        while True:
            while self._answer is not None and not self._answer and self._input_open:
                self._typed.clear()
                await self._typed.wait()
            if self._answer is None or not self._answer:
                return None
            data, echo = bytes(self._answer), bytearray()
            self._answer.clear()
            for i, byte in enumerate(data):
                if byte in (0x0D, 0x0A) or byte in _END:
                    self._answer += data[i + 1:]
                    await self.write(echo.decode("utf-8", "replace") + ("\n" if byte not in _END else "^C\n"))
                    return line.decode("utf-8", "replace") if byte not in _END else None
                if byte in _ERASE:
                    if line:
                        line.pop()
                        echo += b"\b \b"
                elif byte >= 0x20 and len(line) < MAX_LINE:
                    line.append(byte)
                    echo.append(byte)
            await self.write(echo.decode("utf-8", "replace"))
