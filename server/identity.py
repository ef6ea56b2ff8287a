"""Program identity: what the escalation server learns of the file an exec will run, in the
*caller's* filesystem view (docs/DESIGN.md §5, §8; issue #9 class 4).

The caller (a sandboxed shell's process) may see another filesystem than the server and the
policy service: a private ``/tmp``, ``/dev`` and ``/run``, its own ``/proc``, a read-only root. So
a decision is never about a path read in the server's or the service's view. Two ways in:

* **fd** (execgate wrappers): the wrapper opens the target itself (``O_PATH``, openat(2)) and sends
  that fd with the request frame (:data:`execgate.server.protocol.TARGET_FD_EXTENSION_FIELD`); it
  then executes that very fd (``execveat(fd, "", …, AT_EMPTY_PATH)``, execveat(2)). ``fstat`` of
  the received fd is the identity; the path is only used to find the directories holding it.
* **path** (Codex wrappers, the seccomp backstop): the request's path is resolved here, component by
  component, from the caller's root (``/proc/PID/root``, proc(5)).

Resolution in the caller's view is done by hand (``openat(…, O_PATH | O_NOFOLLOW)`` per component,
``readlinkat`` for symlinks, absolute targets restarting at the caller's root, ``..`` never above it):
the kernel would resolve an absolute symlink met under ``/proc/PID/root`` against the *server's*
root. Nothing under ``/proc`` is walked (its magic links name things in the caller's pid
namespace, which the server cannot follow); such a file is identified only by its fd.

The same walk opens the file whose headers :mod:`execgate.server.fileinfo` reads
(:mod:`execgate.server.exec_facts`), so the identity and the file info are of one file, never two
resolutions that could disagree. It is done by hand rather than with openat2(2) ``RESOLVE_IN_ROOT``
(which would confine it just as well) because trust needs what only a walk sees: the real path and
every directory crossed, those holding a symlink followed included; and it needs no Linux 5.6.

The facts (:class:`~execgate.server.policy.FileIdentity`) go to the policy service, which judges
trust from them alone. Every function here is synchronous and does filesystem calls: run it in a
worker thread (``asyncio.to_thread``), never on an event loop.
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat
import struct
from typing import NamedTuple

from execgate.server.policy import FileIdentity

#: Most path components walked, and most symlinks followed (the kernel's own limit is 40,
#: path_resolution(7)); past either the file is not identified by path (no trust).
MAX_COMPONENTS = 512
MAX_SYMLINKS = 40
#: Top-level directories whose files are never trusted: their content is the kernel's or the
#: sandbox's own (a private ``/dev`` tmpfs that root inside can write).
PSEUDO_ROOTS = ("/proc", "/dev")

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;} (unix(7))
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_UNSAFE_MODE = stat.S_IWGRP | stat.S_IWOTH
#: statfs(2) ``f_type`` of procfs (linux/magic.h).
PROC_SUPER_MAGIC = 0x9FA0
_libc = ctypes.CDLL(None, use_errno=True)


def _is_procfs(fd: int) -> bool:
    """True if the directory open on ``fd`` lies on a procfs (fstatfs(2) ``f_type``; an error
    counts as procfs: the caller then refuses the path)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type is its first word
    if _libc.fstatfs(fd, buf) != 0:
        return True
    return int.from_bytes(buf.raw[:ctypes.sizeof(ctypes.c_long)], "little", signed=True) == PROC_SUPER_MAGIC


class Unresolved(OSError):
    """The path cannot be resolved in the caller's view (missing, too deep, through ``/proc``)."""


def peer_cred(conn: socket.socket) -> tuple[int, int] | None:
    """``(pid, uid)`` of the process that made the peer end of ``conn`` (``SO_PEERCRED``, unix(7)),
    pid in the server's pid namespace; None if unknown or the peer is outside that namespace."""
    try:
        pid, uid, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return (pid, uid) if pid > 0 else None


def is_pseudo(path: str) -> bool:
    """True if absolute ``path`` (lexically normalised) lies under ``/proc`` or ``/dev``."""
    path = os.path.normpath(path)
    return any(path == root or path.startswith(root + "/") for root in PSEUDO_ROOTS)


