"""Issue #9 class 12: programs whose children cannot be followed are known to the policy.

With the preload shim alone (``execgate run --seccomp off``) a ``gcc -static`` program execs
children the shim cannot see: the server reads the file through the caller's view, says
``children_unseen`` in the request, and a rules file that denies such programs denies it, with the
reason on the caller's stderr and "children unseen" in the audit line; a dynamic program still
runs. With the seccomp backstop on, every child exec is seen: the same program is not flagged and
runs. Real ``execgate run``, real bwrap (where it works), real gcc-built programs, as root and as
an unprivileged user.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from attack_support import attacker  # noqa: F401  (fixture)

REASON = "its children would exec unseen"
RULES = f"""default = "run"

[[rule]]
id = "no-unseen-children"
children_unseen = true
decision = "deny"
justification = "{REASON}"
match = [{{ command = "./static-tool", children_unseen = true, file_kind = ["static"] }}]
not_match = ["./static-tool"]
"""
#: A marker program: writes ``MARKER_FILE`` when it runs.
MARKER_C = r"""
#include <stdio.h>
int main(void)
{
    FILE *f = fopen(MARKER_FILE, "w");
    if (f == NULL)
        return 3;
    fputs("ran\n", f);
    fclose(f);
    puts("MARKER RAN");
    return 0;
}
"""


def _build(attacker, name: str, *flags: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    work = attacker.workdir()
    src = work / f"{name}.c"
    src.write_text(MARKER_C)
    out = work / name
    define = f'-DMARKER_FILE="{attacker.markers / name}"'
    done = subprocess.run(["gcc", "-O1", *flags, define, "-o", str(out), str(src)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    out.chmod(0o755)
    return out


def _run(attacker, *options: str):
    work = attacker.workdir()
    static = _build(attacker, "eg-unseen-static", "-static")
    dynamic = _build(attacker, "eg-unseen-dynamic")
    rules = work / "rules.toml"
    rules.write_text(RULES)
    audit = work / "audit.jsonl"
    script = f"{static}; echo static-status=$?; {dynamic}; echo dynamic-status=$?"
    done = attacker.execgate("run", "--rules", str(rules), "--audit-log", str(audit), *options, "--", script,
                             cwd=work)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, {Path(r["program"]).name: r for r in records}


def test_static_program_is_denied_when_its_children_would_be_unseen(attacker):
    done, records = _run(attacker, "--seccomp", "off")
    assert "execgate: seccomp backstop: off" in done.stderr
    assert not attacker.marker_ran("eg-unseen-static"), done.stdout + done.stderr
    assert f"Execution denied: {REASON}" in done.stderr
    assert "static-status=1" in done.stdout
    static = records["eg-unseen-static"]
    assert (static["decision"], static["rule_id"], static["children_unseen"]) == ("deny", "no-unseen-children", True)
    assert "static" in static["file_kind"] and "elf64" in static["file_kind"]
    # The control: a dynamic program (the shim follows it) still runs, and is recorded as such.
    assert attacker.marker_ran("eg-unseen-dynamic"), done.stdout + done.stderr
    assert "dynamic-status=0" in done.stdout
    dynamic = records["eg-unseen-dynamic"]
    assert (dynamic["decision"], dynamic["children_unseen"]) == ("run", False)
    assert "dynamic" in dynamic["file_kind"]


def test_with_the_backstop_the_static_program_is_not_flagged(attacker):
    done, records = _run(attacker)  # default: the seccomp backstop where the kernel allows it
    if "execgate: seccomp backstop: on" not in done.stderr:
        pytest.skip("the seccomp backstop is not available here: " + done.stderr[-300:])
    assert attacker.marker_ran("eg-unseen-static"), done.stdout + done.stderr
    assert "static-status=0" in done.stdout
    static = records["eg-unseen-static"]
    assert (static["decision"], static["children_unseen"]) == ("run", False)
    assert "static" in static["file_kind"]
    # An exec only the backstop sees (static busybox execs the program): decided with its file facts too.
    if shutil.which("busybox") is None:
        return
    work = attacker.workdir()
    audit = work / "audit2.jsonl"
    static_path = work / "eg-unseen-static"
    (attacker.markers / "eg-unseen-static").unlink()
    done = attacker.execgate("run", "--rules", str(work / "rules.toml"), "--audit-log", str(audit), "--",
                             f"busybox env {static_path}; echo status=$?", cwd=work)
    assert "status=0" in done.stdout, done.stdout + done.stderr
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    seen = [(r["decision"], r["children_unseen"], "static" in (r["file_kind"] or [])) for r in lines
            if r["program"] == str(static_path)]
    assert seen == [("run", False, True)], lines


EXECIT_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    printf("euid=%d\n", (int)geteuid());
    fflush(stdout);
    execv(argv[1], argv + 1);
    perror("execit");
    return 126;
}
"""


# Only the unprivileged user: for root a setuid-root program changes nothing.
@pytest.mark.parametrize("attacker", ["user"], indirect=True)
@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_setuid_program_is_followed_under_no_new_privs(attacker, sandbox):
    """A setuid-root copy of a dynamic program, run by an unprivileged user with the shim alone.
    In bwrap (no_new_privs) execve does not apply the bit: the program stays the user's, the shim
    loads and sees its exec of a denied marker, and the server says children seen. Without a
    sandbox the bit applies (AT_SECURE, LD_PRELOAD ignored): children unseen, and the rule denies."""
    work = attacker.workdir()
    src = work / "execit.c"
    src.write_text(EXECIT_C)
    prog = work / "suid-execit"
    subprocess.run(["gcc", "-O1", "-o", str(prog), str(src)], check=True)
    prog.chmod(0o4755)  # owned by root (the test runs as root): set-user-ID root
    marker = attacker.marker_program(work, "eg-unseen-child")
    rules = work / "rules.toml"
    rules.write_text(RULES + '\n[[rule]]\nid = "child-deny"\nprogram = "eg-unseen-child"\ndecision = "deny"\n'
                     'justification = "the child is denied"\n')
    audit = work / "audit.jsonl"
    done = attacker.execgate("run", "--sandbox", sandbox, "--seccomp", "off", "--rules", str(rules),
                             "--audit-log", str(audit), "--", f"{prog} {marker}; echo status=$?", cwd=work)
    records = {Path(r["program"]).name: r for r in map(json.loads, audit.read_text().splitlines())}
    assert not attacker.marker_ran("eg-unseen-child"), done.stdout + done.stderr
    assert "setuid" in records["suid-execit"]["file_kind"]
    if sandbox == "bwrap":
        assert f"euid={attacker.uid}\n" in done.stdout, done.stdout + done.stderr  # the bit did not apply
        assert records["suid-execit"]["children_unseen"] is False
        assert "Execution denied: the child is denied" in done.stderr  # the shim saw the child's exec
    else:
        assert records["suid-execit"]["children_unseen"] is True
        assert f"Execution denied: {REASON}" in done.stderr
        assert "euid=" not in done.stdout
