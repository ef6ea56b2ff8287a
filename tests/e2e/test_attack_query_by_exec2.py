"""Red team, second round, of the query by exec (server/protocol.py "Query by exec", commit
5003b75): a hostile script inside ``execgate run`` (seccomp backstop on, as root and as an
unprivileged account) that has read our source.

Finding 1 — ``/proc/self/fd/N`` is the caller's fd only in the server's mind. The backstop
accepts a marked exec of ``/proc/self/fd/N`` and identifies "fd N of the caller" through the
server's own ``/proc/TID/fd/N`` (identity.walk ``fds_of``); after ``CONTINUE`` the kernel looks
the path up *in the caller's mount namespace*. Without a sandbox, root — or any user, with a user
namespace (``unshare(CLONE_NEWUSER|CLONE_NEWNS)``, no privilege needed where unprivileged user
namespaces are enabled, as here) — mounts a tmpfs over its own ``/proc`` holding ``self/fd/N``:
any file. No race, no thread, one try. With the 6th argument the caller names the judged file as
it likes: under ``default = "deny"`` with one exact-path Run rule (``/usr/bin/true``), fd N open
on ``/usr/bin/true`` and named so, a program the rules deny by name runs, audited as
``/usr/bin/true`` with its facts (real_path, file_kind). On ef88737 the same exec is an ordinary
exec of ``/proc/self/fd/N``, judged by that name: default deny, refused. The socket query and the
wrapper are immune: they run the fd itself (``execveat(fd, "", AT_EMPTY_PATH)``), no lookup.

Finding 2 (pre-existing, same root cause) — the plain, unmarked exec of ``/proc/self/fd/N``
through such a ``/proc`` is judged with the facts of fd N (file_kind, real_path) while another
file runs: under the default rules (default run) a program denied by its real name (and a
``file_kind`` rule) is dodged. Fails on ef88737 too.

Finding 3 — ``self`` is the thread group to the kernel, the calling thread to the server. A
thread made by ``clone(CLONE_VM|CLONE_THREAD|CLONE_SIGHAND)`` without ``CLONE_FILES`` has its own
fd table; the backstop reads ``/proc/TID/fd/N`` (the thread's), the kernel's ``/proc/self`` is
the thread group (the leader's table). Deterministic (no race: nothing changes between the check
and the exec), unprivileged, inside bwrap. Marked (new: passes on ef88737) and plain
(pre-existing, fails on ef88737 too). ``/proc/thread-self/fd/N`` would be consistent.

In a bwrap sandbox findings 1-2 do not work: ``--disable-userns`` and ``--cap-drop ALL`` leave no way to
mount (the helper prints ``UNSHARE EPERM``), checked by the bwrap case of test 1.

Fixed: the query by exec is ``execveat(fd, "", AT_EMPTY_PATH)`` (no path for the kernel to
resolve; the mark behind the unused 6th argument), so the helpers' marked ``execve`` of
``/proc/self/fd/N`` here is an ordinary exec; and the backstop resolves ``/proc/self/fd/N`` in
the thread group leader's fd table (``thread-self`` in the thread's), only for a caller in the
session's own mount namespace (elsewhere its ``/proc`` may be its own: refused as unnamed).
All six pre-existing cases failed on ef88737 and on 5003b75; the whole file passes now.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attack_support import Attacker, deny_by_default_rules, gated_run
from execgate.server.sandbox import bwrap_usable

pytestmark = [pytest.mark.e2e]

OVER = Path(__file__).parent / "data" / "qbe_proc_over.py"


def _session(attacker: Attacker, rules: str, script: str, *extra: str,
             sandbox: str = "none") -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    work = attacker.workdir()
    attacker.marker_program(work, "mark")
    shutil.copy(OVER, work / "over.py")
    return gated_run(attacker, rules, script, *extra, sandbox=sandbox)


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_a_proc_of_its_own_runs_a_denied_file_under_an_allowed_name(attacker: Attacker, sandbox: str) -> None:
    if sandbox == "bwrap" and bwrap_usable() is not None:
        pytest.skip(f"bwrap unusable: {bwrap_usable()}")
    py = sys.executable
    script = (f"/usr/bin/true; echo t=$?; ./mark; echo m=$?; "
              f"{py} over.py /usr/bin/true /usr/bin/true ./mark true; echo end")
    done, records = _session(attacker, deny_by_default_rules(), script, "--no-default-rules", sandbox=sandbox)
    out = done.stdout + done.stderr
    assert "t=0" in done.stdout and "m=" in done.stdout and "end" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"denied file ran as /usr/bin/true: {out}\n{records[-1:]}"


def test_a_proc_of_its_own_dodges_the_file_facts_of_a_plain_exec(attacker: Attacker) -> None:
    py = sys.executable
    rules = """
