"""Red team, third round, of the query by exec and its backstop path resolution (de168d9): a
hostile script inside ``execgate run`` (seccomp backstop on, as root and as an unprivileged
account) that has read our source.

Finding 1 — the mount-namespace check does not mean "the caller's /proc is the session's".
de168d9 resolves ``/proc/self/fd/N`` as the caller's fd N only for a caller in the session's
mount namespace. ``chroot(2)`` leaves the mount namespace alone and changes the root the kernel
resolves ``/proc/self/fd/N`` from: JAIL/proc/self/fd/N, a plain file the caller wrote. The
backstop's walk still stops at the leading ``proc`` (identity.walk) and reads the caller's fd N.
Root chroots as it is; an unprivileged user first makes a user namespace *without* a mount
namespace (``unshare(CLONE_NEWUSER)``), where it holds CAP_SYS_CHROOT. No sandbox (in bwrap:
no user namespaces, no capabilities). Deterministic, one try. The same attacks as red team 2's
``test_a_proc_of_its_own_*`` (which pass on de168d9 now), by chroot instead of a mount.

Finding 2 — a chroot makes an exact allowed path (``/usr/bin/true``) name the caller's own file.
Finding 3 — a procfs mounted elsewhere than ``/proc`` (``./p``, in a mount namespace of the
caller's own) was walked as the server's: ``p/self`` read by the server is the server.

All pre-existing (they fail on ef88737 too). Fixed: the backstop refuses every exec of a caller
whose root directory is not the session's (server/backstop.py ``_root_of``), and identity.walk
takes the leading ``proc`` for the caller's ``/proc`` only if it is a procfs, and refuses any
symlink read inside a procfs (its magic links are the reader's) — fstatfs(2) ``f_type``.
(A fourth finding, a session nested in a backstopped session decided by the outer one's rules,
is the documented design: the outer gate governs what runs inside it, wrapper/native/README.md.)
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


def _session(attacker: Attacker, rules: str, script: str, *extra: str,
             sandbox: str = "none") -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """``execgate run`` in the attacker's workdir with ``chroot.py`` (data/qbe_chroot.py) and
    ``mark``: a *static* ELF marker (it runs in a jail with no libraries) that writes its marker
    by a path relative to the working directory (chroot keeps it)."""
    work = attacker.workdir()
    shutil.copy(DATA / "qbe_chroot.py", work / "chroot.py")
    attacker.static_marker(DATA / "qbe_marker.c")
    return gated_run(attacker, rules, script, *extra, sandbox=sandbox)


def test_a_chroot_proc_after_a_wrapper_run_runs_a_denied_file(attacker: Attacker) -> None:
    """Default deny, one Run rule for /usr/bin/true: the process asks over the session's socket
    as the wrapper does (fd N open on /usr/bin/true: Run, the backstop now expects that file and
    argv from it), chroots (same mount namespace) and execs ``/proc/self/fd/N``: the backstop
    finds the caller's fd N to be the approved file and continues; the kernel runs
    JAIL/proc/self/fd/N, the marker."""
    py = sys.executable
    script = f"./mark; echo m=$?; {py} chroot.py --asked /usr/bin/true /usr/bin/true ./mark true; echo end"
    done, records = _session(attacker, deny_by_default_rules(), script, "--no-default-rules")
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "ASKED Run" in done.stdout and "MNTNS same" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"denied file ran as /usr/bin/true: {out}\n{records[-1:]}"


def test_a_chroot_proc_dodges_the_file_facts_of_a_plain_exec(attacker: Attacker) -> None:
    """Default rules plus a ``file_kind`` rule denying static programs: the plain exec of
    ``/proc/self/fd/N`` after the chroot is judged with the facts of fd N (./ok, a dynamic ELF,
    real_path ok) and the kernel runs the static marker the rules deny by kind and by name."""
    rules = """
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
    py = sys.executable
    script = f"cp /bin/true ./ok; ./mark; echo m=$?; {py} chroot.py --plain ./ok ./ok ./mark ok; echo end"
    done, records = _session(attacker, rules, script)
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "MNTNS same" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"static denied file ran, judged as ./ok: {out}\n{records[-1:]}"


def test_a_chroot_makes_an_allowed_path_name_its_own_file(attacker: Attacker) -> None:
    """Pre-existing, same root cause without /proc: default deny, one Run rule for the exact path
    /usr/bin/true. After ``unshare(CLONE_NEWUSER)`` (root: none) and a chroot into a directory of
    its own, the caller's /usr/bin/true is the marker; the backstop walks the path in the caller's
    root, finds the file at the path as named (``_names_the_file``) and gives the exact-path Run
    rule's Run. No sandbox; in bwrap neither a user namespace nor chroot is allowed."""
    py = sys.executable
    script = f"./mark; echo m=$?; {py} chroot.py --path ./mark /usr/bin/true ./mark true; echo end"
    done, records = _session(attacker, deny_by_default_rules(), script, "--no-default-rules")
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "MNTNS same" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"the jail's /usr/bin/true ran: {out}\n{records[-1:]}"


def test_a_procfs_elsewhere_is_walked_as_the_servers_own(attacker: Attacker) -> None:
    """Pre-existing, the walk's other way into procfs: identity.walk refuses only a path whose
    first component is ``proc``. /proc bind-mounted at ./p (root: in a mount namespace of its
    own; anyone else: with a user namespace) is walked as a plain directory by the server:
    ``p/self`` is readlink'ed — the *server's* pid — and ``p/<server>/fd/K`` is the server's fd
    K (its terminal, /dev/null, the audit log...), whose name the walk follows and the policy
    judges. The kernel runs the caller's fd K: the static marker, denied by name and by kind."""
    rules = """
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
    work = attacker.workdir()
    shutil.copy(DATA / "qbe_procbind.py", work / "pb.py")
    py = sys.executable
    script = f"./mark; echo m=$?; {py} pb.py ./mark ok; echo end"
    done, records = _session(attacker, rules, script)
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "MOUNTED" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"static denied file ran: {out}\n{records[-2:]}"