class Walked(NamedTuple):
    """A path resolved in the caller's view by :func:`walk`.

    Attributes:
        fd: ``O_PATH`` fd of the final file (owned by whoever called :func:`walk`).
        st: its stat.
        real_path: its path in the caller's view, every symlink resolved.
        link_dirs: real paths of the directories that held a symlink followed (a directory
            holding a link could retarget it, so it counts as one holding the file).
    """

    fd: int
    st: os.stat_result
    real_path: str
    link_dirs: frozenset[str]


def open_root(pid: int) -> int:
    """An ``O_PATH`` fd of process ``pid``'s root directory (``/proc/PID/root``, proc(5)), owned
    by the caller. Raises OSError if the process is gone or its root cannot be opened."""
    return os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def open_in_root(root: str, path: str) -> int:
    """An ``O_PATH`` fd (owned by the caller) of absolute ``path`` as seen from the root directory
    ``root`` (e.g. ``/proc/PID/root``), resolved by :func:`walk`.

    Raises:
        OSError: ``root`` cannot be opened or the path does not resolve (:class:`Unresolved`).
    """
    dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return walk(dirfd, path).fd
    finally:
        os.close(dirfd)


def identify(program: str, *, pid: int, uid: int, fd: int | None = None) -> FileIdentity | None:
    """Identify the file an exec of ``program`` will run, as process ``pid`` sees it.

    Args:
        program: absolute, lexically normalised path the caller named (``file`` against ``workdir``).
        pid: the caller, in the server's pid namespace (its ``/proc/PID/root`` is its view).
        uid: the caller's uid (``SO_PEERCRED``), for ``caller_can_modify``.
        fd: the file the wrapper opened and will execute, or None; borrowed (the caller of this
            function closes it).

    Returns:
        The facts, or None when nothing could be identified (no fd and the path does not resolve
        in the caller's view, or the caller is gone): the policy then trusts nothing.
    """
    try:
        root = open_root(pid)
    except OSError:
        return None
    try:
        walked = try_walk(root, program)
        try:
            return judge(root, program, uid, fd, walked)
        finally:
            if walked is not None:
                os.close(walked.fd)
    finally:
        os.close(root)


def try_walk(root: int, program: str) -> Walked | None:
    """:func:`walk`, or None when the path does not resolve (Unresolved, ENOENT, ELOOP, EACCES …)."""
    try:
        return walk(root, os.path.normpath(program))
    except OSError:
        return None


def judge(root: int, program: str, uid: int, fd: int | None, walked: Walked | None) -> FileIdentity | None:
    """The identity of the file an exec of ``program`` runs, from the caller's ``root``
    (borrowed), the caller's ``uid``, the wrapper's target ``fd`` (borrowed, or None) and the
    path's resolution ``walked`` (borrowed, or None when it did not resolve).

    Returns:
        The facts; None when there is neither ``fd`` nor a resolution.
    """
    program = os.path.normpath(program)
    if fd is not None:
        st = os.fstat(fd)
        if walked is not None and (walked.st.st_dev, walked.st.st_ino) != (st.st_dev, st.st_ino):
            walked = None  # the path names another file now than the one that will run
        source, real = "fd", walked.real_path if walked is not None else _kernel_name(fd)
    elif walked is not None:
        st, real, source = walked.st, walked.real_path, "path"
    else:
        return None
    if walked is None:
        chain_ok, modifiable = False, True  # the directories are unknown: assume the worst
    else:
        chain_ok, modifiable = _judge_dirs(root, {os.path.dirname(real), *walked.link_dirs}, uid)
        modifiable = modifiable or _modifiable(st, _fd_readonly(walked.fd if fd is None else fd), uid)
    return FileIdentity(
        source=source, device=st.st_dev, inode=st.st_ino, uid=st.st_uid, mode=st.st_mode,
        real_path=real, root_dir_chain=chain_ok, caller_can_modify=modifiable,
        pseudo_fs=is_pseudo(program) or is_pseudo(real) or walked is None,
        same_for_server=_same_for_server(program, st), changed_ns=st.st_ctime_ns, size=st.st_size,
    )


