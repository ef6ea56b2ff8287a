"""A session shell's output: bounded capture and back-pressured streaming (docs/DESIGN.md §3, §8).

Nothing here holds more than a fixed number of bytes of a session's output, whatever the script
prints:

* :class:`CaptureBuffer` keeps the first ``limit`` bytes of a stream and counts the rest.
* :class:`OutputPipes` owns the shell's stdout and stderr pipes and reads both until EOF, feeding
  three buffers (``stdout``, ``stderr`` and their interleaving ``output``) and an optional
  ``on_output`` callback. Bytes past a buffer's limit are read and discarded, so a script never
  blocks on a full pipe because of capture; it blocks only when ``on_output`` pushes back.
* :class:`StdioWriter` is an ``on_output`` callback for ``execgate run``'s streaming mode: it copies
  chunks to this process's own stdout/stderr from one writer thread, so that a slow or stalled
  reader stops the pipes from being read (at most one 64 KiB chunk per stream in flight) without
  blocking the event loop (the timeout, signals and the session's decisions keep running).

Ordering: chunks are recorded and written in the order the reads complete. The two pipes are
separate kernel buffers, so the order between stdout and stderr is kept only for writes that
execgate read before the script wrote to the other stream; writes made close together (both pipes
holding data when execgate wakes up) may come out swapped, chunk by chunk. Within one stream the
order is always exact. Where the two need not be told apart (``execgate run`` streaming into one
terminal or file for both), ``stderr_to_stdout`` gives the shell one pipe for both: exact order.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import queue
import threading
from typing import Awaitable, Callable, Mapping

from execgate.server.fdpass import close_fds, wait_readable

log = logging.getLogger(__name__)

#: Default cap, in bytes, on what :meth:`EscalateServer.exec` keeps of each of ``stdout``,
#: ``stderr`` and ``output`` (``execgate run --json --max-capture`` overrides it).
DEFAULT_MAX_CAPTURE = 16 * 1024 * 1024
#: Bytes read from a pipe at a time (the size of one chunk given to ``on_output``).
READ_CHUNK = 65536
#: The captured streams, in :attr:`ExecResult.truncated` order.
CAPTURED = ("stdout", "stderr", "output")

#: ``on_output(stream, data)``: ``stream`` is "stdout" or "stderr", ``data`` raw bytes as read.
#: If it returns an awaitable, that stream is not read again until the awaitable is done
#: (back-pressure); if the awaitable raises OSError, the stream's pipe is closed (the script's
#: next write to it gets EPIPE, as in a shell pipeline whose reader went away).
OutputCallback = Callable[[str, bytes], Awaitable[None] | None]


def complete_utf8_prefix(data: bytes | bytearray | memoryview) -> int:
    """Length of ``data`` without a trailing incomplete UTF-8 sequence.

    A cut at a byte limit may split a multibyte character; this is where to cut instead so that
    the kept bytes decode without a replacement character for the split one. Bytes that are not
    UTF-8 at all are left alone (the result is ``len(data)`` unless the last 1-3 bytes are a lead
    byte and fewer continuation bytes than it announces).

    Args:
        data: the bytes kept so far.

    Returns:
        A length in bytes, ``len(data) - 3 <= n <= len(data)``.
    """
    size = len(data)
    for back in range(1, min(3, size) + 1):
        byte = data[size - back]
        if byte & 0xC0 == 0x80:  # continuation byte: look further back for its lead byte
            continue
        if 0xC0 <= byte < 0xF8:  # lead byte of a sequence of `need` bytes
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return size - back if need > back else size
        return size  # ASCII
    return size


class CaptureBuffer:
    """The first ``limit`` bytes of a stream, and a count of everything offered.

    Args:
        limit: bytes to keep (>= 0).

    Raises:
        ValueError: ``limit`` is negative.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"capture limit must be >= 0 bytes, got {limit}")
        self.limit = limit
        self.total = 0  # bytes offered, kept or not
        self._data = bytearray()

    def add(self, data: bytes) -> None:
        """Keep what fits of ``data`` under the limit; count all of it."""
        self.total += len(data)
        room = self.limit - len(self._data)
        if room > 0:
            self._data += memoryview(data)[:room]

    def _kept_len(self) -> int:
        if self.total == len(self._data):
            return self.total
        return complete_utf8_prefix(self._data)  # truncated: do not end inside a character

    @property
    def dropped(self) -> int:
        """Bytes not kept: past the limit, plus a character split by the cut (at most 3 bytes)."""
        return self.total - self._kept_len()

    def value(self) -> bytes:
        """The kept bytes (a prefix of the stream; see :attr:`dropped`)."""
        return bytes(memoryview(self._data)[: self._kept_len()])

    def text(self) -> str:
        """The kept bytes, UTF-8 decoded with replacement."""
        return str(memoryview(self._data)[: self._kept_len()], "utf-8", "replace")


