"""Regenerate the checked-in gRPC stubs of ``protos/execgate/v1/*.proto``.

Usage: ``python scripts/gen_protos.py [--out DIR]``. The stubs go beside each ``.proto`` (``-I protos``),
so that the folder path equals the import path: ``from execgate.v1 import policy_pb2``. With ``--out``
they go under DIR instead (``scripts/check_protos.sh`` uses that to compare against the checked-in
files). Needs ``grpcio-tools`` (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"


def generate(out: Path) -> int:
    """Run protoc on every .proto under ``protos/``; return protoc's status (0 on success)."""
    from grpc_tools import protoc  # imported here so that --help works without grpcio-tools

    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    return protoc.main(args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT, help="output root (default: beside the .proto files)")
    status = generate(parser.parse_args().out)
    if status != 0:
        print(f"protoc failed with status {status}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
