"""The script's stdin, stdout and stderr under ``execgate run`` (docs/DESIGN.md §3, §8).

Two ways, chosen by :func:`wants_pty`:

* **At a terminal** (execgate's stdin is a terminal and its stdout is that same terminal, and no
  ``--json``): the shell gets a pty of its own (:mod:`execgate.server.terminal`) as its stdin
  and stdout — and as its stderr when execgate's stderr is that terminal too; otherwise stderr
  is a pipe streamed to execgate's stderr as usual. The pty is made the shell's controlling
  terminal (``execgate-ctty``), so ``/dev/tty``, ``read``, job-control signals and full-screen
  programs work, and the session never holds the user's terminal. Prompts of the embedded
  policy service are asked on that terminal by execgate itself
  (:mod:`execgate.policy_service.terminal_approver`), connected to its broker in-process.
* **Otherwise**: execgate's own fd 0 (a pipe, a file) is the shell's stdin, inherited as is
  (``echo x | execgate run -- cat`` prints x); escalated commands get the wrapper's fds, hence
  the same stdin. A terminal is never passed through (the session could read the keys typed for
  a question and write onto the terminal): stdin is then ``/dev/null``, saying so. Output is
  piped and streamed (:class:`~execgate.server.output.StdioWriter`) or captured (``--json``).

While the user's terminal is raw, execgate's own lines on it end in CR LF (:func:`line_end`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator

from execgate.server.output import OutputCallback, StdioWriter, same_file

#: Seconds to keep relaying the pty after the shell ended (background output, as DRAIN_S).
PTY_DRAIN_S = 2.0
#: Why a terminal stdin is not passed to the script when it gets no pty.
NO_TERMINAL_STDIN = ("stdin is a terminal but the script gets no pty of its own (--json, or stdout is not that "
                     "terminal): its stdin is /dev/null")

_line_end = "\n"


def line_end() -> str:
    """How execgate's own lines on stderr end now: ``"\\r\\n"`` while the terminal is raw."""
    return _line_end


@contextlib.contextmanager
def _crlf_lines(stderr_is_terminal: bool) -> Iterator[None]:
    """execgate's notes and log lines end in CR LF for the block (the terminal does no output
    processing in raw mode)."""
    global _line_end
    if not stderr_is_terminal:
        yield
        return
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)]
    _line_end = "\r\n"
    for handler in handlers:
        handler.terminator = "\r\n"
    try:
        yield
    finally:
        _line_end = "\n"
        for handler in handlers:
            handler.terminator = "\n"


def wants_pty(args: argparse.Namespace) -> bool:
    """True if the script gets a pty: not ``--json``, stdin a terminal and stdout that terminal."""
    return not args.json and os.isatty(0) and same_file(0, 1)


@dataclass
class ScriptStdio:
    """What :meth:`EscalateServer.exec` is given for the script's stdio.

    Attributes:
        stdio: destination → fd given to the shell as is (execgate keeps and closes them).
        ctty: make ``stdio[0]`` the shell's controlling terminal.
        on_output: the streaming callback for what is piped (None: capture, ``--json``).
        stderr_to_stdout: one pipe for stdout and stderr (exact order; execgate's own are one file).
        terminal: True when the script has a pty (prompts are then asked at the terminal).
    """

    stdio: dict[int, int] = field(default_factory=dict)
    ctty: bool = False
    on_output: OutputCallback | None = None
    stderr_to_stdout: bool = False
    terminal: bool = False


def _stdin_passed(quiet: bool) -> dict[int, int]:
    """``{0: 0}`` when execgate's stdin may be the script's; ``{}`` (``/dev/null``) when it is
    closed or a terminal."""
    try:
        os.fstat(0)
    except OSError:
        return {}
    if os.isatty(0):
        if not quiet:
            print(f"execgate: {NO_TERMINAL_STDIN}", file=sys.stderr, flush=True)
        return {}
    return {0: 0}


@contextlib.asynccontextmanager
async def script_stdio(args: argparse.Namespace, broker: object = None) -> AsyncIterator[ScriptStdio]:
    """The script's stdio for the ``async with`` block (module doc), restored afterwards.

    Args:
        args: ``execgate run``'s options (``json``, ``quiet``).
        broker: the embedded service's :class:`~execgate.policy_service.approvals.ApprovalBroker`
            to answer at the terminal, or None (``--policy``, no sandbox): prompts are then
            left to that service's approvers.

    Raises:
        OSError: no pty could be made.
    """
    if not wants_pty(args):
        yield ScriptStdio(_stdin_passed(args.quiet), on_output=None if args.json else StdioWriter(),
                          stderr_to_stdout=not args.json and same_file(1, 2))
        return
    async with _on_pty(args, broker) as stdio:
        yield stdio


@contextlib.asynccontextmanager
async def _on_pty(args: argparse.Namespace, broker: object) -> AsyncIterator[ScriptStdio]:
    from execgate.policy_service.terminal_approver import terminal_approver
    from execgate.server.terminal import PtyRelay, RealTerminal, SessionPty, raw_mode

    terminal = RealTerminal(0, 1)
    pty = SessionPty(terminal)
    stderr_too = same_file(1, 2)
    if not args.quiet:
        asks = ("prompts are asked here" if broker is not None
                else "prompts go to the policy service's approvers" if args.policy
                else "prompts are denied (no sandbox)")
        print(f"execgate: terminal: the script gets a pty of its own; {asks}", file=sys.stderr, flush=True)
    try:
        with raw_mode(terminal), _crlf_lines(stderr_too):
            relay = PtyRelay(terminal, pty)
            relay.start()
            try:
                async with terminal_approver(broker, relay):  # type: ignore[arg-type]
                    yield ScriptStdio({0: pty.slave, 1: pty.slave, **({2: pty.slave} if stderr_too else {})},
                                      ctty=True, on_output=StdioWriter(), terminal=True)
                pty.close_slave()
                await relay.drain(PTY_DRAIN_S)
            finally:
                await relay.close()
    finally:
        pty.close()
