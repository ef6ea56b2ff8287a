"""The ``execgate`` command line: one entry point, one sub-command module per component.

Sub-commands register themselves through a ``register(subparsers)`` function:
``execgate run`` (:mod:`execgate.server.run_cmd`), ``execgate policy serve|check|health`` and
``execgate approve`` (:mod:`execgate.policy_service.cli`). Only the module of the command being run
is imported (all of them for top-level ``--help``): start-up time is paid by every ``execgate run``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# command name -> module exposing register(subparsers); each parser sets `func(args) -> int`.
_COMMANDS = {
    "run": "execgate.server.run_cmd",
    "policy": "execgate.policy_service.cli",
    "approve": "execgate.policy_service.cli",
}


class _VersionAction(argparse.Action):
    """``--version``, reading the installed version only when asked (importlib.metadata is slow)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        from importlib.metadata import PackageNotFoundError, version

        try:
            ver = version("execgate")
        except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
            ver = "unknown"
        sys.stdout.write(f"execgate {ver}\n")
        parser.exit()


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with only the sub-command named in ``argv`` registered (all if none is)."""
    parser = argparse.ArgumentParser(
        prog="execgate",
        description="Gate every exec of a sandboxed shell through a gRPC policy service.",
    )
    parser.add_argument("--version", action=_VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    first = next((a for a in (argv or ()) if not a.startswith("-")), None)
    modules = [_COMMANDS[first]] if first in _COMMANDS else list(dict.fromkeys(_COMMANDS.values()))
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    From the console script (``argv`` None), a command that asks for it (``execgate run``, whose
    parser sets ``exit_now``: everything it opened is closed by the time it returns) ends the
    process at once with ``os._exit`` after flushing stdout, stderr and the logging handlers:
    the interpreter's own teardown (module clean-up, garbage collection) was ~30 ms of every
    ``execgate run`` (BENCHMARKS.md, cold start). Called with an ``argv``, it always returns.
    """
    import gc

    console = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    # Start-up makes tens of thousands of objects that all live on (modules, classes, the parser):
    # the cyclic collector would walk them again and again (~10 ms of each execgate run). It is
    # off until the command is set up: a command whose parser sets ``gc_later`` turns it back on
    # itself (:func:`execgate.server.run_cmd.collect_from_now`), the others get it back here.
    enabled = gc.isenabled()
    gc.disable()
    try:
        parser = build_parser(argv)
        args, extra = parser.parse_known_args(argv)
        if extra:  # argparse would report these with the top-level usage; name the sub-command's
            _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
        if not getattr(args, "gc_later", False) and enabled:
            gc.enable()
        status = int(args.func(args) or 0)
    finally:
        if enabled:
            gc.enable()
    if console and getattr(args, "exit_now", False):
        _exit_now(status)
    return status


def _exit_now(status: int) -> None:
    """Flush what Python buffers (stdout, stderr, logging handlers), then ``os._exit(status)``;
    returns instead if a flush fails (the normal exit then reports it as usual)."""
    import logging
    import os

    try:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):  # e.g. a closed pipe: leave it to the interpreter's own exit
        return
    os._exit(status)


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)sub-command parser that ``args`` were parsed by (``execgate policy serve``'s)."""
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, actions[0].dest, None) if actions else None
        if chosen is None or chosen not in actions[0].choices:
            return parser
        parser = actions[0].choices[chosen]


if __name__ == "__main__":
    sys.exit(main())