class OutputPipes:
    """The shell's stdout/stderr pipes (owned here), read until EOF into capped buffers.

    Args:
        on_output: optional :data:`OutputCallback`, called on the event loop per chunk read.
        max_capture: bytes kept of each of ``stdout``, ``stderr`` and ``output`` (0: none).
        stderr_to_stdout: one pipe for both fd 1 and fd 2 (as ``2>&1``): everything arrives as
            ``stdout``, in exactly the order written; ``stderr`` stays empty.

    Raises:
        ValueError: ``max_capture`` is negative.
        OSError: the pipes could not be created.
    """

    def __init__(self, on_output: OutputCallback | None, max_capture: int = DEFAULT_MAX_CAPTURE,
                 stderr_to_stdout: bool = False) -> None:
        self.on_output = on_output
        self.buffers = {name: CaptureBuffer(max_capture) for name in CAPTURED}
        self.streams = ("stdout",) if stderr_to_stdout else ("stdout", "stderr")
        self.fds: dict[str, int] = {}
        self.tasks: list[asyncio.Future[None]] = []
        try:
            for name in self.streams:
                self.fds[name], self.fds[name + "_w"] = os.pipe()
        except BaseException:
            close_fds(self.fds.values())
            raise

    def write_ends(self) -> dict[int, int]:
        """Destination → write end, for :func:`~execgate.server.spawn.spawn`'s ``stdio``."""
        return {1: self.fds["stdout_w"], 2: self.fds[self.streams[-1] + "_w"]}

    def close_write_ends(self) -> None:
        close_fds([self.fds.pop(name + "_w") for name in self.streams])

    def start(self) -> None:
        """Start reading the pipes (needs a running event loop)."""
        self.tasks = [asyncio.ensure_future(self._drain(n)) for n in self.streams]

    async def finish(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for both pipes to reach EOF."""
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout_s)

    async def close(self) -> None:
        """Stop reading and close every pipe end still open. Idempotent."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        close_fds(self.fds.values())
        self.fds.clear()

    async def _drain(self, name: str) -> None:
        """Read pipe ``name`` until EOF (or until ``on_output`` fails to take a chunk)."""
        fd = self.fds[name]
        os.set_blocking(fd, False)
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                await wait_readable(fd)
                continue
            if not data:
                return
            self.buffers[name].add(data)
            self.buffers["output"].add(data)
            pending = self.on_output(name, data) if self.on_output is not None else None
            if pending is None or not inspect.isawaitable(pending):
                continue
            try:
                await pending
            except OSError:  # the reader of our own stream went away: let the script see EPIPE
                os.close(self.fds.pop(name))
                return

    def truncated(self) -> dict[str, int]:
        """``{stream: bytes dropped}`` for each captured stream that was cut (empty: none was)."""
        return {name: buf.dropped for name, buf in self.buffers.items() if buf.dropped}


def same_file(fd_a: int, fd_b: int) -> bool:
    """True if two fds of this process are open on the same file (device and inode: the same
    terminal, pipe or file, e.g. after ``2>&1``); False if either is not open."""
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the blocking ``fd``. Raises OSError (e.g. BrokenPipeError)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class StdioWriter:
    """An :data:`OutputCallback` copying each chunk to a file descriptor of this process.

    Writes happen in one daemon thread, in the order the chunks were given (so ``2>&1`` into one
    terminal or file keeps the order the chunks were read in); each call returns a future that is
    done once its chunk is written, which :class:`OutputPipes` awaits before reading that stream
    again. A write that never completes (a stalled reader) thus stops the reading, never blocks
    the event loop, and holds at most one chunk per stream. The thread is a daemon so that a
    write stuck at exit does not keep the process alive.

    Args:
        fds: stream name → file descriptor (default this process's 1 and 2), left in blocking
            mode (they may be shared with other processes, e.g. a terminal).
    """

    def __init__(self, fds: Mapping[str, int] | None = None) -> None:
        self.fds = dict(fds or {"stdout": 1, "stderr": 2})
        self._queue: queue.SimpleQueue[tuple[int, bytes, asyncio.AbstractEventLoop, asyncio.Future[None]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._failed: set[int] = set()

    def __call__(self, stream: str, data: bytes) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="execgate-output", daemon=True)
            self._thread.start()
        self._queue.put((self.fds[stream], data, loop, done))
        return done

    def _run(self) -> None:
        while True:
            fd, data, loop, done = self._queue.get()
            error: OSError | None = None
            try:
                write_all(fd, data)
            except OSError as exc:
                error = exc
                if not isinstance(exc, BrokenPipeError) and fd not in self._failed:
                    self._failed.add(fd)
                    log.warning("cannot write the script's output to fd %d: %s", fd, exc)
            try:
                loop.call_soon_threadsafe(_settle, done, error)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


def _settle(future: asyncio.Future[None], error: OSError | None) -> None:
    if future.done():  # cancelled: the reader stopped waiting
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
