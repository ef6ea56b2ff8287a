"""Nothing outlives its session (issue #9, class 10), run for real as root and as an unprivileged
user: ``execgate run`` as a subprocess, real shells, real ``setsid`` daemons.

As root this machine gives ``execgate run`` a cgroup v2 with ``cgroup.kill`` (mode ``cgroup``); the
unprivileged user cannot create one and gets the child subreaper (mode ``subreaper``); the note on
stderr says which. Every process of a session is found by a **token**: a number unique to the
test (``sleep 86400.<digits>``) that appears in the command line of the shell (its script), of
bwrap and of each daemon — pid namespaces or not.

* (a) ``--sandbox none``: daemons started with ``setsid`` (and a double fork) are gone when
  ``execgate run`` returns, after the script exits and after ``--timeout``;
* (b) SIGKILL of ``execgate run`` while the shell and a daemon run: with a cgroup, both are gone
  (the supervisor kills the cgroup). With the subreaper, only what the mechanism promises — the
  shell dies (parent-death signal), and with bwrap everything in its pid namespace — and the test
  names what is left outside a sandbox (the documented limit);
* (c) an *unsandboxed* escalated command that forks a ``setsid`` daemon: gone after the session,
  with and without a sandbox.

(d), the Python API (a session's close kills its escalated descendants, not the host program's
own processes), is in tests/server/test_containment.py.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from execgate.server.sandbox import bwrap_usable

SANDBOXES = ["none", pytest.param("bwrap", marks=pytest.mark.skipif(
    bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}"))]


def _token() -> str:
    return f"86400.{random.randrange(10**8, 10**9)}"


def _processes(token: str) -> dict[int, str]:
    """pid → command line of every live (non-zombie) process whose command line holds ``token``."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token in cmdline and state != "Z":
            found[int(name)] = cmdline
    return found


def _wait_for(pred, deadline_s: float = 15.0) -> bool:
    end = time.monotonic() + deadline_s
    while not pred():
        if time.monotonic() > end:
            return bool(pred())
        time.sleep(0.05)
    return True


def _kill_all(token: str) -> None:
    """Cleanup: what the old code (or a documented limit) left behind must not outlive the test."""
    for pid in _processes(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _mode(stderr: str) -> str:
    """The containment ``execgate run`` chose, from its note on stderr ("unknown" without one)."""
    for mode in ("cgroup", "subreaper"):
        if f"execgate: containment: {mode}" in stderr:
            return mode
    return "unknown"


@pytest.fixture
def token():
    value = _token()
    try:
        yield value
    finally:
        _kill_all(value)


#: Two daemons that leave the shell's process group and session, each writing its pid first: one
#: ``setsid`` child, one orphaned by a double fork. The script waits until both wrote.
DAEMONS = """
setsid sh -c 'echo $$ >> pids; exec sleep {token}' </dev/null >/dev/null 2>&1 &
( setsid sh -c 'echo $$ >> pids; exec sleep {token}' </dev/null >/dev/null 2>&1 & )
while [ "$(cat pids 2>/dev/null | wc -l)" -lt 2 ]; do sleep 0.05; done
"""


# ------------------------------------------------------------------ (a) after exit and --timeout


@pytest.mark.parametrize("ending", ["exit", "timeout"])
def test_setsid_daemons_die_with_an_unsandboxed_session(attacker, token, ending):
    work = attacker.workdir()
    script = DAEMONS.format(token=token) + ("sleep 1000\n" if ending == "timeout" else "echo started\n")
    extra = ["--timeout", "3"] if ending == "timeout" else []
    done = attacker.execgate("run", "--sandbox", "none", *extra, "--", script, cwd=work)
    assert done.returncode == (124 if ending == "timeout" else 0), done.stderr
    pids = [int(x) for x in (work / "pids").read_text().split()]
    assert len(pids) == 2, pids  # the daemons did start
    assert _processes(token) == {}, (_mode(done.stderr), done.stderr)


# ------------------------------------------------------------------ (b) SIGKILL of execgate run


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_sigkill_of_execgate_run(attacker, token, sandbox):
    work = attacker.workdir()
    script = DAEMONS.format(token=token) + f"touch ready; sleep {token}; echo not-reached {token}\n"
    err = work / "stderr"
    with open(err, "w") as stderr:
        run = subprocess.Popen(attacker.command([sys.executable, "-m", "execgate.server.cli", "run", "--sandbox",
                                                 sandbox, "--", script]),
                               cwd=work, env=attacker.env(), stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        assert _wait_for(lambda: (work / "ready").exists(), 60), err.read_text()
        os.kill(run.pid, signal.SIGKILL)
    finally:
        run.kill()
        run.wait()
    note = err.read_text()
    mode = _mode(note)
    # Every mode promises this much: the shell (and its bwrap) die with execgate run.
    assert _wait_for(lambda: not any("touch ready" in c for c in _processes(token).values())), (
        mode, _processes(token))
    if mode == "cgroup" or sandbox == "bwrap":
        # cgroup: the supervisor kills it whole; bwrap: --die-with-parent and its pid namespace.
        assert _wait_for(lambda: not _processes(token)), (mode, _processes(token))
        return
    # The subreaper's documented limit (its note says so): what the shell started outside any
    # sandbox (daemons, and its foreground sleep) is reparented to init and lives on.
    assert "daemons of unsandboxed commands survive" in note, note
    left = _processes(token)
    assert left and all(c.startswith("sleep ") for c in left.values()), left


# ------------------------------------------------------------------ (c) an unsandboxed escalation's daemon


@pytest.fixture
def helper_rules():
    """A root-owned directory (outside every session root) with ``spawner``, a helper that forks a
    ``setsid`` daemon and exits, and rules escalating it unsandboxed."""
    base = Path(tempfile.mkdtemp(prefix="eg-out-", dir="/var/tmp"))
    base.chmod(0o755)
    helper = base / "spawner"
    # $1: the token, $2: a file the daemon writes its pid to once it has left the helper's session.
    helper.write_text("#!/bin/sh\n"
                      "setsid sh -c 'echo $$ > \"$1\"; exec sleep \"$2\"' sh \"$2\" \"$1\" </dev/null >/dev/null 2>&1 &\n"
                      "n=0; while [ ! -s \"$2\" ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n + 1)); done\n"
                      "echo \"spawned $(cat \"$2\")\"\n")
    helper.chmod(0o755)
    rules = base / "rules.toml"
    rules.write_text(f'[[rule]]\nid = "spawner-unsandboxed"\nprogram = "{helper}"\n'
                     'decision = "escalate"\nexecution = "unsandboxed"\n')
    rules.chmod(0o644)
    try:
        yield helper, rules
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_daemon_of_an_unsandboxed_escalation_dies_with_the_session(attacker, token, sandbox, helper_rules):
    helper, rules = helper_rules
    script = f"{helper} {token} \"$PWD/daemon.pid\"; echo status=$?"
    done = attacker.execgate("run", "--sandbox", sandbox, "--rules", str(rules), "--", script,
                             cwd=attacker.workdir())
    assert "spawned" in done.stdout and "status=0" in done.stdout, done.stdout + done.stderr
    assert _processes(token) == {}, (_mode(done.stderr), _processes(token))
