"""Attack: the decision cache (docs/DESIGN.md §9). A script that reads our source knows a Run is
cached after the first exec of a program; it tries to make that entry answer something else.

Each test runs ``execgate run --sandbox bwrap --cache-ttl 60`` for real (the embedded service
behind the gRPC client, with the cache: without ``--cache-ttl`` it decides in process and caches
nothing), as root and as an unprivileged user: the script gets a Run cached for
an allowed file, then names a denied one by a route that shares as much of the key as it can —
the same path (a symlink re-pointed; a file rewritten in place, same inode, into a script), the
same file under another argv[0] (``exec -a``). The deny must hold on every route, and the audit
log must show that the cache was in use (lines marked ``cached``) and one line per exec.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from attack_support import Attacker
from execgate.server.sandbox import bwrap_usable

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")]

DENY_MARK = """
[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"

[[rule]]
id = "no-scripts"
file_kind = ["script"]
decision = "deny"
justification = "no scripts here"
match = [{ command = "./s", file_kind = ["script"] }]
"""


def _run(attacker: Attacker, script: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    work = attacker.workdir()
    rules_file = work / "rules.toml"
    rules_file.write_text(DENY_MARK)
    audit = work / "audit.jsonl"
    attacker.marker_program(work, "mark")
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--cache-ttl", "60", "--rules", str(rules_file),
                             "--audit-log", str(audit), "--cwd", str(work), "--", script, cwd=work)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, records


def _assert_denied(attacker: Attacker, done: subprocess.CompletedProcess[str], records: list[dict],
                   reason: str, program: str) -> None:
    out = done.stdout + done.stderr
    assert not attacker.marker_ran("mark"), out
    assert f"Execution denied: {reason}" in done.stderr, out
    assert "ok=0 ok=0" in done.stdout and "status=1" in done.stdout, out
    mine = [r for r in records if r["program"] == program]
    # Cached lines are appended when flushed (their ``time`` is the exec's), so compare as sets:
    # one line per exec, the second Run from the cache, the Deny not.
    assert sorted((r["decision"], r["cached"]) for r in mine) == [("deny", False), ("run", False), ("run", True)], mine


def test_symlink_repointed_cannot_borrow_a_cached_run(attacker: Attacker) -> None:
    script = ('cp /bin/true ./ok && ln -sfn ./ok link; ./link; a=$?; ./link; echo "ok=$a ok=$?"; '
              'ln -sfn ./mark link; ./link; echo "status=$?"')
    done, records = _run(attacker, script)
    _assert_denied(attacker, done, records, "the marker must never run", str(attacker.workdir() / "link"))


def test_file_rewritten_in_place_cannot_borrow_a_cached_run(attacker: Attacker) -> None:
    """Same path, same device and inode: its contents (now a script) are other file facts."""
    script = ('cp /bin/true ./tool; ./tool; a=$?; ./tool; echo "ok=$a ok=$?"; '
              'stat -c %i tool > inode.before; cat ./mark > ./tool; stat -c %i tool > inode.after; '
              './tool; echo "status=$?"')
    done, records = _run(attacker, script)
    work = attacker.workdir()
    assert (work / "inode.before").read_text() == (work / "inode.after").read_text()
    _assert_denied(attacker, done, records, "no scripts here", str(work / "tool"))


def test_argv0_alias_cannot_borrow_a_cached_run(attacker: Attacker) -> None:
    """A deny rule also matches argv[0]'s basename: ``exec -a mark`` of a file whose Run is cached."""
    script = ('cp /bin/true ./ok; ./ok; a=$?; ./ok; echo "ok=$a ok=$?"; '
              '(exec -a mark ./ok); echo "status=$?"')
    done, records = _run(attacker, script)
    _assert_denied(attacker, done, records, "the marker must never run", str(attacker.workdir() / "ok"))
