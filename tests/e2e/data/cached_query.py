"""A hostile session's use of the preload shim's cached-only query (run by
tests/e2e/test_attack_cached_query.py inside ``execgate run``; standard library only).

It speaks the escalation protocol itself on the session's inherited socket
(``CODEX_ESCALATE_SOCKET``): handshake datagram ``b"\\0"`` with a fresh stream end, then a request
frame marked ``"execgate_cached_only": true`` with the target opened ``O_PATH`` attached, as the
shim does, and prints the answer's action on one line: ``ANSWER <file> <action>``.

Usage:
    python3 cached_query.py query FILE ARGV0 [ARGV1 ...]
    python3 cached_query.py query-exec FILE ARGV0 [ARGV1 ...] -- OTHER
        (query FILE; on Run, execve OTHER with the approved argv instead, by the raw system
        call, past the shim; prints ``EXEC <errno name>`` if that fails)
    python3 cached_query.py ask-other FILE OTHER ARGV0 [ARGV1 ...]
        (a full request, not cached-only, naming FILE with the fd of OTHER attached)
    python3 cached_query.py rewrite-exec query|full|mmap FILE SOURCE ARGV0 [ARGV1 ...]
        (ask about FILE with its fd attached; on Run, rewrite FILE in place — same inode — with
        SOURCE's bytes, then execveat the fd by the raw system call; prints ``EXEC <errno>``.
        mmap: FILE and SOURCE have one size; FILE is mapped shared and every page written once
        before asking, so that the rewrite through the mapping changes neither its change time
        nor its size; MAPFROM, if set, names the path to map: another view of the same file)
    python3 cached_query.py query-child-exec FILE ARGV0 [ARGV1 ...] -- OTHER
        (the same for an exec by a child, as the shim's posix_spawn asks: a forked child
        execs OTHER; prints ``CHILD <status>``)
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import socket
import struct
import sys

SYS_EXECVE = 59  # x86_64
SYS_EXECVEAT = 322  # x86_64
AT_EMPTY_PATH = 0x1000


def query(file: str, argv: list[str], child: bool = False, opened: str | None = None,
          cached_only: bool = True) -> tuple[str, int]:
    """The action the server answers a cached-only query (or a full request) for FILE, with the
    O_PATH fd of OPENED (default FILE) attached; and that fd."""
    dgram = socket.socket(fileno=os.dup(int(os.environ["CODEX_ESCALATE_SOCKET"])))
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    dgram.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", theirs.fileno()))])
    theirs.close()
    target = os.open(opened or file, os.O_PATH | os.O_CLOEXEC)
    body = json.dumps({"file": file, "argv": argv, "workdir": os.getcwd(), "env": {},
                       "execgate_target_fd": True,
                       **({"execgate_cached_only": True} if cached_only else {}),
                       **({"execgate_cached_for_child": True} if child else {})}).encode()
    frame = struct.pack("<I", len(body)) + body
    mine.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", target))])
    head = mine.recv(4, socket.MSG_WAITALL)
    (size,) = struct.unpack("<I", head)
    answer = json.loads(mine.recv(size, socket.MSG_WAITALL))
    mine.close()
    action = answer["action"]
    return (action if isinstance(action, str) else next(iter(action))), target


def main() -> int:
    mode, rest = sys.argv[1], sys.argv[2:]
    other = None
    if mode == "rewrite-exec":
        kind, file, source, argv = rest[0], rest[1], rest[2], rest[3:]
        mapped = None
        if kind == "mmap":
            fd = os.open(os.environ.get("MAPFROM", file), os.O_RDWR)  # or another view of the file
            mapped = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)
            os.close(fd)
            for page in range(0, len(mapped), mmap.PAGESIZE):
                mapped[page] = mapped[page]  # the first write fault of each page, before the check
        action, target = query(file, argv, cached_only=kind != "full")
        print(f"ANSWER {file} {action}", flush=True)
        if action != "Run":
            return 0
        before = os.stat(file)
        if mapped is not None:
            with open(source, "rb") as src:
                mapped[:] = src.read()
            mapped.close()
        else:
            with open(source, "rb") as src, open(file, "r+b") as dst:
                dst.truncate(0)
                dst.write(src.read())
        after = os.stat(file)
        print(f"CTIME SAME {before.st_ctime_ns == after.st_ctime_ns} SIZE SAME {before.st_size == after.st_size}",
              flush=True)
        print(f"SAME INODE {os.stat(file).st_ino == os.fstat(target).st_ino}", flush=True)
        libc = ctypes.CDLL(None, use_errno=True)
        args = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
        envp = (ctypes.c_char_p * 1)(None)
        libc.syscall(SYS_EXECVEAT, target, b"", args, envp, AT_EMPTY_PATH)
        print(f"EXEC {errno.errorcode.get(ctypes.get_errno(), '?')}", flush=True)
        return 0
    if mode == "ask-other":
        action, _target = query(rest[0], rest[2:], opened=rest[1], cached_only=False)
        print(f"ANSWER {rest[0]} {action}", flush=True)
        return 0
    if mode in ("query-exec", "query-child-exec"):
        cut = rest.index("--")
        rest, other = rest[:cut], rest[cut + 1]
    action, _target = query(rest[0], rest[1:], child=mode == "query-child-exec")
    print(f"ANSWER {rest[0]} {action}", flush=True)
    if other is None or action != "Run":
        return 0
    pid = os.fork() if mode == "query-child-exec" else 0
    if pid:
        print(f"CHILD {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}", flush=True)
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    argv = (ctypes.c_char_p * (len(rest)))(*[a.encode() for a in rest[1:]], None)
    envp = (ctypes.c_char_p * 1)(None)
    libc.syscall(SYS_EXECVE, other.encode(), argv, envp)
    print(f"EXEC {errno.errorcode.get(ctypes.get_errno(), '?')}", flush=True)
    if mode == "query-child-exec":
        os._exit(3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