def walk(root: int, path: str, *, fds_of: tuple[int, int] | None = None) -> Walked:
    """Resolve absolute ``path`` from the caller's ``root`` (borrowed fd), following symlinks, as
    the kernel does (path_resolution(7)): ``..`` is the parent of the directory reached so far,
    symlinks included, so ``link/..`` is *not* the directory holding ``link``. Give it the path as
    the caller named it, not lexically normalised, to find the file an exec will run.

    Args:
        fds_of: ``(tid, tgid)`` of the calling thread (server's pid namespace): the open files
            ``/proc/thread-self/fd/N`` names (the thread's fd table) and ``/proc/self/fd/N``
            names (the thread group leader's: ``self`` is the thread group, proc(5); a thread
            cloned without ``CLONE_FILES`` has a table of its own), reached directly or through a
            symlink such as ``/dev/fd``. Give it only where the caller's ``/proc`` is the one the
            session started with (a process that mounts its own, in a namespace of its own, makes
            those names lead elsewhere for the kernel); None: those paths are Unresolved like the
            rest of ``/proc``.

    Returns:
        The final file, open ``O_PATH`` (:class:`Walked`; its fd is the caller's to close).

    Raises:
        Unresolved: too many components or symlinks, the walk enters ``/proc`` (but for the
            open-file forms above), an open file without a name (a memfd, a deleted file), or the
            path names the root itself.
        OSError: a component is missing or cannot be opened (openat(2)).
    """
    todo = [c for c in reversed(path.split("/")) if c]
    fds: list[int] = []  # fds[i] is the directory names[:i+1]; the root is not among them
    names: list[str] = []
    link_dirs: set[str] = set()
    steps = links = 0
    try:
        while todo:
            comp = todo.pop()
            steps += 1
            if steps > MAX_COMPONENTS:
                raise Unresolved(f"more than {MAX_COMPONENTS} path components")
            if comp == ".":
                continue
            if comp == "..":  # never above the caller's root, as the kernel does in a chroot
                if names:
                    names.pop()
                    os.close(fds.pop())
                continue
            here = fds[-1] if fds else root
            fd = os.open(comp, _PATH_FLAGS, dir_fd=here)
            st = os.fstat(fd)
            if not names and comp == "proc" and stat.S_ISDIR(st.st_mode) and _is_procfs(fd):
                # The caller's /proc (in a chroot of its own, a plain directory is walked as such).
                os.close(fd)
                if fds_of is not None and _is_own_fd(todo):
                    if todo[2] == "thread-self":
                        return open_fd_of(fds_of[0], int(todo[0]), tgid=fds_of[1])
                    return open_fd_of(fds_of[1], int(todo[0]))
                raise Unresolved("the path goes through /proc (magic links of the caller's pid namespace)")
            if stat.S_ISLNK(st.st_mode) and _is_procfs(here):
                # A magic link of a procfs mounted elsewhere: read here, it would name the server's
                # own files (``self`` is the reader).
                os.close(fd)
                raise Unresolved("the path goes through a procfs (magic links of the caller's pid namespace)")
            if stat.S_ISLNK(st.st_mode):
                os.close(fd)
                links += 1
                if links > MAX_SYMLINKS:
                    raise Unresolved(f"more than {MAX_SYMLINKS} symbolic links")
                target = os.readlink(comp, dir_fd=here)
                link_dirs.add("/" + "/".join(names))
                if target.startswith("/"):
                    while names:
                        names.pop()
                        os.close(fds.pop())
                todo.extend(c for c in reversed(target.split("/")) if c)
                continue
            names.append(comp)
            fds.append(fd)
        if not names:
            raise Unresolved("the path names the root directory")
        final = fds.pop()
        try:
            return Walked(final, os.fstat(final), "/" + "/".join(names), frozenset(link_dirs))
        except OSError:
            os.close(final)
            raise
    finally:
        for fd in fds:
            os.close(fd)


class NotTheCallersDirectory(Exception):
    """The working directory a request names is not, in this process's view, the directory the
    caller is in (the message says which, and why that matters)."""


