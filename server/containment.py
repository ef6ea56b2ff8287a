"""Containment: nothing a session starts outlives it (docs/DESIGN.md §3, §8).

Process groups are not enough: ``setsid`` takes a daemon out of its group, and a dead parent's
children are reparented away from us. Every process the server spawns for a session (the shell or
its bwrap, each escalated command) is started by ``execgate-contain``
(``wrapper/native/contain_exec.c``), which joins the session's containment *before* the program
runs: nothing the program forks is born outside it. One mechanism per process (:func:`choose`):

* ``cgroup`` — a cgroup v2 hierarchy where this process may create a child of its own cgroup and
  move a process into it, with ``cgroup.kill`` (Linux ≥ 5.14). The process gets
  ``execgate-<pid>-<hex>`` below its own cgroup, each session a child ``s<N>``, which the helper
  joins by writing ``0`` to its ``cgroup.procs``. Closing the session writes ``1`` to
  ``cgroup.kill`` (SIGKILL to every process in it), waits for ``populated 0`` in ``cgroup.events``
  and removes it (cgroups(7); the kernel's Documentation/admin-guide/cgroup-v2.rst). A detached
  ``/bin/sh`` **supervisor** reads a pipe whose only write end is in this process: when this
  process dies, SIGKILL included, it reads EOF, kills ``execgate-<pid>-<hex>`` whole and removes
  it. Per session: the host program's own processes are never touched.
* ``subreaper`` — ``prctl(PR_SET_CHILD_SUBREAPER)`` (prctl(2)): orphans are reparented to this
  process instead of init; closing a session SIGKILLs every child of this process that no open
  session is running (a walk of ``/proc/*/stat``), with their descendants, and reaps them.
  Spawned processes get ``PR_SET_PDEATHSIG`` SIGKILL, sent when the *thread* that spawned them
  exits (spawns come from the event loop's thread). Process-wide: the CLI's fallback, an
  explicit choice in the Python API (it would kill the host program's own children).
* ``none`` — process groups only (the API's fallback).

After a SIGKILL of this process: with ``cgroup`` nothing that stayed in the cgroup survives (a
root process outside any sandbox can move itself out). With ``subreaper`` the parent-death signal
reaches direct children only: the shell (or its bwrap, whose pid namespace takes everything inside
along) and running escalated commands die; what an unsandboxed shell or escalated command started
is reparented to init and survives. No later run can tell, so the mode's note says it.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

log = logging.getLogger(__name__)

MODES = ("auto", "cgroup", "subreaper", "none")
#: Seconds a session's close waits for its killed processes to be gone.
KILL_WAIT_S = 5.0
_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>

#: The supervisor (run by /bin/sh, detached): fd 3 is the pipe, $1 the process's cgroup.
_SUPERVISOR = r"""
trap '' HUP INT QUIT TERM PIPE
exec 3<&0
(
  read _ <&3
  echo 1 > "$1/cgroup.kill"
  n=0
  while [ -d "$1" ] && [ "$n" -lt 300 ]; do
    find "$1" -depth -mindepth 1 -type d -exec rmdir {} +
    rmdir "$1" || { sleep 0.1; n=$((n + 1)); }
  done
) </dev/null >/dev/null 2>&1 &
"""


class ContainmentError(Exception):
    """Raised when the containment asked for cannot be set up here; the message says why."""


@dataclass(frozen=True)
class Placement:
    """How :func:`execgate.server.spawn.spawn` starts one process of a session.

    Attributes:
        helper: absolute path of ``execgate-contain``.
        cgroup_procs: the session cgroup's ``cgroup.procs`` file the process joins, or None.
        pdeathsig: give the process SIGKILL as its parent-death signal (tied to this process).
    """

    helper: str
    cgroup_procs: str | None = None
    pdeathsig: bool = False

    def argv(self, command: Sequence[str | bytes], arg0: str | bytes | None, errfd: int) -> list[str | bytes]:
        """``execgate-contain [--cgroup P] [--pdeathsig PID] --errfd N -- PROGRAM ARGV0 ARGS…``."""
        out: list[str | bytes] = [self.helper]
        if self.cgroup_procs is not None:
            out += ["--cgroup", self.cgroup_procs]
        if self.pdeathsig:
            out += ["--pdeathsig", str(os.getpid())]
        return [*out, "--errfd", str(errfd), "--", command[0],
                command[0] if arg0 is None else arg0, *command[1:]]


class Scope:
    """One session's share of the containment: :attr:`placement` for its spawns, :meth:`close`."""

    placement: Placement | None = None

    async def close(self, exclude: Iterable[int] = ()) -> None:
        """Kill what is left of the session; ``exclude``: pids other sessions run. Idempotent."""


