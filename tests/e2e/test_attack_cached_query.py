"""The preload shim decides in the calling process when the decision cache covers an exec
(issue 11; server/protocol.py "Cached-only query", docs/DESIGN.md §9) — and a hostile script that
reads our source speaks that query itself.

What must hold, each run for real in ``execgate run`` (bwrap sandbox and the seccomp backstop, as
root and as an unprivileged account):

* a cached-only query is answered Run only for an exec the cache covers (this very file, with a
  Run cached), and ``Undecided`` for everything else — a denied program, one that was never
  decided, one the rules escalate — with nothing decided, prompted or audited for it;
* the Run of a query approves that one exec only: the same process exec'ing another file with the
  approved argv, past the shim by the raw system call, is decided by the backstop and denied; so
  is a child's, after a query for an exec by a child (the shim's ``posix_spawn``);
* the shim's own use: after the first exec of a program (decided through the wrapper), the next
  ones run without the wrapper (strace sees one exec of it), each still one audit line.
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

QUERY = Path(__file__).parent / "data" / "cached_query.py"

RULES = """
[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"

[[rule]]
id = "ask-esc"
program = "esc"
decision = "prompt"
justification = "a person decides"
"""


def _session(attacker: Attacker, script: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    work = attacker.workdir()
    (work / "rules.toml").write_text(RULES)
    audit = work / "audit.jsonl"
    attacker.marker_program(work, "mark")
    shutil.copy(QUERY, work / "q.py")
    done = attacker.execgate("run", "-q", "--rules", str(work / "rules.toml"), "--audit-log", str(audit),
                             "--cwd", str(work), *extra, "--", script, cwd=work)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, records


def test_cached_only_query_answers_only_what_the_cache_holds(attacker: Attacker) -> None:
    py = sys.executable
    grant_traverse(attacker.name, Path(py).resolve()) if not attacker.is_root else None
    script = (f"cp /bin/true ./ok && cp /bin/true ./esc && cp /bin/true ./other; ./ok; ./ok; "
              f"{py} q.py query ./ok ./ok; {py} q.py query ./mark mark; {py} q.py query ./other other; "
              f"{py} q.py query ./esc esc; {py} q.py query-exec ./ok ./ok -- ./mark; "
              f"{py} q.py query-child-exec ./ok ./ok -- ./mark; echo end=$?")
    done, records = _session(attacker, script, "--sandbox", "bwrap", "--approver-wait", "1")
    out = done.stdout + done.stderr
    assert "end=" in done.stdout, out
    answers = [line for line in done.stdout.splitlines() if line.startswith("ANSWER ")]
    assert answers == ["ANSWER ./ok Run", "ANSWER ./mark Undecided", "ANSWER ./other Undecided",
                       "ANSWER ./esc Undecided", "ANSWER ./ok Run", "ANSWER ./ok Run"], out
    # The Run of the query approved ./ok; the raw exec of ./mark with ok's argv was decided anew,
    # by the process itself and by its child.
    assert done.stdout.count("EXEC EACCES") == 2 and "CHILD 3" in done.stdout, out
    assert "Execution denied: the marker must never run" in done.stderr, out
    assert not attacker.marker_ran("mark"), out
    work = attacker.workdir()
    by_program: dict[str, list[tuple[str, bool]]] = {}
    for r in records:
        by_program.setdefault(Path(r["program"]).name, []).append((r["decision"], r["cached"]))
    # ./ok: the first exec decided, the second and both queries from the cache; nothing for
    # ./other and ./esc (queries only: no decision, no prompt); ./mark: the backstop's deny only.
    assert sorted(by_program.get("ok", [])) == [("run", False)] + [("run", True)] * 4, records
    assert "other" not in by_program and "esc" not in by_program, records
    assert sorted(by_program.get("mark", [])) == [("deny", False), ("deny", True)], records  # the 2nd: a cached Deny
    assert not any(r["program"].startswith(str(work)) and r["decision"] == "escalate" for r in records), records


def test_cache_hits_run_without_the_wrapper() -> None:
    """strace counts the execs of the native wrapper: one per program (its first, decided exec),
    not one per exec — for bash's fork and exec and for make's posix_spawn alike; the audit log
    still has one line per exec (the backstop decided none twice), the later ones cached."""
    if shutil.which("strace") is None:
        pytest.fail("strace is needed (scripts/setup.sh installs it)")
    work = Path(__import__("tempfile").mkdtemp(prefix="eg-shimcache-"))
    try:
        audit, trace = work / "audit.jsonl", work / "trace"
        done = subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=execve,execveat", "-o", str(trace),
             sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none",
             "--audit-log", str(audit), "--cwd", str(work), "--",
             "for i in 1 2 3 4 5 6 7 8; do /bin/true; done; /bin/echo a; /bin/echo b; "
             "printf 'all:\\n\\t@/bin/echo c\\n\\t@/bin/echo d\\n\\t@/bin/echo e\\n' > Makefile; "
             "/usr/bin/make -s"],
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0 and done.stdout == "a\nb\nc\nd\ne\n", done.stdout + done.stderr
        lines = trace.read_text().splitlines()
        done_execs = [line for line in lines if line.endswith("= 0")]
        wrapper_execs = [line for line in done_execs if "execgate-wrapper-native\", [" in line]
        true_execs = [line for line in done_execs if '["/bin/true"]' in line]
        assert len(true_execs) == 8, "\n".join(lines)
        # /bin/true's first exec, /bin/echo's and make's (printf is bash's builtin); the echos
        # make spawns (posix_spawn) are cached
        assert len(wrapper_execs) == 3, "\n".join(wrapper_execs)
        assert len([line for line in done_execs if '["/bin/echo", ' in line]) == 5, "\n".join(lines)
        records = [json.loads(line) for line in audit.read_text().splitlines()]
        mine = sorted((Path(r["program"]).name, r["cached"]) for r in records if r["program"] in ("/bin/true", "/bin/echo"))
        assert mine == [("echo", False)] + [("echo", True)] * 4 + [("true", False)] + [("true", True)] * 7, records
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_long_and_non_utf8_arguments_go_through_the_query_intact(tmp_path: Path) -> None:
    """The shim writes its request in 2 KiB pieces with the target fd on the first: a 20 KB
    argument, and bytes that are not UTF-8 (sent as ``\\udcXX``), reach the program unchanged
    on a cache hit as on the first, decided exec."""
    audit = tmp_path / "audit.jsonl"
    script = ('long=$(head -c 20000 /dev/zero | tr "\\0" x); odd=$(printf "a\\377b\\303"); '
              'for i in 1 2 3; do /bin/echo "$long" | wc -c; /bin/echo "$odd" | od -An -c | tr -s " "; done')
    trace = tmp_path / "trace"
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace),
                           sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none",
                           "--audit-log", str(audit), "--cwd", str(tmp_path), "--", script],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["20001", " a 377 b 303 \\n"] * 3, done.stdout + done.stderr
    # The first exec of echo went through the wrapper; the five others were answered to the shim.
    wrapped = [line for line in trace.read_text().splitlines()
               if "execgate-wrapper-native\", [" in line and '"/bin/echo", "/bin/echo"' in line]
    assert len(wrapped) == 1, wrapped
    echoes = [json.loads(line) for line in audit.read_text().splitlines() if '"/bin/echo"' in line]
    assert sorted(r["cached"] for r in echoes) == [False] + [True] * 5, echoes
