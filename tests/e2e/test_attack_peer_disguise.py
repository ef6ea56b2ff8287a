"""Attack: root makes a file it can rewrite look unmodifiable by the credentials it connects with.

The escalation server judges ``caller_can_modify`` (and whether the backstop reads an approved
file's kinds again at the exec, ``session.py`` ``on_run``: for a file the caller can modify, or for
*any* file of a root caller) from the uid ``SO_PEERCRED`` reports. That is the *effective* uid at
the moment the request's stream socket was made (socketpair(2) or connect(2)), not the caller's
uid at the exec. A root script, without a sandbox, drops only its euid (``setresuid(-1, 65534,
-1)``), makes the socketpair it hands to the server, takes euid 0 back, and asks about a copy of
``/bin/true`` in a root-owned 0755 directory: judged for uid 65534, the file is unmodifiable and
nothing is re-read. It then rewrites the file through a shared mapping whose pages were already
written (change time and size kept: red-team round 3) into a static program a ``file_kind`` rule
denies, and execveat(2)s the fd it asked with: the backstop lets the exec through as the approved
one and the denied static program runs (round 4's read-only-bind route, by another door).

The same with root that set *all* its uids to 65534 and kept its capabilities
(``PR_SET_KEEPCAPS``, ``capset``: CAP_DAC_OVERRIDE writes any file, CAP_SETUID takes uid 0 back),
``how = "caps"`` (red team E of 2026-12-02, after the euid fix judged any uid 0 as root).

Safe behaviour: the rewritten exec is decided again and denied (``EXEC EACCES``); the marker never
runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

QUERY = Path(__file__).parent / "data" / "root_disguise_query.py"

STATIC_MARKER = r"""
#include <fcntl.h>
#include <unistd.h>
int main(void) {
    int fd = open("MARKERS/static", O_WRONLY | O_CREAT, 0644);
    write(1, "STATIC MARKER RAN\n", 18);
    return fd < 0;
}
"""


@pytest.mark.parametrize("how", ["euid", "caps"])
@pytest.mark.parametrize("attacker", ["root"], indirect=True)
def test_root_judged_with_a_dropped_euid_rewrites_an_approved_file(attacker, how) -> None:
    # A root-owned 0755 chain (/opt is): for uid 65534 nothing in it is modifiable.
    d = Path(tempfile.mkdtemp(prefix="egrt-", dir="/opt"))
    try:
        d.chmod(0o755)
        (d / "smark.c").write_text(STATIC_MARKER.replace("MARKERS", str(d)))
        subprocess.run(["gcc", "-static", "-O1", "-o", str(d / "s"), str(d / "smark.c")], check=True)
        shutil.copy("/bin/true", d / "f")
        size = max(os.path.getsize(d / "f"), os.path.getsize(d / "s"))
        for name in ("f", "s"):
            with open(d / name, "ab") as grow:
                grow.truncate(size)
        shutil.copy(QUERY, d / "q.py")
        (d / "rules.toml").write_text('[[rule]]\nid = "no-static"\nfile_kind = ["static"]\ndecision = "deny"\n'
                                      'justification = "static programs are not allowed"\n')
        script = f"./s; {sys.executable} -B q.py {how} {d / 'f'} {d / 's'} f; echo end"
        done = attacker.execgate("run", "-q", "--sandbox", "none", "--seccomp", "on", "--rules",
                                 str(d / "rules.toml"), "--cwd", str(d), "--", script, cwd=d)
        out = done.stdout + done.stderr
        back = "EUID BACK 0 CAPS" if how == "euid" else "EUID BACK 65534 CAPS 000000000000008a"
        assert "end" in done.stdout and back in done.stdout, out
        assert f"ANSWER {d / 'f'} Run" in done.stdout, out
        assert "CTIME SAME True SIZE SAME True" in done.stdout, out
        assert "STATIC MARKER RAN" not in done.stdout and not (d / "static").exists(), out
        assert "EXEC EACCES" in done.stdout, out
    finally:
        shutil.rmtree(d, ignore_errors=True)
