"""A hostile session's use of the query by exec (server/protocol.py "Query by exec"; run by
tests/e2e/test_query_by_exec.py inside ``execgate run``; standard library only).

It makes the shim's marked exec itself, by the raw system call: FILE opened ``O_PATH`` and
executed by ``execveat(fd, "", argv, envp, AT_EMPTY_PATH)``, the unused 6th argument the address
of three words: the mark, a token, the name FILE. On failure it prints ``EXEC <errno name>``.

Usage:
    python3 query_by_exec.py own|other|TOKEN FILE ARGV0 [ARGV1 ...]
        own: the session's token (EXECGATE_BACKSTOP_QUERY); other: another one
    python3 query_by_exec.py by-path FILE ARGV0 [ARGV1 ...]
        the session's token, but FILE's path itself as the exec's path (not the fd): not a query
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

SYS_EXECVEAT = 322  # x86_64
AT_EMPTY_PATH = 0x1000
MARK = 0x45584547  # server/protocol.py QUERY_EXEC_MARK


def main() -> None:
    which, file, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    own = int(os.environ.get("EXECGATE_BACKSTOP_QUERY", "1"))
    token = (own if which in ("own", "by-path") else own % 0x7FFFFFFF + 1 if which == "other"
             else int(which))
    fd = os.open(file, os.O_PATH | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    args = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    env = [f"{k}={v}".encode() for k, v in os.environ.items()]
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    sys.stdout.flush()
    name = ctypes.c_char_p(file.encode())
    mark = (ctypes.c_long * 3)(MARK, token, ctypes.cast(name, ctypes.c_void_p).value)
    if which == "by-path":
        libc.syscall(ctypes.c_long(SYS_EXECVEAT), ctypes.c_long(-100), file.encode(), args, envp, ctypes.c_long(0),
                     mark)
    else:
        libc.syscall(ctypes.c_long(SYS_EXECVEAT), ctypes.c_long(fd), b"", args, envp, ctypes.c_long(AT_EMPTY_PATH),
                     mark)
    print("EXEC", errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()), flush=True)


if __name__ == "__main__":
    main()
