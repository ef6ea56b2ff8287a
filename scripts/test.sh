#!/usr/bin/env bash
# The README's test command: set up (system packages, .venv) and run the whole test suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${EXECGATE_VENV:-.venv}/bin/python" -m pytest "$@"