[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"
"""
    script = f"cp /bin/true ./ok; ./mark; echo m=$?; {py} over.py --plain ./ok ./ok ./mark ok; echo end"
    done, records = _session(attacker, rules, script)
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "end" in done.stdout, out
    # The fake /proc is no procfs: the server walks it as the directory it is, as the kernel does,
    # and judges the file that runs — a copy of the marker under another name, which a rule on the
    # name "mark" does not cover (as `cp mark x; ./x`) — never with ./ok's facts (an ELF).
    judged = [r for r in records if r["program"] == "/proc/self/fd/3"]
    assert not attacker.marker_ran("mark") or (judged and all(r["file_kind"] == ["script"] for r in judged)), \
        f"denied file ran, judged as ./ok's facts: {out}\n{records[-1:]}"


def test_a_proc_of_its_own_after_a_wrapper_run_runs_a_denied_file(attacker: Attacker) -> None:
    """Finding 1's way without the mark (pre-existing): the process asks over the socket as the
    wrapper does (fd N open on /usr/bin/true, a Run: the backstop now expects that file and argv
    from it), then execs ``/proc/self/fd/N`` by path through its own ``/proc``: the backstop finds
    "fd N" to be the approved file and continues; the kernel runs the marker."""
    py = sys.executable
    script = f"{py} over.py --asked /usr/bin/true /usr/bin/true ./mark true; echo end"
    done, records = _session(attacker, deny_by_default_rules(), script, "--no-default-rules")
    out = done.stdout + done.stderr
    assert "ASKED" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"denied file ran as /usr/bin/true: {out}\n{records[-1:]}"


THREAD = Path(__file__).parent / "data" / "qbe_thread_files.c"
MARKER_C = Path(__file__).parent / "data" / "qbe_marker.c"


def _thread_session(attacker: Attacker, rules: str, script: str, *extra: str,
                    sandbox: str = "bwrap") -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """Finding 3's session: ``tf`` (qbe_thread_files.c) and ``mark``, an ELF marker, built here."""
    work = attacker.workdir()
    for src, out, defs in ((THREAD, "tf", []), (MARKER_C, "mark", [f'-DMARKER="{attacker.markers / "mark"}"'])):
        subprocess.run(["gcc", "-O1", *defs, "-o", str(work / out), str(src)], check=True)
        os.chown(work / out, attacker.uid, attacker.gid)
    (work / "rules.toml").write_text(rules.replace("@WORK@", str(work)))
    audit = work / "audit.jsonl"
    done = attacker.execgate("run", "-q", "--sandbox", sandbox, "--seccomp", "on", "--rules", str(work / "rules.toml"),
                             "--audit-log", str(audit), "--cwd", str(work), *extra, "--", script, cwd=work)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, records


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_thread_with_its_own_fd_table_runs_a_denied_file_under_an_allowed_name(attacker: Attacker,
                                                                                  sandbox: str) -> None:
    """Finding 3 (new): a thread made by clone(CLONE_VM|CLONE_THREAD|CLONE_SIGHAND) without
    CLONE_FILES has an fd table of its own. Its fd N is /usr/bin/true, the leader's fd N the
    marker. Its marked exec of /proc/self/fd/N named /usr/bin/true: the backstop judges
    /proc/TID/fd/N (true: Run), the kernel resolves /proc/self to the thread group and runs the
    leader's fd N. No race, no privilege, one try, inside bwrap."""
    if sandbox == "bwrap" and bwrap_usable() is not None:
        pytest.skip(f"bwrap unusable: {bwrap_usable()}")
    rules = """
default = "deny"

[[rule]]
id = "tf"
program = "@WORK@/tf"
decision = "run"

[[rule]]
id = "true"
program = "/usr/bin/true"
decision = "run"

[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"
"""
    script = "./mark; echo m=$?; ./tf /usr/bin/true /usr/bin/true ./mark true; echo end"
    done, records = _thread_session(attacker, rules, script, "--no-default-rules", sandbox=sandbox)
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "end" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"denied file ran as /usr/bin/true: {out}\n{records[-1:]}"


def test_a_thread_with_its_own_fd_table_dodges_the_file_facts_of_a_plain_exec(attacker: Attacker) -> None:
    """Finding 3's plain form (pre-existing): the unmarked exec of /proc/self/fd/N by such a
    thread is judged with the facts of the thread's fd N (./ok, real_path ok, an ELF) and runs
    the leader's fd N, a file the rules deny by name: inside bwrap, default rules."""
    if bwrap_usable() is not None:
        pytest.skip(f"bwrap unusable: {bwrap_usable()}")
    rules = """
[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"
"""
    script = "cp /bin/true ./ok; ./mark; echo m=$?; ./tf --plain ./ok ./ok ./mark ok; echo end"
    done, records = _thread_session(attacker, rules, script)
    out = done.stdout + done.stderr
    assert "m=" in done.stdout and "end" in done.stdout, out
    assert not attacker.marker_ran("mark"), f"denied file ran, judged as ./ok: {out}\n{records[-1:]}"
