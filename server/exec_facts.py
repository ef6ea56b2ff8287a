"""Whether the children of an exec'd program will be seen by the session (issue #9 class 12).

The preload shim (docs/DESIGN.md §6) sees only what a process that loaded it execs. It is not
loaded by:

* a **static** program (no ``PT_INTERP``: no dynamic loader, so no ``LD_PRELOAD``; ld.so(8));
* a **setuid/setgid** program or one with **file capabilities**: the kernel sets ``AT_SECURE``
  and the loader ignores ``LD_PRELOAD`` paths (ld.so(8), "secure-execution mode") — unless the
  caller has **no_new_privs** (``NoNewPrivs: 1`` in ``/proc/PID/status``, proc(5)): then execve(2)
  does not apply the set-ID bits or file capabilities at all (prctl(2) ``PR_SET_NO_NEW_PRIVS``),
  ``AT_SECURE`` stays 0 and the shim loads. bwrap and the seccomp launcher both set it;
* a program of an ABI the shim was not built for (a 32-bit program when no i386 shim is
  installed, another machine run through binfmt_misc);
* a ``#!`` script whose interpreter is one of these.

With the seccomp backstop (:mod:`.backstop`) every exec of the session is seen whatever the
program: children are never unseen. With neither shim nor backstop (an ``EXEC_WRAPPER`` shell)
only the shell's own execs are seen: every program's children are unseen.

:func:`gather` puts together everything the server learns of one exec's file
(:class:`~execgate.server.policy.ExecFacts`): it resolves the program once in the caller's view
(``/proc/PID/root``, :func:`~execgate.server.identity.walk`), identifies the file
(:func:`~execgate.server.identity.judge`: the wrapper's target fd if it sent one, else that
walk's file), describes that same file (:func:`~execgate.server.fileinfo.describe`: the
wrapper's fd when there is one, reopened through ``/proc/self/fd/N``, else the walk's) and
judges ``children_unseen``. It does blocking file I/O: call it in a worker thread, or
:func:`learn`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Mapping

from execgate.server.fileinfo import FileInfo, NotRegular, describe
from execgate.server.identity import Walked, judge, open_root, walk
from execgate.server.policy import ExecFacts, FileIdentity

log = logging.getLogger(__name__)

#: (ELF class, e_machine) of the server's own machine, for the shim's native build.
_NATIVE = {"x86_64": (64, 62), "aarch64": (64, 183), "i686": (32, 3), "riscv64": (64, 243)}
#: The ABI of an i386 shim build (elf(5): ELFCLASS32, EM_386).
I386 = (32, 3)


@dataclass(frozen=True, slots=True)
class Coverage:
    """What a session's interception sees.

    Attributes:
        seccomp: the seccomp backstop is on (every exec is seen).
        preload_abis: (ELF class, e_machine) pairs the preload shim is built for; empty when the
            session has no shim (an ``EXEC_WRAPPER`` shell).
    """

    seccomp: bool = False
    preload_abis: frozenset[tuple[int, int]] = frozenset()

    @classmethod
    def of_session(cls, env_overlay: Mapping[str, str], seccomp: bool) -> Coverage:
        """The coverage of a session with this env overlay: a shim when ``LD_PRELOAD`` is set
        (for the native ABI, plus i386 when it names the per-ABI ``$LIB`` builds and an i386
        build is installed, :func:`execgate.wrapper.artifacts.has_32bit_shim`)."""
        preload = env_overlay.get("LD_PRELOAD", "")
        abis: set[tuple[int, int]] = set()
        if preload:
            native = _NATIVE.get(os.uname().machine)
            if native is not None:
                abis.add(native)
            if "$LIB" in preload and _has_32bit_shim():
                abis.add(I386)
        return cls(seccomp=seccomp, preload_abis=frozenset(abis))


def _has_32bit_shim() -> bool:
    try:
        from execgate.wrapper.artifacts import has_32bit_shim
    except ImportError:  # pragma: no cover - the wrapper package ships with the server
        return False
    return has_32bit_shim()


def children_unseen(info: FileInfo | None, coverage: Coverage, no_new_privs: bool | None) -> bool | None:
    """True if what the program execs would not be seen (see the module docstring).

    Args:
        info: the program (for a script, with ``interpreter_info``); None if nothing was learnt.
        coverage: the session's interception.
        no_new_privs: the caller's ``NoNewPrivs`` (None: unknown).

    Returns:
        True / False, or None when the facts needed are unknown.
    """
    if coverage.seccomp:
        return False
    if not coverage.preload_abis:
        return True
    if info is None:
        return None
    if info.format == "other":
        return False  # ENOEXEC: a shell runs it itself, with the shim
    if info.format == "script":
        interp = info.interpreter_info
        if interp is None or interp.format == "script":
            return None  # unread, or a nested interpreter (not followed)
        return children_unseen(interp, coverage, no_new_privs)
    if info.linkage is None or info.elf_class is None:
        return None
    if info.linkage == "static" or (info.elf_class, info.machine) not in coverage.preload_abis:
        return True
    if info.setuid or info.setgid or info.capabilities:
        return None if no_new_privs is None else not no_new_privs
    return False


def no_new_privs(pid: int) -> bool | None:
    """The ``NoNewPrivs`` flag of process ``pid`` (proc(5) ``/proc/PID/status``), None if unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NoNewPrivs:"):
                    return line.split()[1] == b"1"
    except (OSError, IndexError):
        return None
    return None


