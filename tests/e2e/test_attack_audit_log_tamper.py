"""Attack (red team A): the session rewrites the audit log of its own decisions (docs/DESIGN.md §5
"Every decision is written to an audit log"; README ``--audit-log``).

``execgate run --audit-log FILE`` with FILE in the working directory — what ``--audit-log
audit.jsonl`` gives when run from the project directory, ``--cwd``'s default — leaves the file
writable inside the bwrap sandbox: execgate keeps its own package, its virtualenv and a remote
service's token files read-only or hidden there, warns about token files it cannot mask, but
neither protects nor warns about the audit log. The session runs ``su`` (denied, audited), then
filters its denial out of the log, replaces the file (``mv``) and appends a forged record; or,
the log one directory down, moves that directory away and writes a forged log in its place.

Seen on 0bc5a1e: after the run the log holds no ``su`` record and holds the forged one. The log
must still hold the denial and no record the session wrote.
"""

from __future__ import annotations

import json

import pytest

from attack_support import Attacker

pytestmark = pytest.mark.e2e

SCRIPT = """
su -c id root; echo "su=$?"
grep -v '"/usr/bin/su"' audit.jsonl > audit.new; echo '{"decision":"run","argv":["forged-by-the-session"]}' >> audit.new
mv -f audit.new audit.jsonl 2>/dev/null || cat audit.new > audit.jsonl; echo "tampered=$?"
"""


# The log one directory down: the session moves that directory away and makes another in its place.
SCRIPT_DIR = """
su -c id root; echo "su=$?"
mv logs logs.old; mkdir -p logs; grep -v '"/usr/bin/su"' logs.old/audit.jsonl > logs/audit.jsonl
echo '{"decision":"run","argv":["forged-by-the-session"]}' >> logs/audit.jsonl; echo "tampered=$?"
"""


@pytest.mark.parametrize("where", ["workdir", "subdirectory"])
def test_the_session_cannot_rewrite_its_audit_log(attacker: Attacker, where: str) -> None:
    work = attacker.workdir()
    audit = work / "audit.jsonl" if where == "workdir" else work / "logs" / "audit.jsonl"
    audit.parent.mkdir(exist_ok=True)
    audit.parent.chmod(0o777)
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--audit-log", str(audit), "--cwd", str(work),
                             "--", SCRIPT if where == "workdir" else SCRIPT_DIR, cwd=work)
    out = done.stdout + done.stderr
    assert "su=1" in done.stdout and "Execution denied" in done.stderr, out  # su was denied
    text = audit.read_text()
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert not any("forged-by-the-session" in r.get("argv", []) for r in records), (
        "the session wrote a record into the audit log:\n" + text[-2000:])
    assert any(r.get("program", "").endswith("/su") and r.get("decision") == "deny" for r in records), (
        "the session removed its su denial from the audit log:\n" + text[-2000:])
