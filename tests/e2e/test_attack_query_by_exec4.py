"""Red team, fourth round (2ce0bd9): a hostile script inside ``execgate run`` (seccomp backstop
on) that has read our source, against the root-directory check, the procfs detection of
identity.walk and the synchronous file facts of a query by exec.

Finding 1 — ``/proc/thread-self/fd/N`` is read by the server as ``/proc/TID/fd/N``, while the
kernel resolves ``/proc/thread-self`` to ``PID/task/TID``: another directory entry of the same
procfs. Root, in the session's own mount namespace (no sandbox), bind-mounts a directory of its
own over ``/proc/PID/task/PID/fd`` (procfs entries are mount points like any other): the mount
namespace is the session's, the root is the session's, ``/proc`` is a procfs — every check of
2ce0bd9 passes; the server judges fd N (``/usr/bin/true``, ``./ok``), the kernel runs
OVER/N (the static marker, denied by name and by kind). Deterministic, one try.

Finding 2 — the root check does not make "absolute paths name the files the rules name". In a
mount namespace of its own (root: ``unshare(CLONE_NEWNS)``; an unprivileged account with a user
namespace too), the caller bind-mounts its own file over ``/usr/bin/true``: its root directory
is still the session's inode, the backstop walks the path in the caller's view and gives the
exact-path rule's Run to the marker. Same root cause as red team 3's chroot finding 2.

Both need ``--sandbox none`` (in bwrap: no user namespace, no capability: EPERM, checked) and
both fail on ef88737 too (pre-existing).

Fixed: ``/proc/thread-self/fd/N`` is read by the kernel's own name for it,
``/proc/TGID/task/TID/fd/N`` (identity.open_fd_of); a caller in a mount namespace of its own is
refused unless the exec's path names, in the session's view (the server's, without a sandbox),
the very file it runs (server/backstop.py ``_names_the_sessions``). All four cases failed on
2ce0bd9 and pass now.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attack_support import Attacker, deny_by_default_rules, gated_run

pytestmark = [pytest.mark.e2e]

DATA = Path(__file__).parent / "data"

STATIC_DENIED = """
[[rule]]
id = "no-static"
file_kind = ["static"]
decision = "deny"
justification = "no static programs"

[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"
"""


def _session(attacker: Attacker, rules: str, script: str, *extra: str,
             sandbox: str = "none") -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """``execgate run`` in the attacker's workdir with ``fdover.py`` (data/qbe_fdover.py) and
    ``mark``, a static ELF marker writing its marker by a relative path."""
    work = attacker.workdir()
    shutil.copy(DATA / "qbe_fdover.py", work / "fdover.py")
    attacker.static_marker(DATA / "qbe_marker.c")
    return gated_run(attacker, rules, script, *extra, sandbox=sandbox)


@pytest.mark.parametrize("attacker", ["root"], indirect=True)  # a mount in the session's namespace needs root
def test_thread_self_fd_over_a_bind_mount_after_a_wrapper_run(attacker: Attacker) -> None:
    """Default deny, one Run rule for /usr/bin/true: the process asks over the session's socket
    as the wrapper does (fd N on /usr/bin/true: Run, the backstop expects that file and argv),
    bind-mounts ./over-PID over /proc/PID/task/PID/fd and execs ``/proc/thread-self/fd/N``: the
    backstop reads /proc/PID/fd/N (the approved file) and continues; the kernel runs
    over-PID/N, the marker."""
    py = sys.executable
    script = f"./mark; echo m=$?; {py} fdover.py --asked /usr/bin/true /usr/bin/true ./mark true; echo end"
    done, records = _session(attacker, deny_by_default_rules(), script, "--no-default-rules")
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "ASKED Run" in done.stdout and "MOUNTED" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"denied file ran as /usr/bin/true: {out}\n{records[-1:]}"


@pytest.mark.parametrize("attacker", ["root"], indirect=True)  # a mount in the session's namespace needs root
def test_thread_self_fd_over_a_bind_mount_dodges_the_file_facts(attacker: Attacker) -> None:
    """Default rules plus a ``file_kind`` rule denying static programs: the plain exec of
    ``/proc/thread-self/fd/N`` is judged with the facts of fd N (./ok, a dynamic ELF) and the
    kernel runs the static marker the rules deny by kind and by name."""
    py = sys.executable
    script = f"cp /bin/true ./ok; ./mark; echo m=$?; {py} fdover.py --plain ./ok ./ok ./mark ok; echo end"
    done, records = _session(attacker, STATIC_DENIED, script)
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "MOUNTED" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"static denied file ran, judged as ./ok: {out}\n{records[-1:]}"


def test_a_mount_namespace_bind_mount_makes_an_allowed_path_name_its_own_file(attacker: Attacker) -> None:
    """Default deny, one Run rule for the exact path /usr/bin/true. In a mount namespace of its
    own (root: unshare(CLONE_NEWNS); anyone else with a user namespace), the caller bind-mounts
    its static marker over /usr/bin/true: its root directory is the session's inode (the root
    check passes), the backstop walks the path in the caller's view, finds the marker at the
    allowed path and gives the exact-path rule's Run."""
    work = attacker.workdir()
    shutil.copy(DATA / "qbe_mntover.py", work / "mntover.py")
    attacker.static_marker(DATA / "qbe_marker.c")
    py = sys.executable
    script = f"./mark; echo m=$?; {py} mntover.py ./mark /usr/bin/true true; echo end"
    done, records = gated_run(attacker, deny_by_default_rules(), script, "--no-default-rules")
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "MOUNTED" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"the bind-mounted /usr/bin/true ran: {out}\n{records[-1:]}"