class _CgroupScope(Scope):
    def __init__(self, path: str, helper: str) -> None:
        self.path = path
        self.placement = Placement(helper, cgroup_procs=os.path.join(path, "cgroup.procs"))
        self._closed = False

    async def close(self, exclude: Iterable[int] = ()) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            _write(os.path.join(self.path, "cgroup.kill"), "1")
        except OSError as exc:
            log.error("cannot kill cgroup %s: %s", self.path, exc)
            return
        import asyncio  # here: execgate run starts the containment's probe before importing asyncio

        deadline = time.monotonic() + KILL_WAIT_S
        while _populated(self.path) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        try:  # bottom up: a nested execgate run (as root, unsandboxed) made cgroups inside
            for parent, dirs, _ in os.walk(self.path, topdown=False):
                for name in dirs:
                    os.rmdir(os.path.join(parent, name))
            os.rmdir(self.path)
        except OSError as exc:  # still populated: a process in uninterruptible sleep
            log.warning("cgroup %s not removed: %s", self.path, exc)


class _SweepScope(Scope):
    def __init__(self, helper: str | None) -> None:
        self.placement = None if helper is None else Placement(helper, pdeathsig=True)

    async def close(self, exclude: Iterable[int] = ()) -> None:
        killed = await sweep_orphans(set(exclude))
        if killed:
            log.info("killed %d process(es) left behind by the session: %s", len(killed), killed)


@dataclass(frozen=True)
class Containment:
    """The mechanism in force for this process's sessions.

    Attributes:
        mode: "cgroup", "subreaper" or "none".
        note: one line for the user: the mode, why, and what survives a SIGKILL of this process.
    """

    mode: str
    note: str
    helper: str | None = None
    cgroup: str | None = None  # the process's cgroup directory, mode "cgroup"

    def open_scope(self) -> Scope:
        """A new session's scope (for "cgroup": a fresh child cgroup).

        Raises:
            OSError: the session's cgroup cannot be created.
        """
        if self.mode == "cgroup":
            assert self.cgroup is not None and self.helper is not None
            path = os.path.join(self.cgroup, f"s{next(_COUNTER)}")
            os.mkdir(path)
            return _CgroupScope(path, self.helper)
        if self.mode == "subreaper":
            return _SweepScope(self.helper)
        return Scope()


NONE = Containment("none", "containment: process groups only (escalated commands' groups are killed "
                           "with the session; a daemon that left its group survives)")


_COUNTER = itertools.count(1)
_LOCK = threading.Lock()
_PROCESS_CGROUP: dict[int, str] = {}  # pid → this process's execgate-<pid>-<hex> cgroup
_SUPERVISOR_PIPE: list[int] = []  # write end; never closed: its EOF tells the supervisor we died


