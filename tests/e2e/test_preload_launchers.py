"""Every common way of launching a program, in real shells under the preload shim: the denied marker
never runs (its caller sees status 1, or the launcher's mapping of it, and the reason on stderr) and
the allowed marker really runs and prints."""

from __future__ import annotations

import shutil
import sys

import pytest

from preload_support import (
    ALLOWED, ALLOWED_OUTPUT, DENIED, DENIED_OUTPUT, DENY_REASON, Gate, write_script,
)

pytestmark = pytest.mark.e2e

PY = sys.executable
BODY = f'{DENIED}; echo "denied-status=$?"; {ALLOWED} x'

# (id, shell, script, status the launcher reports for the denied marker)
CASES = [
    ("bash-c", "bash", BODY, 1),
    ("dash-c", "dash", BODY, 1),
    ("zsh-c", "zsh", BODY, 1),
    ("sh-nested-in-bash", "bash", f"sh -c '{BODY}'", 1),
    ("xargs", "bash", f'echo a | xargs {DENIED}; echo "denied-status=$?"; echo x | xargs {ALLOWED}', 123),
    (
        "find-exec",
        "bash",
        f'find /bin/true -exec {DENIED} {{}} +; echo "denied-status=$?"; find /bin/true -exec {ALLOWED} x {{}} \\;',
        1,
    ),
    ("env-i-sh-c", "bash", "env -i sh -c 'PATH=\"$0\"; " + BODY + "' \"$PATH\"", 1),
    (
        "python-subprocess-run",
        "bash",
        f"{PY} -c 'import shutil, subprocess; r = subprocess.run([\"{DENIED}\"]); print(\"denied-status=%d\" % r.returncode, flush=True); "
        f"subprocess.run([shutil.which(\"{ALLOWED}\"), \"x\"], env={{}})'",
        1,
    ),
    (
        "python-posix-spawn",
        "bash",
        f"{PY} -c 'import os, shutil\nfor n in (\"{DENIED}\", \"{ALLOWED}\"):\n"
        f"    pid = os.posix_spawn(shutil.which(n), [n, \"x\"], os.environ)\n"
        # Wait for both: an unwaited child could still be asking when the session closes.
        f"    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        f"    print(\"denied-status=%d\" % status if n == \"{DENIED}\" else \"\", flush=True)'",
        1,
    ),
    (
        "python-execvp",
        "bash",
        f"{PY} -c 'import os; os.execvp(\"{DENIED}\", [\"{DENIED}\"])'; echo \"denied-status=$?\"; "
        f"{PY} -c 'import os; os.execvp(\"{ALLOWED}\", [\"{ALLOWED}\", \"x\"])'",
        1,
    ),
    (
        "perl-exec",
        "bash",
        f"perl -e 'exec \"{DENIED}\"'; echo \"denied-status=$?\"; perl -e 'exec \"{ALLOWED}\", \"x\"'",
        1,
    ),
    ("background-job", "bash", f'{DENIED} & wait $!; echo "denied-status=$?"; {ALLOWED} x & wait', 1),
    ("command-substitution", "bash", f'out=$({DENIED}); echo "denied-status=$?"; echo "$({ALLOWED} x)"', 1),
    ("pipeline", "bash", f'{DENIED} | cat; echo "denied-status=${{PIPESTATUS[0]}}"; {ALLOWED} x | cat', 1),
    ("dash-pipeline-bg", "dash", f'{DENIED} | cat & wait; {DENIED} & wait $!; echo "denied-status=$?"; {ALLOWED} x | cat', 1),
]


def _check(gate: Gate, stdout: str, stderr: str, denied_status: int) -> None:
    assert DENIED_OUTPUT not in stdout
    assert f"denied-status={denied_status}" in stdout, (stdout, stderr)
    assert f"Execution denied: {DENY_REASON}" in stderr
    assert f"{ALLOWED_OUTPUT} x" in stdout, (stdout, stderr)
    names = [p.rsplit("/", 1)[-1] for p in gate.policy.programs()]
    assert DENIED in names and ALLOWED in names
    # Decided once per exec, with the backstop on too: one decision per run of the allowed
    # program (each prints its line) and per denial (each prints its reason).
    assert names.count(ALLOWED) == stdout.count(f"{ALLOWED_OUTPUT} x"), (names, stdout)
    assert names.count(DENIED) == stderr.count(f"Execution denied: {DENY_REASON}"), (names, stderr)


@pytest.mark.parametrize(("shell", "script", "status"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_launcher(gate: Gate, shell: str, script: str, status: int) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    res = gate.run(shell, script)
    _check(gate, res.stdout, res.stderr, status)


def test_make_recipe(gate: Gate) -> None:
    # A recipe line without shell syntax is spawned by make itself (posix_spawn in GNU make 4.3);
    # one with syntax goes through /bin/sh -c.
    (gate.workdir / "Makefile").write_text(
        f'all:\n\t{ALLOWED} x\n\t{DENIED}; echo "denied-status=$$?"\n\t-{DENIED}\n'
    )
    res = gate.run("bash", "make")
    _check(gate, res.stdout, res.stderr, 1)
    assert "Error 1 (ignored)" in res.stderr


def test_env_bash_shebang_script(gate: Gate) -> None:
    write_script(gate.bindir / "eg-launch", f"#!/usr/bin/env bash\n{BODY}\n")
    res = gate.run("dash", "eg-launch")
    _check(gate, res.stdout, res.stderr, 1)
    assert any(p.endswith("/bash") for p in gate.policy.programs())


def test_script_without_shebang(gate: Gate) -> None:
    # bash and dash run such a file themselves after execve's ENOEXEC; glibc's execvp (here: env)
    # runs it as `/bin/sh FILE` and the policy sees that exec of /bin/sh.
    write_script(gate.bindir / "eg-noshebang", f"{BODY}\n")
    res = gate.run("bash", "eg-noshebang; env eg-noshebang")
    assert res.stdout.count(f"{ALLOWED_OUTPUT} x") == 2
    assert res.stdout.count("denied-status=1") == 2
    _check(gate, res.stdout, res.stderr, 1)
    sh_calls = [argv for program, argv in gate.policy.calls if argv[:1] == ["/bin/sh"]]
    assert sh_calls and sh_calls[0][1] == str(gate.bindir / "eg-noshebang")