def describe_in_root(root: str, program: str) -> FileInfo:
    """Describe ``program`` (absolute) as seen from the directory ``root`` (e.g. ``/proc/PID/root``,
    or ``/`` for this process's own view), and a script's interpreter (one level).

    Raises:
        NotRegular, OSError: as :func:`~execgate.server.fileinfo.describe` and
            :func:`~execgate.server.identity.walk`.
    """
    dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        walked = walk(dirfd, os.path.normpath(program))
        try:
            return _describe(dirfd, walked.fd)
        finally:
            os.close(walked.fd)
    finally:
        os.close(dirfd)


def _describe(root: int | None, fd: int) -> FileInfo:
    """Describe the file open on ``fd`` (borrowed) and, for a ``#!`` script, its interpreter as
    resolved from the caller's ``root`` (borrowed; None: the interpreter is not read).

    Raises:
        NotRegular, OSError: as :func:`~execgate.server.fileinfo.describe`.
    """
    info = describe(fd)
    if root is None or info.format != "script" or not info.interpreter or not os.path.isabs(info.interpreter):
        return info
    try:
        interp = walk(root, os.path.normpath(info.interpreter))
    except OSError:
        return info
    try:
        return dataclasses.replace(info, interpreter_info=describe(interp.fd))
    except (NotRegular, OSError):
        return info
    finally:
        os.close(interp.fd)


def read_info(root: int | None, fd: int) -> tuple[FileInfo | None, str | None]:
    """``(info, None)`` for the file on ``fd`` (borrowed), or ``(None, why)`` when it cannot be
    read; ``root`` (borrowed, or None) resolves a script's interpreter."""
    try:
        return _describe(root, fd), None
    except (NotRegular, OSError) as exc:
        return None, str(exc)


