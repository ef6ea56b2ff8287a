"""The ``execgate`` command line: one entry point, one sub-command module per component.

Sub-commands register themselves through a ``register(subparsers)`` function:
``execgate run`` (:mod:`execgate.server.run_cmd`), ``execgate policy serve|check`` and
``execgate approve`` (:mod:`execgate.policy_service.cli`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# Each module exposes register(subparsers); each registered parser sets `func(args) -> int`.
_COMMAND_MODULES = ("execgate.server.run_cmd", "execgate.policy_service.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="execgate",
        description="Gate every exec of a sandboxed shell through a gRPC policy service.",
    )
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("execgate")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        ver = "unknown"
    parser.add_argument("--version", action="version", version=f"execgate {ver}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