def choose(mode: str = "auto", *, fallback: str = "none") -> Containment:
    """The containment for ``mode``; ``auto`` is ``cgroup`` where it works here, else ``fallback``.

    ``subreaper`` (chosen or fallen back to) makes this process a child subreaper at once.

    Raises:
        ContainmentError: ``cgroup`` asked for and unavailable (the reason), the subreaper's prctl
            failed, or an unknown mode.
    """
    if mode not in MODES or fallback not in ("subreaper", "none"):
        raise ContainmentError(f"unknown containment {mode!r} (fallback {fallback!r})")
    if mode == "none":
        return NONE
    helper, why = _helper()
    if mode in ("auto", "cgroup"):
        cgroup, why_not = (None, why) if helper is None else _process_cgroup(helper)
        if cgroup is not None:
            return Containment("cgroup", f"containment: cgroup {cgroup} (cgroup.kill at session end; a supervisor "
                               "kills it if this process is killed)", helper, cgroup)
        if mode == "cgroup":
            raise ContainmentError(f"no usable cgroup v2: {why_not}")
        why = why_not
        mode = fallback
        if mode == "none":
            return Containment("none", f"{NONE.note}; no cgroup: {why}")
    set_child_subreaper()
    if helper is None:  # orphans are still found and killed; nothing dies with this process
        return Containment("subreaper", f"containment: subreaper, no parent-death signal ({why}); orphans are "
                           "killed at session end; if this process is SIGKILLed, only a bwrap sandbox's "
                           "processes die with it: daemons of unsandboxed commands survive")
    return Containment("subreaper", f"containment: subreaper (no cgroup: {why}); orphans are killed at session "
                       "end; if this process itself is SIGKILLed, only its direct children and a bwrap "
                       "sandbox's processes die with it: daemons of unsandboxed commands survive", helper)


def _helper() -> tuple[str | None, str]:
    from execgate.wrapper.artifacts import NativeArtifactMissing, contain_helper_path

    try:
        return str(contain_helper_path()), ""
    except NativeArtifactMissing as exc:
        return None, str(exc)