def gather(pid: int | None, program: str, coverage: Coverage, *, uid: int | None = None,
           fd: int | None = None, path: str | None = None) -> ExecFacts:
    """The facts of one exec, by process ``pid``, of ``program``: one walk in the caller's view
    gives the file both the identity and the file info describe.

    Args:
        pid: the caller, in the server's pid namespace (None: unknown, nothing is walked).
        program: absolute, lexically normalised path the caller named: the name the policy judges.
        coverage: the session's interception, for ``children_unseen``.
        uid: the caller's uid (``SO_PEERCRED``); None: not identified (no trust).
        fd: the wrapper's target fd (borrowed), or None: then the file ``path`` resolves to in the
            caller's view is the one that runs, and is read.
        path: the absolute path as the kernel will resolve it (``file`` joined to ``workdir``,
            *not* normalised: ``symlink/..`` is not the symlink's directory); None: ``program``.
            When it differs from ``program`` and names another file, the name is not the file's
            (:func:`~execgate.server.identity.judge` then trusts nothing).

    Returns:
        The facts; never raises: what cannot be learnt is None, with the reason in ``problem``.
    """
    if pid is None:
        info, problem = read_info(None, fd) if fd is not None else (None, "caller pid unknown")
        return ExecFacts(info, children_unseen(info, coverage, None), problem)
    try:
        root = open_root(pid)
    except OSError as exc:
        info, problem = read_info(None, fd) if fd is not None else (None, f"caller's root: {exc}")
        return ExecFacts(info, children_unseen(info, coverage, None), problem)
    walked: Walked | None = None
    runs: Walked | None = None  # the file the kernel's own resolution of ``path`` reaches
    problem: str | None = None
    try:
        try:
            walked = walk(root, os.path.normpath(program))
        except OSError as exc:
            problem = str(exc)
        if fd is None and path is not None and _differs(path, program):
            try:
                runs = walk(root, path)
            except OSError as exc:
                problem = f"{path}: {exc}"
            fd = runs.fd if runs is not None else -1
        if fd == -1:  # the file that would run is unknown: nothing about it is known either
            identity, info = None, None
        else:
            identity = None if uid is None else _judge(root, program, uid, fd, walked)
            target = fd if fd is not None else (None if walked is None else walked.fd)
            if target is not None:
                info, problem = read_info(root, target)
            else:
                info = None
    finally:
        for done in (walked, runs):
            if done is not None:
                os.close(done.fd)
        os.close(root)
    # The caller's NoNewPrivs matters only for a set-ID or capability-carrying program (or a
    # script's interpreter of that kind): read /proc/PID/status only then (an open and a read per
    # exec otherwise, for a flag children_unseen would not look at).
    privs = no_new_privs(pid) if _gains_privileges(info) else None
    return ExecFacts(info, children_unseen(info, coverage, privs), problem, identity)


def _gains_privileges(info: FileInfo | None) -> bool:
    """True if ``info`` (or a script's interpreter) is set-user-ID, set-group-ID or has file
    capabilities: the only case where :func:`children_unseen` reads ``no_new_privs``."""
    while info is not None:
        if info.setuid or info.setgid or info.capabilities:
            return True
        info = info.interpreter_info
    return False


def _differs(path: str, program: str) -> bool:
    """True if the kernel's resolution of ``path`` may reach another file than ``program`` (its
    lexical normalisation) names: it has a ``..`` component (only ``.``, ``//`` and a trailing
    ``/`` are dropped by normalisation without changing what the kernel resolves)."""
    return path != program and ".." in path.split("/")


def _judge(root: int, program: str, uid: int, fd: int | None, walked: Walked | None) -> FileIdentity | None:
    """:func:`~execgate.server.identity.judge`, None when it fails (the caller vanished)."""
    try:
        return judge(root, program, uid, fd, walked)
    except OSError as exc:
        log.info("identifying %s failed: %s", program, exc)
        return None


#: Seconds a request waits for :func:`gather` before deciding without file facts.
GATHER_TIMEOUT_S = 2.0


async def learn(pid: int | None, program: str, coverage: Coverage, timeout_s: float = GATHER_TIMEOUT_S, *,
                uid: int | None = None, fd: int | None = None, path: str | None = None,
                local: bool = False) -> ExecFacts:
    """:func:`gather` in a worker thread (never on the event loop), bounded by ``timeout_s``
    seconds; past it nothing is known (the thread finishes on its own). ``fd`` is *owned*: the
    worker closes it when done, even after a timeout or cancellation. Never raises but for
    cancellation.

    ``local``: the file lies on a block device (``os.major(st_dev) != 0``: ext4, xfs…, not a
    plain FUSE mount, NFS or tmpfs) and its path has just been walked on the event loop (the
    seccomp backstop's query by exec): read here, on the loop, without the thread hand-off
    (~0.14 ms per exec, BENCHMARKS.md). A block device can still be served by a process (fuseblk,
    nbd, a loop device over a FUSE file, a suspended device-mapper target: root's to set up); its
    reads can stall the loop as its path walk already can (README, "Bounded work")."""
    def owned() -> ExecFacts:
        try:
            return gather(pid, program, coverage, uid=uid, fd=fd, path=path)
        finally:
            if fd is not None:
                os.close(fd)

    if local:
        return owned()
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.to_thread(owned)
    except TimeoutError:
        log.warning("reading %s for the policy took over %g s; deciding without its file facts", program, timeout_s)
        return ExecFacts(None, children_unseen(None, coverage, None), f"reading the file took over {timeout_s:g} s")
