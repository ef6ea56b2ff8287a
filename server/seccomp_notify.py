"""The kernel side of the seccomp backstop: user-notification ioctls and reading a stopped caller's
exec arguments (seccomp_unotify(2), include/uapi/linux/seccomp.h; Linux ≥ 5.0, ``CONTINUE`` ≥ 5.5).

Everything here is synchronous and cheap: the notifying thread is stopped inside ``execve`` until
it is answered, so its memory does not change under a single-threaded caller, and reading it through
``/proc/PID/mem`` does not wait on the caller. (A multithreaded caller's other threads can rewrite
it: see the time-of-check race in :mod:`execgate.server.backstop`.) A page the caller registered with
``userfaultfd`` cannot stall the read: unprivileged userfaultfd is user-mode-only, so the kernel's
own access through ``/proc/PID/mem`` fails with ``EFAULT`` instead of waiting.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from dataclasses import dataclass

#: struct seccomp_notif {u64 id; u32 pid; u32 flags; struct seccomp_data {int nr; u32 arch;
#: u64 instruction_pointer; u64 args[6];}} — 80 bytes.
NOTIF = struct.Struct("=QIIiIQ6Q")
#: struct seccomp_notif_resp {u64 id; s64 val; s32 error; u32 flags;} — 24 bytes.
RESP = struct.Struct("=QqiI")


def _iowr(nr: int, size: int, direction: int = 3) -> int:
    """``_IOC(direction, '!', nr, size)`` (asm-generic/ioctl.h): direction 3 = read|write, 1 = write."""
    return (direction << 30) | (size << 16) | (ord("!") << 8) | nr


IOCTL_RECV = _iowr(0, NOTIF.size)
IOCTL_SEND = _iowr(1, RESP.size)
IOCTL_ID_VALID = _iowr(2, 8, direction=1)  # _IOW since 5.7; the kernel still accepts the old _IOR
FLAG_CONTINUE = 1  # SECCOMP_USER_NOTIF_FLAG_CONTINUE

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
#: (arch, nr) → "execve" | "execveat", as the launcher's filter notifies them.
EXEC_SYSCALLS = {
    (AUDIT_ARCH_X86_64, 59): "execve", (AUDIT_ARCH_X86_64, 322): "execveat",
    (AUDIT_ARCH_I386, 11): "execve", (AUDIT_ARCH_I386, 358): "execveat",
}
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
PATH_MAX = 4096
_PAGE = 4096


class NotificationGone(Exception):
    """The notification is no longer valid: the caller died (or was killed) before the answer."""


@dataclass(frozen=True, slots=True)
class Notification:
    """One received notification.

    Attributes:
        id: the kernel's cookie for the answer.
        pid: the calling thread's id, in the server's pid namespace (seccomp_unotify(2)).
        nr, arch: the system call number and ``AUDIT_ARCH_*`` of the call.
        args: the six argument registers as the kernel's call uses them: for ``AUDIT_ARCH_I386``
            their low 32 bits (the compat entry truncates them), else the raw 64-bit values.
    """

    id: int
    pid: int
    nr: int
    arch: int
    args: tuple[int, ...]


def receive(listener: int) -> Notification:
    """``SECCOMP_IOCTL_NOTIF_RECV`` on a listener that poll reported readable.

    Raises:
        NotificationGone: the caller was killed between the poll and the receive (``ENOENT``).
        OSError: the listener failed.
    """
    buf = bytearray(NOTIF.size)
    try:
        fcntl.ioctl(listener, IOCTL_RECV, buf, True)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise NotificationGone from exc
        raise
    nid, pid, _flags, nr, arch, _ip, *args = NOTIF.unpack(buf)
    if arch == AUDIT_ARCH_I386:
        # A 64-bit process may make an i386 call (int 0x80): seccomp_data carries its full 64-bit
        # registers, the kernel's compat call uses their low 32 bits only. Read what the kernel
        # reads: else a pointer whose upper half is set names one string here, another there.
        args = [a & 0xFFFFFFFF for a in args]
    return Notification(nid, pid, nr & 0xFFFFFFFF if nr < 0 else nr, arch, tuple(args))


def id_valid(listener: int, nid: int) -> bool:
    """``SECCOMP_IOCTL_NOTIF_ID_VALID``: is the caller still waiting for answer ``nid``?"""
    try:
        fcntl.ioctl(listener, IOCTL_ID_VALID, struct.pack("=Q", nid))
    except OSError:
        return False
    return True


def respond(listener: int, nid: int, *, error: int = 0) -> bool:
    """Answer: ``error`` 0 lets the system call proceed (``CONTINUE``); otherwise it fails with
    ``-error``. Returns False if the caller is gone (``ENOENT``: nothing left to answer).

    Raises:
        OSError: the listener failed otherwise.
    """
    flags = FLAG_CONTINUE if error == 0 else 0
    try:
        fcntl.ioctl(listener, IOCTL_SEND, RESP.pack(nid, 0, -error if error else 0, flags))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def read_cstring(mem: int, addr: int, limit: int) -> bytes:
    """The NUL-terminated string at ``addr`` in the caller (``mem``: its ``/proc/PID/mem``).

    Reads page by page so that a string ending just before an unmapped page is read whole.

    Raises:
        ValueError: no NUL within ``limit`` bytes.
        OSError: unreadable memory (``EFAULT``/``EIO``: a bad pointer).
    """
    out = bytearray()
    while len(out) <= limit:
        want = _PAGE - (addr % _PAGE)
        chunk = os.pread(mem, want, addr)
        if not chunk:
            raise OSError(errno.EFAULT, "unreadable string")
        end = chunk.find(b"\0")
        if end >= 0:
            out += chunk[:end]
            if len(out) > limit:
                break
            return bytes(out)
        out += chunk
        addr += len(chunk)
    raise ValueError(f"string longer than {limit} bytes")


def read_argv(mem: int, addr: int, ptr_size: int, *, max_count: int, max_bytes: int) -> list[bytes]:
    """The NULL-terminated array of strings at ``addr`` (pointers of ``ptr_size`` bytes, 4 or 8).

    A NULL ``addr`` is an empty argv (Linux accepts it, execve(2)).

    Raises:
        ValueError: more than ``max_count`` entries or ``max_bytes`` bytes in all.
        OSError: unreadable memory.
    """
    fmt = "=Q" if ptr_size == 8 else "=I"
    out: list[bytes] = []
    total = 0
    while addr:
        raw = os.pread(mem, ptr_size, addr)
        if len(raw) != ptr_size:
            raise OSError(errno.EFAULT, "unreadable argv")
        (ptr,) = struct.unpack(fmt, raw)
        if ptr == 0:
            break
        if len(out) >= max_count:
            raise ValueError(f"more than {max_count} arguments")
        arg = read_cstring(mem, ptr, max_bytes - total)
        total += len(arg) + 1
        out.append(arg)
        addr += ptr_size
    return out


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_PIDFD_GETFD = 438  # x86_64 and every architecture since 5.6 (include/uapi/asm-generic/unistd.h)


def pidfd_getfd(pidfd: int, target_fd: int) -> int:
    """A duplicate of the process's fd ``target_fd`` (pidfd_getfd(2), close-on-exec, owned by the
    caller): the same open file description, with the access mode the process opened it with.

    Raises:
        OSError: no such fd, or no ptrace permission over the process.
    """
    fd = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, target_fd, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def write_nonblocking(fd: int, data: bytes) -> None:
    """Write ``data`` to a duplicate of someone else's open file without ever blocking.

    O_NONBLOCK lives in the shared open file description, so it is set only for this write and put
    back; a full pipe or a stopped terminal loses the message rather than stalling the loop.

    Raises:
        OSError: the write failed (``EAGAIN``, ``EBADF`` for a read-only file, …).
    """
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if not flags & os.O_NONBLOCK:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        os.write(fd, data)
    finally:
        if not flags & os.O_NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
