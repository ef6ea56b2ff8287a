"""The query by exec (issue 11; server/protocol.py "Query by exec", docs/DESIGN.md §9): where the
session's seccomp backstop stops every exec anyway, the preload shim asks by making the exec
itself, marked — no socket work for an answered exec — and a hostile script that reads our source
makes that marked exec itself.

What must hold, run for real in ``execgate run`` (bwrap sandbox, as root and as an unprivileged
account):

* a marked exec continues only where the policy gives a Run without asking anyone (the rules'
  Run); a denied program, one the rules prompt for, and a mark carrying another session's token
  fail with ``EOPNOTSUPP`` (``ENOTSUP``) — nothing run, decided, prompted or audited;
* the shim uses the query by exec only where its own session's backstop is on: the variable is
  forced from the session's start as the socket's is (``EXECGATE_BACKSTOP_QUERY=7 bash`` changes
  nothing; without the backstop a marked exec would simply run);
* the shim's own use: the execs it answers this way make no socket call at all (strace), each
  still one audit line.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from attack_support import Attacker, grant_traverse
from execgate.server.sandbox import bwrap_usable

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")]

FORGE = Path(__file__).parent / "data" / "query_by_exec.py"

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
    shutil.copy(FORGE, work / "q.py")
    py = sys.executable
    if not attacker.is_root:
        grant_traverse(attacker.name, Path(py).resolve())
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--rules", str(work / "rules.toml"),
                             "--audit-log", str(audit), "--cwd", str(work), *extra, "--", script, cwd=work)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, records


def test_a_forged_query_by_exec_runs_only_what_would_run_anyway(attacker: Attacker) -> None:
    py = sys.executable
    script = ("cp /bin/true ./ok && cp /bin/true ./esc; ./ok; "
              f"{py} q.py own ./mark mark; {py} q.py own ./esc esc; {py} q.py other ./ok ./ok; "
              f"{py} q.py by-path ./mark mark; {py} q.py own ./ok ./ok; echo own=$?; echo end")
    done, records = _session(attacker, script, "--seccomp", "on")
    out = done.stdout + done.stderr
    assert done.stdout.splitlines()[-1:] == ["end"], out
    # The denied, the prompted and the other token's: refused undecided; the marked exec of a path
    # (not of an fd) is no query: decided in full and denied; the Run: it ran (exit 0).
    assert done.stdout.count("EXEC ENOTSUP") == 3 and "own=0" in done.stdout, out
    assert done.stdout.count("EXEC EACCES") == 1, out
    assert not attacker.marker_ran("mark"), out
    # Nothing was decided for the queries (no denial); the exec by path was.
    assert done.stderr.count("Execution denied") == 1, out
    by_program: dict[str, list[str]] = {}
    for r in records:
        by_program.setdefault(Path(r["program"]).name, []).append(r["decision"])
    # ./ok: the shell's exec and the forged one with the session's token; nothing else.
    assert by_program.get("ok") == ["run", "run"], records
    assert by_program.get("mark") == ["deny"] and "esc" not in by_program, records


@pytest.mark.parametrize("seccomp", ["on", "off"])
def test_the_query_variable_is_the_sessions_own(attacker: Attacker, seccomp: str) -> None:
    """A process cannot turn the query by exec on (without a backstop its marked exec would
    simply run) nor point it at another token: the shim forces the variable of the session's
    start on every exec, as it forces the socket's."""
    script = ("EXECGATE_BACKSTOP_QUERY=7 bash -c 'echo \"v=${EXECGATE_BACKSTOP_QUERY-none}\"; ./mark; "
              "echo st=$?'")
    done, records = _session(attacker, script, "--seccomp", seccomp)
    out = done.stdout + done.stderr
    value = re.search(r"^v=(\S+)$", done.stdout, re.M)
    assert value is not None and "st=" in done.stdout, out
    if seccomp == "off":
        assert value.group(1) == "none", out
    else:
        assert value.group(1).isdigit() and value.group(1) != "7", out
    assert "Execution denied: the marker must never run" in done.stderr, out
    assert not attacker.marker_ran("mark"), out
    assert [r["decision"] for r in records if Path(r["program"]).name == "mark"] == ["deny"], records


@pytest.mark.parametrize("seccomp", ["on", "off"])
def test_answered_execs_make_no_socket_call(seccomp: str) -> None:
    """strace: with the backstop, a process whose exec the rules answer Run makes no socket call
    between its fork and its program (the marked exec is the query); without it, each such process
    asks over the session's socket (the check can fail). One audit line per exec either way."""
    if shutil.which("strace") is None:
        pytest.fail("strace is needed (scripts/setup.sh installs it)")
    work = Path(tempfile.mkdtemp(prefix="eg-qbe-"))
    try:
        audit, trace = work / "audit.jsonl", work / "trace"
        done = subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=execve,execveat,socket,socketpair,connect,sendmsg", "-o", str(trace),
             sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none", "--seccomp", seccomp,
             "--audit-log", str(audit), "--cwd", str(work), "--",
             "/bin/true; for i in 1 2 3 4 5; do /bin/true; done; /bin/echo done"],
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0 and done.stdout == "done\n", done.stdout + done.stderr
        lines = trace.read_text().splitlines()
        by_pid: dict[str, list[str]] = {}
        for line in lines:
            pid, _, call = line.partition(" ")  # strace pads the pid to 5 columns
            by_pid.setdefault(pid, []).append(call.lstrip())
        # The processes that became /bin/true without the wrapper (the session's first exec
        # starts the wrapper; the others are answered to the shim).
        answered = [calls for calls in by_pid.values()
                    if any(c.startswith("exec") and '["/bin/true"]' in c and c.endswith("= 0") for c in calls)
                    and not any("execgate-wrapper-native" in c or "execgate-contain" in c for c in calls)]
        assert len(answered) >= 4, "\n".join(lines)
        socket_calls = [c for calls in answered for c in calls if c.startswith(("socket", "connect(", "sendmsg("))]
        if seccomp == "on":
            assert socket_calls == [], "\n".join(socket_calls)
        else:
            assert len(socket_calls) >= len(answered), "\n".join(lines)
        records = [json.loads(line) for line in audit.read_text().splitlines()]
        assert [r["decision"] for r in records if r["program"] == "/bin/true"] == ["run"] * 6, records
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_shim_and_the_backstop_agree_on_the_mark() -> None:
    """The C side's constants (wrapper/native/execgate.h) are the protocol's (server/protocol.py)."""
    import errno

    from execgate.server import protocol as p

    header = (Path(__file__).resolve().parents[2] / "wrapper" / "native" / "execgate.h").read_text()
    defined = dict(re.findall(r"^#define (EG_\w+) (\S+)", header, re.M))
    assert defined["EG_ENV_BACKSTOP_QUERY"] == f'"{p.BACKSTOP_QUERY_ENV_VAR}"'
    assert int(defined["EG_QUERY_MARK"].rstrip("L"), 16) == p.QUERY_EXEC_MARK
    assert getattr(errno, defined["EG_QUERY_UNDECIDED_ERRNO"]) == p.QUERY_UNDECIDED_ERRNO
