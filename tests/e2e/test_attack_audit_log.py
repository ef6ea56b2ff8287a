"""Attack: an audit log that cannot be written (red-team finding, 2026-12-02). A session's own
decisions can fill the disk holding the audit log (a Run's line carries its argv: ~1 MB each);
after that, execs used to run with no line at all, a cut-off line was left at the end of the
file, and ``execgate run`` died at exit with a traceback. An answer that is not in the audit log
is not given: every decision is then a Deny naming the cause, the file holds whole lines only,
and the run ends normally.

The full disk is a 2 MiB tmpfs mounted here for the audit log (root only, as CI runs).
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

#: Each exec carries a ~1 MB argv (so its audit line is ~1 MB) and prints RAN-<i> if it runs.
SCRIPT = ('big=$(head -c 100000 /dev/zero | tr "\\0" A); '
          'for i in 1 2 3 4 5 6; do /bin/sh -c \'echo RAN-$1\' sh $i $big $big $big $big $big $big $big $big $big $big; '
          'sleep 0.7; done; echo end')


@pytest.fixture
def small_disk(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("mode", [(), ("--cache-ttl", "60")], ids=["inprocess", "cache"])
def test_no_exec_runs_without_its_audit_line(small_disk: Path, tmp_path: Path, mode: tuple[str, ...]) -> None:
    audit = small_disk / "audit.jsonl"
    done = subprocess.run([sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none", *mode,
                           "--audit-log", str(audit), "--cwd", str(tmp_path), "--", SCRIPT],
                          capture_output=True, text=True, timeout=180, check=False)
    out = done.stdout + done.stderr
    assert "end" in done.stdout, out
    assert "Execution denied: " in done.stderr and "audit log" in done.stderr, out  # the disk did fill
    assert "Traceback" not in done.stderr and done.returncode == 0, out
    lines = audit.read_bytes().split(b"\n")
    assert lines[-1] == b"", "the file ends with a cut-off line"
    records = [json.loads(line) for line in lines[:-1]]  # every line whole
    ran = {line.split("-", 1)[1] for line in done.stdout.splitlines() if line.startswith("RAN-")}
    audited = {r["argv"][4] for r in records if r["program"] == "/bin/sh" and r["decision"] == "run"}
    if mode:
        # A cache hit is answered before its line is written (batched every 0.5 s, docs/DESIGN.md
        # §9): the one made before the failed write was seen may be lost — said on stderr — and
        # then the cache is emptied, so every later exec is decided, and denied.
        assert ran and len(ran - audited) <= 1, (ran, audited)
        assert not (ran - audited) or "will not be in the audit log" in done.stderr, out
    else:
        assert ran and ran <= audited, (ran, audited)  # no exec ran without its line
    assert len(ran) < 6, ran  # and some were denied


def test_a_burst_of_cache_hits_loses_at_most_what_it_reports(small_disk: Path, tmp_path: Path) -> None:
    """Cache hits are answered before their lines are written: a burst of them, then a full disk
    (red-team round 3: 18 of 20 lost, 1 reported). At most 64 hits wait for their lines, every
    lost one is counted and said on stderr, and no exec runs unaccounted for."""
    audit = small_disk / "audit.jsonl"
    script = ('big=$(head -c 100000 /dev/zero | tr "\\0" A); '
              'for i in $(seq 40); do X=$i /bin/sh -c "echo RAN-\\$X" sh $big $big $big $big $big $big $big $big $big; '
              'done; echo end')
    done = subprocess.run([sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none",
                           "--cache-ttl", "60", "--audit-log", str(audit), "--cwd", str(tmp_path), "--", script],
                          capture_output=True, text=True, timeout=180, check=False)
    out = done.stdout + done.stderr
    assert "end" in done.stdout and "Traceback" not in done.stderr, out
    ran = [line for line in done.stdout.splitlines() if line.startswith("RAN-")]
    records = [json.loads(line) for line in audit.read_bytes().split(b"\n")[:-1]]
    audited = [r for r in records if r["program"] == "/bin/sh" and r["decision"] == "run"]
    reported = [int(n) for n in re.findall(r"(\d+) lost so far", done.stderr)]
    lost = len(ran) - len(audited)
    assert lost <= (max(reported) if reported else 0) and lost <= 64, (len(ran), len(audited), reported, out[-2000:])


def test_two_runs_sharing_an_audit_log_keep_each_others_lines(small_disk: Path, tmp_path: Path) -> None:
    """Two runs given one ``--audit-log`` on a disk that fills: one run's cut-off of a line it
    could not write used to truncate the file to a size read before the other's append (its
    lines gone, NUL bytes in the file). Every line of the small run's execs is kept."""
    audit = small_disk / "audit.jsonl"
    big = ('big=$(head -c 100000 /dev/zero | tr "\\0" A); for i in $(seq 12); do '
           '/bin/sh -c "echo B-\\$1" sh $i $big $big $big $big $big $big $big $big $big $big; done; echo end')
    small = 'for i in $(seq 300); do /bin/echo V-$i; done; echo end'
    argv = [sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none",
            "--audit-log", str(audit), "--cwd", str(tmp_path), "--"]
    runs = [subprocess.Popen([*argv, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for script in (big, small, big)]
    outs = [run.communicate(timeout=180) for run in runs]
    data = audit.read_bytes()
    assert b"\0" not in data and data.endswith(b"\n"), data[-200:]
    records = [json.loads(line) for line in data.split(b"\n")[:-1]]
    ran = {line for line in outs[1][0].splitlines() if line.startswith("V-")}
    audited = {r["argv"][1] for r in records if r["program"] == "/bin/echo" and r["decision"] == "run"}
    assert "end" in outs[1][0] and ran and ran <= audited, (len(ran), len(audited), outs[1][1][-1000:])


def test_a_lock_held_on_the_audit_log_stalls_nothing(tmp_path: Path) -> None:
    """A session that can open the audit log (here: no sandbox, the log in its working
    directory; in a sandbox a read-only view is enough for flock(2)) holds an exclusive lock on
    it while it execs. The server takes no lock on the file, so its decisions go on; a version
    that locked each line waited on the session forever (red-team round 4)."""
    audit = tmp_path / "audit.jsonl"
    audit.touch()
    script = ("(exec 9<audit.jsonl; flock -x 9 && touch locked && while [ ! -e done ]; do :; done) & "
              "while [ ! -e locked ]; do :; done; /bin/true; /bin/echo decided; touch done; wait; echo end")
    done = subprocess.run([sys.executable, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "none",
                           "--audit-log", str(audit), "--cwd", str(tmp_path), "--", script],
                          capture_output=True, text=True, timeout=60, check=False)
    assert "decided" in done.stdout and "end" in done.stdout, done.stdout + done.stderr
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert any(r["program"] == "/bin/echo" and r["decision"] == "run" for r in records), records
