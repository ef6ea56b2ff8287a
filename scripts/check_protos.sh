#!/usr/bin/env bash
# Fail (exit 1, with a diff) if the checked-in gRPC stubs differ from what scripts/gen_protos.py
# makes now. Uses $PYTHON if set, else a Python that has grpc_tools, else creates .venv with
# `pip install '.[test]'` (CI runs this in a fresh clone).
set -euo pipefail
cd "$(dirname "$0")/.."

py="${PYTHON:-}"
if [ -z "$py" ]; then
    for cand in .venv/bin/python python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import grpc_tools' 2>/dev/null; then
            py="$cand"; break
        fi
    done
fi
if [ -z "$py" ]; then
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q '.[test]'
    py=.venv/bin/python
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" scripts/gen_protos.py --out "$tmp"

status=0
while IFS= read -r -d '' generated; do
    rel="${generated#"$tmp"/}"
    if ! diff -u "protos/$rel" "$generated"; then
        status=1
    fi
done < <(find "$tmp" -type f -print0 | sort -z)
# A checked-in stub whose .proto is gone is drift too.
while IFS= read -r -d '' existing; do
    rel="${existing#protos/}"
    if [ ! -e "$tmp/$rel" ]; then
        echo "stale generated file: $existing (no .proto makes it)"
        status=1
    fi
done < <(find protos -type f \( -name '*_pb2.py' -o -name '*_pb2.pyi' -o -name '*_pb2_grpc.py' \) -print0)

if [ "$status" -ne 0 ]; then
    echo "generated stubs are out of date: run 'python scripts/gen_protos.py' and commit" >&2
    exit 1
fi
echo "generated stubs are up to date"
