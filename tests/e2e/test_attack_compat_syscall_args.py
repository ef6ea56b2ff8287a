"""Red team of 2026-12-02 (on 0bc5a1e): a hostile script inside ``execgate run`` (seccomp backstop on)
that has read our source, against the backstop's reading of an i386 exec system call made by a
64-bit process (``int 0x80``).

Finding — the backstop reads the path (and argv) at the 64-bit value of each argument as the
seccomp notification carries it (``seccomp_data.args``: the full ``rbx``, ``rcx`` …), while the
kernel's compat ``execve``/``execveat`` use only their low 32 bits. A 64-bit process maps a page
at ``LOW`` (< 4 GiB) holding the marker's path and one at ``HIGH`` (``HIGH & 0xffffffff == LOW``)
holding ``/usr/bin/true``, and makes ``int 0x80`` execve (11) with ``rbx = HIGH``: the backstop
judges ``/usr/bin/true`` (exact-path Run, identity checked: it *is* that file) and continues; the
kernel runs the marker. With ``execveat`` (358) the backstop reads ``""`` (+ ``AT_EMPTY_PATH``:
the file open on ``dirfd``, ``/usr/bin/true``) and the kernel an absolute path to the marker.
Deterministic, one try, no second thread, no race; with the sandbox (bwrap) and without, root
and an unprivileged account. The audit log records a Run of ``/usr/bin/true``. With the session's
``EXEC_WRAPPER`` as the decoy (``execve-as-wrapper``) the exec takes the wrapper's fast path:
continued without any decision, and the audit log has no line for it at all.

Only the interpreter (allowed by ``deny_by_default_rules``) and ``/usr/bin/true`` are allowed;
the marker is denied by name and by the default.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from attack_support import Attacker, deny_by_default_rules, gated_run

pytestmark = [pytest.mark.e2e]

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
@pytest.mark.parametrize("call", ["execve", "execveat", "execve-as-wrapper"])
def test_an_i386_exec_from_a_64bit_process_is_judged_by_the_pointer_the_kernel_uses(
        attacker: Attacker, call: str, sandbox: str) -> None:
    """Default deny (the interpreter and /usr/bin/true run): ``./mark`` is denied; the same file
    exec'd by ``int 0x80`` with the path pointer's upper 32 bits pointing at the decoy's name must
    be denied too (or refused), never run."""
    work = attacker.workdir()
    shutil.copy(DATA / "compat_split32.py", work / "split32.py")
    attacker.static_marker(DATA / "qbe_marker.c")
    mode, decoy = ("execve", '"$EXEC_WRAPPER"') if call == "execve-as-wrapper" else (call, "/usr/bin/true")
    script = (f"./mark; echo m=$?; {sys.executable} split32.py {mode} {work / 'mark'} {decoy}; "
              "echo end=$?")
    done, records = gated_run(attacker, deny_by_default_rules(), script, "--no-default-rules", sandbox=sandbox)
    out = done.stdout + done.stderr
    assert "m=1" in done.stdout and "end=" in done.stdout, out
    assert "the marker must never run" in done.stderr, out  # the plain exec is denied
    assert not attacker.marker_ran("mark"), (
        f"the denied marker ran through an int 0x80 {call} judged as {decoy}: {out}\n{records[-1:]}")
    # Judged by the string the kernel reads: the marker, denied (as ./mark was), in the audit log.
    assert [(r["program"], r["decision"]) for r in records if r["program"].endswith("/mark")] == [
        (str(work / "mark"), "deny"), (str(work / "mark"), "deny")], records
