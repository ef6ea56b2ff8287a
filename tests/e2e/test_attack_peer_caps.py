"""Attack: root keeps every capability under another uid, and is judged as that uid.

0bc8290 judges a caller as root when any of its uids is 0 (``session.py _holds_root``,
``backstop.py _ids``): "root that set only its effective uid to another takes root back at will".
So does root that set *all* its uids to 65534 and kept its capabilities (``PR_SET_KEEPCAPS``,
``setresuid(65534, 65534, 65534)``, ``capset``: CAP_DAC_OVERRIDE writes any file, CAP_SETUID takes
uid 0 back). Judged for uid 65534, a file in a root-owned 0755 directory is unmodifiable and nothing is
re-read at the exec. The rest is test_attack_peer_euid.py's attack (its text follows), without
the euid dance.


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

QUERY = Path(__file__).parent / "data" / "caps_query.py"

STATIC_MARKER = r"""
#include <fcntl.h>
#include <unistd.h>
int main(void) {
    int fd = open("MARKERS/static", O_WRONLY | O_CREAT, 0644);
    write(1, "STATIC MARKER RAN\n", 18);
    return fd < 0;
}
"""


@pytest.mark.parametrize("attacker", ["root"], indirect=True)
def test_root_with_other_uids_and_all_capabilities_rewrites_an_approved_file(attacker) -> None:
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
        script = (f"./s; {sys.executable} -B q.py {d / 'f'} {d / 's'} f; echo end")
        done = attacker.execgate("run", "-q", "--sandbox", "none", "--seccomp", "on", "--rules",
                                 str(d / "rules.toml"), "--cwd", str(d), "--", script, cwd=d)
        out = done.stdout + done.stderr
        assert "end" in done.stdout and "EUID BACK 65534 CAPS 000000000000008a" in done.stdout, out
        assert f"ANSWER {d / 'f'} Run" in done.stdout, out
        assert "CTIME SAME True SIZE SAME True" in done.stdout, out
        assert "STATIC MARKER RAN" not in done.stdout and not (d / "static").exists(), out
        assert "EXEC EACCES" in done.stdout, out
    finally:
        shutil.rmtree(d, ignore_errors=True)
