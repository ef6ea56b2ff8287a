#!/usr/bin/env bash
# Set up a virtualenv with execgate and its test dependencies, then run the whole test suite.
# This is the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${EXECGATE_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q ".[test]"
exec "$VENV/bin/python" -m pytest "$@"
