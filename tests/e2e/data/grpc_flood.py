"""A hostile client of the policy service: DetermineAction with a 500,000-component program path,
in a loop until the file STOP exists::

    python grpc_flood.py ADDRESS STOP REPORT

REPORT gets a JSON object ``{status code name: count}`` (``OK`` for an answer).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import grpc

from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc

PROGRAM = "/" + "a/" * 499_999 + "a"


def main() -> None:
    address, stop, report = sys.argv[1:4]
    request = pb.DetermineActionRequest(
        session=pb.SessionContext(session_id="hostile"),
        target=pb.ExecTarget(program=PROGRAM, argv=["a"], workdir="/tmp"),
    )
    counts: Counter[str] = Counter()
    with grpc.insecure_channel(address) as channel:
        stub = policy_pb2_grpc.EscalationPolicyStub(channel)
        while not os.path.exists(stop):
            try:
                stub.DetermineAction(request, timeout=30)
                counts["OK"] += 1
            except grpc.RpcError as exc:
                counts[exc.code().name] += 1
    with open(report, "w") as f:
        json.dump(dict(counts), f)


if __name__ == "__main__":
    main()