class NotTheApprovedFile(Exception):
    """The program path no longer names, in this process's view, the file that was identified
    and decided (the message says so)."""


def caller_directory(pid: int, workdir: str | bytes) -> int:
    """An ``O_PATH`` fd (owned by the caller of this function) on ``workdir`` opened in this
    process's view — where an escalated command starts — provided it is the very directory
    process ``pid`` is in (same device and inode as ``/proc/PID/cwd``, proc(5)) and ``workdir``
    names it without a symlink (the kernel's name of the open directory is ``workdir``): a
    request's ``workdir`` is the caller's word, and through a symlink of its own (``build`` →
    ``/``), or a directory the sandbox replaces (a private ``/tmp``, the masked HOME), the same
    path outside is another directory, or the approver would be told another one. Opened here,
    not through ``/proc/PID/cwd``: that is the sandbox's mount of it (read-only where the
    sandbox made it so, its ``..`` the sandbox's).

    Raises:
        NotTheCallersDirectory: ``workdir`` is missing here, another directory, or a name for it
            through a symlink.
        OSError: the caller's working directory cannot be read (it exited, or it is not ours to read).
    """
    theirs = os.stat(f"/proc/{pid}/cwd")
    shown = os.fsdecode(workdir)
    try:
        fd = os.open(workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise NotTheCallersDirectory(f"the working directory {shown} does not exist where escalated commands "
                                     f"start ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (theirs.st_dev, theirs.st_ino):
            raise NotTheCallersDirectory(
                f"the working directory {shown}, where escalated commands start, is another directory than the "
                "one the caller is in (a symlink, or a directory the sandbox replaces: its private /tmp or /run, "
                "the masked HOME)")
        if os.readlink(f"/proc/self/fd/{fd}") != os.path.normpath(shown):
            raise NotTheCallersDirectory(
                f"the working directory {shown} names the caller's directory through a symlink; its real path "
                f"is {os.readlink(f'/proc/self/fd/{fd}')} (cd there, and ask again)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def reopen_identified(path: str | bytes, identity: FileIdentity) -> int:
    """An ``O_PATH`` fd (owned by the caller of this function) on ``path`` in this process's
    view, provided it is still the file ``identity`` describes (device, inode, change time and
    size): what an escalated command executes, by that fd, once approved — the path alone could
    be re-pointed by the session while the question waited (a symlinked directory swapped).

    Raises:
        NotTheApprovedFile: ``path`` is missing, or another file, or the file changed.
    """
    shown = os.fsdecode(path)
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise NotTheApprovedFile(f"{shown} is gone since it was decided ({exc.strerror})") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_size) != (identity.device, identity.inode, identity.changed_ns,
                                                            identity.size):
        os.close(fd)
        raise NotTheApprovedFile(f"{shown} is not the file that was decided: it was replaced or changed since")
    return fd


class StatusIds(NamedTuple):
    """What :func:`status_ids` reads of a ``/proc/PID/status`` (proc(5)); None where a line is
    missing."""

    tgid: int | None
    ppid: int | None
    euid: int | None
    holds_root: bool


def status_ids(status: bytes) -> StatusIds:
    """Tgid, PPid and effective uid of the process whose ``/proc/PID/status`` is ``status``, in
    one pass, and whether it has root's power or can take it back: a user id (real, effective,
    saved, file system) of 0, or any permitted or effective capability (also when one of those
    lines is missing). ``SO_PEERCRED`` and the effective uid alone are not who a caller can
    become: root that set only its euid to another, or all its uids with PR_SET_KEEPCAPS, takes
    root back at will (red teams D and E of 2026-12-02, test_attack_peer_disguise.py)."""
    tgid = ppid = euid = None
    root, seen = False, 0
    for line in status.splitlines():
        if line.startswith(b"Tgid:"):
            tgid = int(line.split()[1])
        elif line.startswith(b"PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith(b"Uid:"):
            seen += 1
            uids = [int(v) for v in line.split()[1:]]
            euid, root = uids[1], root or 0 in uids
        elif line.startswith((b"CapPrm:", b"CapEff:")):
            seen += 1
            root = root or int(line.split()[1], 16) != 0
    return StatusIds(tgid, ppid, euid, root or seen < 3)


def _is_own_fd(rest: list[str]) -> bool:
    """True if the components after ``/proc`` (reversed, as :func:`walk` keeps them) are exactly
    ``self/fd/N`` or ``thread-self/fd/N``."""
    return len(rest) == 3 and rest[2] in ("self", "thread-self") and rest[1] == "fd" and rest[0].isdigit()


def open_fd_of(tid: int, n: int, tgid: int | None = None) -> Walked:
    """The file thread ``tid`` has open on fd ``n``, as an exec of ``/proc/self/fd/N`` runs it:
    ``/proc/TID/fd/N`` opened ``O_PATH`` follows the magic link to that very file (proc(5)).
    With ``tgid``, by the kernel's own name for ``/proc/thread-self``: ``/proc/TGID/task/TID/fd/N``
    (another directory entry, which a mount over it would make lead elsewhere).

    Raises:
        Unresolved: the fd names no file with a name (memfd, deleted file, socket, pipe).
        OSError: no such fd (or thread).
    """
    link = f"/proc/{tid}/fd/{n}" if tgid is None else f"/proc/{tgid}/task/{tid}/fd/{n}"
    name = os.readlink(link)
    if not name.startswith("/") or name.endswith(" (deleted)"):
        raise Unresolved(f"an unnamed file ({name}) cannot be judged by name")
    fd = os.open(link, os.O_PATH | os.O_CLOEXEC)
    try:
        return Walked(fd, os.fstat(fd), name, frozenset())
    except OSError:
        os.close(fd)
        raise


def _judge_dirs(root: int, dirs: set[str], uid: int) -> tuple[bool, bool]:
    """``(root_dir_chain, caller_can_modify)`` over every directory of ``dirs`` (real paths in the
    caller's view, no symlinks) and each of their parents up to the caller's root (``root``,
    borrowed). A directory that cannot be opened counts as neither root-owned nor safe."""
    chain_ok, modifiable = True, False
    for directory in dirs:
        fds: list[int] = []
        try:
            here = root
            for comp in [c for c in directory.split("/") if c] + [None]:
                st = os.fstat(here)
                if not stat.S_ISDIR(st.st_mode):
                    return False, True
                chain_ok = chain_ok and st.st_uid == 0 and not st.st_mode & _UNSAFE_MODE
                modifiable = modifiable or _modifiable(st, _fd_readonly(here), uid)
                if comp is not None:
                    here = os.open(comp, _PATH_FLAGS | os.O_DIRECTORY, dir_fd=here)
                    fds.append(here)
        except OSError:
            return False, True
        finally:
            for fd in fds:
                os.close(fd)
    return chain_ok, modifiable


def _modifiable(st: os.stat_result, readonly: bool, uid: int) -> bool:
    """True if a caller of ``uid`` could change this file or directory: it owns it, group or
    others may write it, or the caller is root (who passes permission checks on files it owns,
    and on others' with capabilities) and the mount it lies on is writable."""
    if st.st_mode & _UNSAFE_MODE:
        return True
    return not readonly if uid == 0 else st.st_uid == uid


def _fd_readonly(fd: int) -> bool:
    """True if the mount holding open file ``fd`` is read-only (``ST_RDONLY`` of fstatfs(2), which
    works on ``O_PATH`` fds since Linux 3.12, open(2)); the mount is the caller's own."""
    try:
        return bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _kernel_name(fd: int) -> str:
    """The kernel's name for open file ``fd`` (``readlink /proc/self/fd/N``, proc(5)): a path in the
    server's view, or from the root of another mount namespace; its last component is the file's
    own name either way. "" if it has none."""
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""
    return name.removesuffix(" (deleted)") if name.startswith("/") else ""


def _same_for_server(program: str, st: os.stat_result) -> bool:
    """True if ``program`` in the server's own view (what an escalation would spawn) is the file
    ``st`` describes."""
    try:
        mine = os.stat(program)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (st.st_dev, st.st_ino)
