"""Attack (red team C): the audit log's path holds a symlink in the working directory, and the
session makes the path name a log of its own (README ``--audit-log``: "read-only inside the
sandbox even in the working directory (nor can its directories there be renamed)").

``_protect`` (server/sandbox.py) binds the log and each directory between the working directory
and it onto itself — as *resolved by bwrap*: a symlink on the path (``logs -> real-logs``, left in
the project by an earlier session that ran without ``--audit-log``, or made by the user) is
followed, and the mounts land on ``real-logs`` and its file. The symlink itself is no mount
point: the session removes it, makes a directory ``logs`` and writes a forged log there (or, for a
symlinked file ``audit.jsonl -> audit.real``, replaces the link by a file). The real records stay
in ``real-logs/audit.jsonl``; the path the user gave, read after the run, is the session's.

Seen on e7e61ec: after the run ``logs/audit.jsonl`` holds only the forged record, no ``su``
denial. The path given to ``--audit-log`` must still lead to the log execgate wrote.
"""

from __future__ import annotations

import os

import pytest

from attack_support import Attacker

pytestmark = pytest.mark.e2e

SCRIPT_DIR = """
su -c id root; echo "su=$?"
rm logs && mkdir logs && echo '{"decision":"run","argv":["forged-by-the-session"]}' > logs/audit.jsonl
echo "tampered=$?"
"""

SCRIPT_FILE = """
su -c id root; echo "su=$?"
rm audit.jsonl && echo '{"decision":"run","argv":["forged-by-the-session"]}' > audit.jsonl
echo "tampered=$?"
"""


@pytest.mark.parametrize("link", ["directory", "file"])
def test_a_symlink_on_the_audit_log_path_cannot_be_replaced(attacker: Attacker, link: str) -> None:
    work = attacker.workdir()
    if link == "directory":
        (work / "real-logs").mkdir()
        (work / "real-logs").chmod(0o777)
        os.symlink("real-logs", work / "logs")
        audit = work / "logs" / "audit.jsonl"
    else:
        (work / "audit.real").touch()
        os.chmod(work / "audit.real", 0o666)
        os.symlink("audit.real", work / "audit.jsonl")
        audit = work / "audit.jsonl"
    if not attacker.is_root:
        os.lchown(work / ("logs" if link == "directory" else "audit.jsonl"), attacker.uid, attacker.gid)
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--audit-log", str(audit), "--cwd", str(work),
                             "--", SCRIPT_DIR if link == "directory" else SCRIPT_FILE, cwd=work)
    out = done.stdout + done.stderr
    # Refused before anything runs (since 2026-12-02), saying where the log really is; the log
    # holds nothing the session wrote.
    assert done.returncode == 2 and "goes through a symlink" in done.stderr and "su=" not in done.stdout, out
    assert "forged-by-the-session" not in audit.read_text(), audit.read_text()