def set_child_subreaper() -> None:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``: orphaned descendants reparent to this process.

    Raises:
        ContainmentError: the prctl failed.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise ContainmentError(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")


# ------------------------------------------------------------------ cgroup v2


def own_cgroup_dir(mountinfo: str = "/proc/self/mountinfo", cgroup: str = "/proc/self/cgroup") -> str | None:
    """The directory of this process's cgroup in a mounted cgroup v2 hierarchy, or None.

    The unified hierarchy's line in ``/proc/self/cgroup`` is ``0::PATH`` (cgroups(7)); a
    ``cgroup2`` line of ``/proc/self/mountinfo`` (proc(5): field 4 is the root of the mount within
    the hierarchy, field 5 the mount point, the file system type follows `` - ``) whose root
    contains PATH shows it at mount point + the rest of PATH. Never hard-coded: often
    ``/sys/fs/cgroup``, ``/sys/fs/cgroup/unified`` on hybrid machines.
    """
    try:
        with open(cgroup, encoding="utf-8") as f:
            own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
        with open(mountinfo, encoding="utf-8") as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    if own is None or own.endswith(" (deleted)"):
        return None
    for line in mounts:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest.startswith("cgroup2 "):
            continue
        root, point = _unescape(parts[3]), _unescape(parts[4])
        if own == root or own.startswith(root.rstrip("/") + "/"):
            return os.path.normpath(os.path.join(point, own[len(root):].lstrip("/")))
    return None


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _process_cgroup(helper: str) -> tuple[str | None, str]:
    """This process's ``execgate-<pid>-<hex>`` cgroup (made and probed once, with its supervisor), or
    None and why not."""
    with _LOCK:
        pid = os.getpid()
        if pid in _PROCESS_CGROUP:
            return _PROCESS_CGROUP[pid], ""
        base = own_cgroup_dir()
        if base is None:
            return None, "no cgroup v2 hierarchy holds this process"
        path = os.path.join(base, f"execgate-{pid}-{uuid.uuid4().hex[:8]}")  # pids recur across runs
        try:
            os.mkdir(path)
        except OSError as exc:
            return None, f"cannot create a cgroup in {base}: {exc.strerror}"
        why = _probe(path, helper)
        if why is not None:
            _rmdir_quietly(path)
            return None, why
        try:
            _start_supervisor(path)
        except OSError as exc:
            _rmdir_quietly(path)
            return None, f"cannot start the cgroup supervisor: {exc}"
        _PROCESS_CGROUP[pid] = path
        return path, ""


def _probe(path: str, helper: str) -> str | None:
    """Why a process cannot be moved into, and killed with, a child of ``path``; None if it can."""
    if not os.path.exists(os.path.join(path, "cgroup.kill")):
        return "cgroup.kill is missing (Linux < 5.14)"
    probe = os.path.join(path, "probe")
    try:
        os.mkdir(probe)
        done = subprocess.run([helper, "--cgroup", os.path.join(probe, "cgroup.procs"), "--", "/bin/true", "true"],
                              capture_output=True, text=True, timeout=10, check=False, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot probe {path}: {exc}"
    finally:
        _rmdir_quietly(probe)
    if done.returncode != 0:
        return f"cannot move a process into {path}: {done.stderr.strip() or done.returncode}"
    return None


def _start_supervisor(path: str) -> None:
    """Start the detached supervisor that kills and removes ``path`` once this process is gone."""
    read_end, write_end = os.pipe()  # both non-inheritable: no other child holds the write end
    try:
        outer = subprocess.Popen(["/bin/sh", "-c", _SUPERVISOR, "execgate-cgroup-supervisor", path],
                                 stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env={"PATH": "/usr/bin:/bin"}, cwd="/", start_new_session=True)
        outer.wait(timeout=10)  # it backgrounds the supervisor and exits at once
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _SUPERVISOR_PIPE.append(write_end)


def _populated(path: str) -> bool:
    try:
        with open(os.path.join(path, "cgroup.events"), encoding="ascii") as f:
            return "populated 1" in f.read()
    except OSError:
        return False


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _rmdir_quietly(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


# ------------------------------------------------------------------ subreaper


class Proc(NamedTuple):
    """One line of :func:`process_table`: proc(5) ``/proc/PID/stat`` fields 4, 3, 5 and 6."""

    ppid: int
    state: str
    pgrp: int
    session: int


def process_table() -> dict[int, Proc]:
    """pid → :class:`Proc` of every process, from ``/proc/PID/stat`` (proc(5): the fields after
    the parenthesised command name are state, ppid, pgrp, session, …)."""
    table: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 4:
            table[int(name)] = Proc(int(fields[1]), fields[0].decode("ascii", "replace"), int(fields[2]),
                                    int(fields[3]))
    return table


def descendants(table: dict[int, Proc], roots: Iterable[int]) -> list[int]:
    """``roots`` and every process below them in ``table`` (:func:`process_table`)."""
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


async def sweep_orphans(exclude: set[int], timeout_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL every child of this process not in ``exclude``, and all their descendants, until
    none is left (or ``timeout_s`` seconds passed); reap them. Returns the pids killed.

    A killed process's own children are reparented to us (we are the subreaper), so each round
    finds what the previous one orphaned. A pid read from ``/proc`` may be gone by the time its
    kill comes: a process that forks and exits at once (its child doing the same) is never the
    one read. So each victim's process group is killed too, with one ``kill(-pgrp)`` (kill(2)):
    the kernel signals every member at once, and a fork racing with it either is signalled too
    or fails — when the group lies in a session other than this process's own and those of the
    ``exclude`` processes (one the session's shell or a process of it made with setsid(2): all
    its members descend from ours; a group of our own session may hold the user's other jobs).
    A process that makes a new session (or process group) in every generation still races the
    sweep: only the cgroup containment is certain (README, Limits).
    """
    import asyncio

    me, own_session, killed = os.getpid(), os.getsid(0), set()
    deadline = time.monotonic() + timeout_s
    while True:
        table = process_table()
        roots = [pid for pid, proc in table.items() if proc.ppid == me and pid not in exclude]
        victims = descendants(table, roots)
        if not victims:
            return sorted(killed)
        spared = {own_session, *(table[pid].session for pid in exclude if pid in table)}
        groups = {table[pid].pgrp for pid in victims if pid in table and table[pid].session not in spared}
        for pgrp in groups - {0, 1, os.getpgrp()}:
            _kill(-pgrp)
        for pid in victims:
            if table.get(pid, Proc(0, "", 0, 0)).state != "Z":
                _kill(pid)
                killed.add(pid)
        for pid in roots:
            _reap(pid)
        if time.monotonic() > deadline:
            log.warning("processes left behind by the session still run (%d, e.g. pids %s)", len(victims),
                        ", ".join(map(str, victims[:10])))
            return sorted(killed)
        await asyncio.sleep(0.01)


def _kill(pid: int) -> None:
    """SIGKILL process ``pid`` (a negative one: that process group)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
