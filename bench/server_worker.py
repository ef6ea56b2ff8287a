"""The escalation-server process of figures 3b, 4 and 5 (run by the harness as
``python -m bench.server_worker MODE ...``; prints one JSON object on stdout).

``throughput``: one :class:`EscalateServer`, N sessions, a separate client process
(:mod:`bench.client_driver`) that speaks the wire protocol on every session's handshake socket,
each session's execs one after another. ``latency``: the same server and client, execs started
on an open-loop schedule at ``--rate`` per second over the sessions. ``idle``: VmHWM of this
process before and after starting N idle sessions.

``--cache off`` gives :class:`GrpcPolicy` no decision cache: every exec is a gRPC
``DetermineAction`` (the "gRPC hop" path); ``on`` (the default, as deployed) answers from the
cache what the service marked cacheable (the shipped rules: a Run of a program no rule names) —
the "cache hit" path; the result's ``policy_stats`` counts the hits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from typing import Mapping, Sequence

from bench.common import REPO, vm_kib
from execgate.server.escalate_server import EscalateServer
from execgate.server.policy import Decision, Execution, PreparedExec, SessionContext


class AlwaysRun:
    """In-process policy answering Run to everything: the baseline without gRPC."""

    def __init__(self) -> None:
        self.stats: dict[str, int] = {"run": 0, "error": 0}

    async def determine_action(self, program: str, argv: Sequence[str], workdir: str, session: SessionContext) -> Decision:
        self.stats["run"] += 1
        return Decision.run()

    async def prepare_escalated_exec(self, program: str, argv: Sequence[str], workdir: str, env: Mapping[str, str],
                                     execution: Execution, session: SessionContext) -> PreparedExec:
        raise RuntimeError("the bench policy never escalates")


def _policy(address: str, cache: bool = True):  # -> Policy
    if address == "inproc":
        return AlwaysRun()
    from execgate.server.grpc_policy import GrpcPolicy

    return GrpcPolicy(address, cache=cache)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def throughput(address: str, sessions: int, execs: int, cache: bool = True,
                     load: dict[str, float] | None = None) -> dict[str, object]:
    """``load`` None: closed loop, ``execs`` per session; else the open-loop schedule
    (``rate``, ``count``, ``warm``: :mod:`bench.client_driver`)."""
    policy = _policy(address, cache)
    server = EscalateServer("/bin/sh", "/bin/false", policy)
    opened = [server.start_session(labels={"bench": "throughput"}) for _ in range(sessions)]
    try:
        fds = [s.client_fd for s in opened]
        cpu0 = _cpu_s()
        args = {"fds": fds, "execs": execs} if load is None else {"fds": fds, **load}
        driver = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.client_driver", json.dumps(args),
            pass_fds=fds, cwd=str(REPO), stdout=asyncio.subprocess.PIPE,
        )
        for s in opened:
            s.close_client_socket()
        out, _ = await driver.communicate()
        server_cpu = _cpu_s() - cpu0
        result = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        await asyncio.gather(*(s.close() for s in opened))
        if hasattr(policy, "aclose"):
            await policy.aclose()
    result.update(server_cpu_s=server_cpu, policy_stats=dict(policy.stats), driver_status=driver.returncode)
    return result


async def idle(address: str, sessions: int) -> dict[str, object]:
    policy = _policy(address)
    server = EscalateServer("/bin/sh", "/bin/false", policy)
    warm = await policy.determine_action("/bin/true", ["true"], "/tmp", SessionContext(session_id="warm"))
    before_hwm, before_rss = vm_kib("self", "VmHWM"), vm_kib("self", "VmRSS")
    opened = [server.start_session(labels={"bench": "idle", "n": str(i)}) for i in range(sessions)]
    try:
        for s in opened:
            s.close_client_socket()
        await asyncio.sleep(0.5)
        after_hwm, after_rss = vm_kib("self", "VmHWM"), vm_kib("self", "VmRSS")
    finally:
        await asyncio.gather(*(s.close() for s in opened))
        if hasattr(policy, "aclose"):
            await policy.aclose()
    return {"warm_action": warm.action, "warm_error": warm.error, "before_hwm_kib": before_hwm,
            "before_rss_kib": before_rss, "after_hwm_kib": after_hwm, "after_rss_kib": after_rss}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server_worker")
    parser.add_argument("mode", choices=("throughput", "latency", "idle"))
    parser.add_argument("--policy", required=True, help="unix:///… of a policy service, or inproc")
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--execs", type=int, default=0)
    parser.add_argument("--cache", choices=("on", "off"), default="on", help="GrpcPolicy's decision cache")
    parser.add_argument("--rate", type=float, default=1000.0, help="latency: execs started per second")
    parser.add_argument("--count", type=int, default=1000, help="latency: execs measured")
    parser.add_argument("--warm", type=int, default=100, help="latency: execs before the measured ones")
    args = parser.parse_args()
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        start = time.perf_counter()
        if args.mode == "throughput":
            result = runner.run(throughput(args.policy, args.sessions, args.execs, args.cache == "on"))
        elif args.mode == "latency":
            load = {"rate": args.rate, "count": args.count, "warm": args.warm}
            result = runner.run(throughput(args.policy, args.sessions, 0, args.cache == "on", load))
        else:
            result = runner.run(idle(args.policy, args.sessions))
        result["worker_wall_s"] = time.perf_counter() - start
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
