"""``execgate run`` keeps the order the script wrote when its stdout and stderr go to one place
(issue 12, item 8: "`2>&1` in a terminal … must keep the order the script wrote").

Streaming into one terminal or one pipe/file for both, the shell gets one pipe for fd 1 and fd 2,
so back-to-back writes to the two streams cannot be reordered (two pipes read as they arrive could
swap them). With stdout and stderr going to different places there is no order to keep between
them; ``--json``'s ``output`` still reads two pipes (README, "Output and memory").
"""

from __future__ import annotations

import os
import subprocess

import pytest

from run_support import CLI

pytestmark = pytest.mark.e2e

SCRIPT = "for i in $(seq 300); do echo out$i; echo err$i >&2; done; su -c true; echo end"
DENIAL = "Execution denied: privilege escalation is not allowed; ask the operator to change the environment instead\n"
WANT = "".join(f"out{i}\nerr{i}\n" for i in range(1, 301)) + DENIAL + "end\n"


def test_one_pipe_for_both_keeps_the_order_written(tmp_path):
    done = subprocess.run([*CLI, "run", "-q", "--sandbox", "none", "--cwd", str(tmp_path), "--", SCRIPT],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout) == (0, WANT)


def test_one_terminal_for_both_keeps_the_order_written(tmp_path):
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([*CLI, "run", "-q", "--sandbox", "bwrap", "--cwd", str(tmp_path), "--", SCRIPT],
                                stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
        os.close(slave)
        seen = bytearray()
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=120) == 0
    finally:
        os.close(master)
    assert seen.decode().replace("\r\n", "\n") == WANT


def test_separate_destinations_still_get_their_own_stream(tmp_path):
    done = subprocess.run([*CLI, "run", "-q", "--sandbox", "none", "--cwd", str(tmp_path), "--", SCRIPT],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0
    assert done.stdout == "".join(f"out{i}\n" for i in range(1, 301)) + "end\n"
    assert done.stderr == "".join(f"err{i}\n" for i in range(1, 301)) + DENIAL
