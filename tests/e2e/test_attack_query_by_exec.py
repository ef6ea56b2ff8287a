"""Red team of the query by exec (server/protocol.py "Query by exec", commit 58e58d8): a hostile
script inside ``execgate run`` (bwrap sandbox, seccomp backstop on, as root and as an
unprivileged account) that has read our source.

Finding 1 — the shim's own exec became the backstop's time-of-check race on the file system.
Before the query by exec, the shim's answered exec was race-free on the file: the shim opened
the path ``O_PATH``, the server judged *that fd*, and the shim ran that very fd
(``execveat(fd, "", AT_EMPTY_PATH)``); the backstop then matched the exec against the identity
approved. Now the shim makes ``execve(path)`` marked, the backstop resolves the path, judges the
file it finds, answers ``CONTINUE`` — and the kernel resolves the path *again*. Another process
of the session (no thread, no shared memory, no raw system call: ``cp`` and ``mv`` in a shell
loop) swaps a symlink in between, and a program the rules deny by its real name runs, audited
as the allowed file. The documented race (seccomp_unotify(2), backstop docstring) needed a raw
``execve`` by hostile code; this one needs only a shell, and every exec of every shim-loaded
program (bash, make, xargs…) is exposed to it. On ef88737 the same script never wins.

Fixed: the shim executes the file it opened, as ``/proc/self/fd/N`` (the kernel's second lookup
reaches that very open file), passing the name as a separate argument; a marked exec of any
other path is answered undecided. Both tests fail on 58e58d8 and pass since.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attack_support import Attacker, grant_traverse
from execgate.server.sandbox import bwrap_usable

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")]

RULES = """
[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"
"""


def _session(attacker: Attacker, script: str, *extra: str,
             timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    work = attacker.workdir()
    (work / "rules.toml").write_text(RULES)
    audit = work / "audit.jsonl"
    if not attacker.is_root:
        grant_traverse(attacker.name, Path(sys.executable).resolve())
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--rules", str(work / "rules.toml"),
                             "--audit-log", str(audit), "--cwd", str(work), *extra, "--", script, cwd=work,
                             timeout=timeout)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, records


#: The two ways a query is answered: the in-process rules' own Run, and the decision cache's hit.
MODES = {"inprocess": (), "cache": ("--cache-ttl", "60")}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_symlink_swapped_by_a_shell_loop_runs_a_denied_program(attacker: Attacker, mode: str) -> None:
    """Only bash and coreutils: ``./x`` is a symlink that a background loop keeps replacing
    (atomically, ``mv -T``) by one to ``/bin/true`` (Run) and one to ``./mark`` (denied by its
    real name: a renamed symlink must not dodge the denial, docs/DESIGN.md §5). ``mark`` is an
    ELF (a copy of dash) so that no interpreter re-reads the path. Each ``./x`` bash runs is the
    shim's marked exec: judged while ``x`` names ``/bin/true``, run after it names ``mark``."""
    marker = attacker.markers / "mark"
    script = (
        "cp /bin/dash ./mark && ln -s /bin/true a && ln -s mark b && ln -s /bin/true x || exit 9; "
        "( while :; do cp -P a t1 && mv -T t1 x; cp -P b t2 && mv -T t2 x; done ) & sw=$!; "
        f"for i in $(seq 400); do ./x -c 'echo ran > {marker}; echo MARKER mark RAN' 2>/dev/null; "
        f"[ -e {marker} ] && break; done; "
        "kill $sw; wait $sw 2>/dev/null; echo tries=$i; echo end")
    done, records = _session(attacker, script, "--seccomp", "on", *MODES[mode])
    out = done.stdout + done.stderr[-2000:]
    assert "end" in done.stdout.splitlines(), out
    ran_as = [r for r in records if r["program"].endswith("/x") and r["decision"] == "run"]
    # The denied program ran, judged (and audited) as /usr/bin/true.
    assert not attacker.marker_ran("mark"), (
        f"the denied program ran ({done.stdout.strip().splitlines()[-2:]}); audited as: "
        f"{[(r['program'], r['real_path'], r['decision']) for r in ran_as[-1:]]}")


STATIC_RULES = """
[[rule]]
id = "no-static"
file_kind = ["static"]
decision = "deny"
justification = "no static programs in this session"
"""


def test_a_symlink_swap_dodges_a_file_kind_rule(attacker: Attacker) -> None:
    """The same race against a rule on the file's facts, which no copy or rename can dodge
    (``file_kind = ["static"]``): ``/sbin/ldconfig`` (static-pie) is denied when named directly,
    and runs through ``./x`` swapped between ``/bin/true`` and it."""
    work = attacker.workdir()
    (work / "rules.toml").write_text(STATIC_RULES)
    if not attacker.is_root:
        grant_traverse(attacker.name, Path(sys.executable).resolve())
    script = (
        "/sbin/ldconfig --version >/dev/null 2>&1 && echo DIRECT-RAN; "
        "ln -s /bin/true a && ln -s /sbin/ldconfig b && ln -s /bin/true x || exit 9; "
        "( while :; do cp -P a t1 && mv -T t1 x; cp -P b t2 && mv -T t2 x; done ) & sw=$!; "
        "for i in $(seq 400); do case $(./x --version 2>/dev/null) in *GLIBC*) echo STATIC-RAN; break;; esac; done; "
        "kill $sw; wait $sw 2>/dev/null; echo tries=$i; echo end")
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--seccomp", "on", "--rules", str(work / "rules.toml"),
                             "--cwd", str(work), "--", script, cwd=work, timeout=180)
    out = done.stdout + done.stderr[-2000:]
    assert "end" in done.stdout.splitlines(), out
    assert "DIRECT-RAN" not in done.stdout, out  # the rule holds for the program named directly
    assert "STATIC-RAN" not in done.stdout, done.stdout
