"""Bounded memory of ``execgate run`` (issue 9, class 9; docs/DESIGN.md §8 "Bounded work").

A script prints 1 GiB. Streaming (the default) copies it through and holds none of it; ``--json``
keeps the first ``--max-capture`` bytes of each stream (16 MiB by default), says what it dropped,
and still reads everything so the script never blocks. The peak RSS of the ``execgate run``
process is read from ``/proc/PID/status`` (VmHWM, sampled while it runs) and, for the last
moments before it exits, from the kernel's own count at reaping (``wait4`` ru_maxrss, taken by a
small launcher process: see :data:`LAUNCHER`). Before the
bound, the same scripts drove ``execgate run`` to several GB.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

import pytest

from attack_support import attacker  # noqa: F401  (fixture)
from run_support import CLI

pytestmark = pytest.mark.e2e

GIB = 1 << 30
MIB = 1 << 20
#: Far below the 1 GiB printed; the baseline of `execgate run` is ~50 MB.
RSS_BOUND_KIB = 200 * 1024
#: The documented default of --max-capture.
DEFAULT_CAP = 16 * MIB


#: Starts ``execgate run`` from a small fresh process and reports, on the fd ``argv[1]``, its pid and then the
#: kernel's peak RSS count for it at reaping (``wait4`` ru_maxrss, KiB). The peak counts the memory
#: a process had before it exec'd: spawned straight from the (large) test process it would count
#: the test's own pages.
LAUNCHER = """
import os, sys
report = int(sys.argv[1])
os.set_inheritable(report, False)
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
os.write(report, b"%d\\n" % pid)
_, status, usage = os.wait4(pid, 0)
os.write(report, b"%d\\n" % usage.ru_maxrss)
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


@dataclass
class Finished:
    status: int
    peak_rss_kib: int  # max of VmHWM sampled from /proc and ru_maxrss at reaping
    stdout: bytes
    stderr: str


def _vm_hwm_kib(pid: int) -> int:
    """VmHWM (peak resident set size, KiB) of a live process; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(*args: str, stdout_reader=None, timeout_s: float = 120, attacker=None) -> Finished:
    """Run ``execgate run -q ARGS…`` and measure its peak RSS.

    ``stdout_reader(pipe) -> bytes`` consumes its stdout in a thread (default: read it all; a
    reader that returns without reading leaves the pipe open and unread until the process is
    gone). Fails the test if the process does not exit within ``timeout_s`` (it is killed).
    ``attacker`` (tests/attack_support.py): run it as that account, in its working directory.
    """
    argv = [sys.executable, "-c", LAUNCHER, "{fd}", *CLI, "run", "-q", *args]
    return _measured(argv, stdout_reader, timeout_s, attacker)


def _measured(argv: list[str], stdout_reader, timeout_s: float, attacker) -> Finished:
    report_r, report_w = os.pipe()
    with open(os.devnull, "rb") as null, tempfile.TemporaryFile("w+") as err, os.fdopen(report_r, "rb") as report:
        argv = [str(report_w) if a == "{fd}" else a for a in argv]
        where = {} if attacker is None else {"cwd": attacker.workdir(), "env": attacker.env()}
        proc = subprocess.Popen(argv if attacker is None else attacker.command(argv), stdin=null,
                                stdout=subprocess.PIPE, stderr=err, pass_fds=[report_w], **where)
        os.close(report_w)
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append((stdout_reader or (lambda p: p.read()))(proc.stdout)))
        reader.start()
        pid = int(report.readline())
        peak, done, killed = 0, threading.Event(), threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.01):
                peak = max(peak, _vm_hwm_kib(pid))

        def kill() -> None:
            killed.set()
            os.kill(pid, signal.SIGKILL)

        sampler, timer = threading.Thread(target=sample), threading.Timer(timeout_s, kill)
        sampler.start()
        timer.start()
        try:
            maxrss = int(report.readline())
            proc.wait()
        finally:
            timer.cancel()
            done.set()
            sampler.join()
        reader.join()
        proc.stdout.close()
        assert not killed.is_set(), f"execgate run did not exit within {timeout_s} s"
        err.seek(0)
        return Finished(proc.returncode, max(peak, maxrss), got[0] if got else b"", err.read())


def _count_x(pipe) -> bytes:
    """Read a stream of b"x" to EOF in 1 MiB reads; returns a summary instead of the bytes."""
    total = other = 0
    while chunk := pipe.read1(MIB):
        total += len(chunk)
        other += len(chunk) - chunk.count(b"x")
    return f"{total} {other}".encode()


def test_streaming_a_gib_holds_none_of_it(tmp_path):
    done = run_measured("--sandbox", "none", "--cwd", str(tmp_path), "--",
                        f"head -c {GIB} /dev/zero | tr '\\0' x; echo done >&2", stdout_reader=_count_x)
    assert (done.status, done.stdout, done.stderr) == (0, f"{GIB} 0".encode(), "done\n")
    assert done.peak_rss_kib < RSS_BOUND_KIB, f"execgate run peaked at {done.peak_rss_kib} KiB"


def test_streaming_a_gib_in_bwrap_as_root_and_as_a_user_holds_none_of_it(attacker):
    """The same bound with the default sandbox, as root and as an unprivileged account."""
    done = run_measured("--sandbox", "bwrap", "--", f"head -c {GIB} /dev/zero | tr '\\0' x; echo done >&2",
                        stdout_reader=_count_x, attacker=attacker)
    assert (done.status, done.stdout, done.stderr) == (0, f"{GIB} 0".encode(), "done\n"), done.stderr
    assert done.peak_rss_kib < RSS_BOUND_KIB, f"execgate run peaked at {done.peak_rss_kib} KiB"


def _seq_prefix(n_bytes: int) -> str:
    """The first ``n_bytes`` of ``seq 1 …``'s output."""
    text = "".join(f"{i}\n" for i in range(1, n_bytes // 4))
    assert len(text) >= n_bytes
    return text[:n_bytes]


def test_json_keeps_the_first_16_mib_and_says_it_dropped_the_rest(tmp_path):
    script = f"seq 1 200000000 | head -c {GIB}; echo done >&2"
    done = run_measured("--json", "--sandbox", "none", "--cwd", str(tmp_path), "--", script)
    assert done.status == 0
    assert done.peak_rss_kib < RSS_BOUND_KIB, f"execgate run peaked at {done.peak_rss_kib} KiB"
    result = json.loads(done.stdout)
    assert result["stdout"] == _seq_prefix(DEFAULT_CAP)
    assert result["stderr"] == "done\n"
    # stderr was written after all of stdout, by then far past the cap of `output`.
    assert result["output"] == result["stdout"]
    assert result["truncated"] == {"stdout": GIB - DEFAULT_CAP, "output": GIB + 5 - DEFAULT_CAP}
    assert done.stderr == (f"execgate: --json: output truncated at {DEFAULT_CAP} bytes per stream; bytes dropped: "
                           f"stdout {GIB - DEFAULT_CAP}, output {GIB + 5 - DEFAULT_CAP} (see --max-capture)\n")


def test_max_capture_cuts_before_a_split_character_and_reads_on(tmp_path):
    # 'ab', then a 2-byte é that the 3-byte cap splits, then 100 MiB the script can only finish
    # writing if execgate keeps reading past the cap.
    script = f"printf 'ab\\303\\251cd'; head -c {100 * MIB} /dev/zero; echo end >&2"
    done = run_measured("--json", "--max-capture", "3", "--sandbox", "none", "--cwd", str(tmp_path), "--", script)
    result = json.loads(done.stdout)
    assert (done.status, result["stdout"], result["stderr"], result["output"]) == (0, "ab", "end", "ab")
    assert result["truncated"] == {"stdout": 4 + 100 * MIB, "stderr": 1, "output": 4 + 100 * MIB + 4}
    whole = run_measured("--json", "--max-capture", "0", "--cwd", str(tmp_path), "--sandbox", "none", "--", "echo hi")
    assert json.loads(whole.stdout)["truncated"] == {"stdout": 3, "output": 3}


def test_max_capture_is_refused_without_json_and_when_not_a_byte_count(tmp_path):
    for args, complaint in ((["--max-capture", "10"], "--max-capture is for --json"),
                            (["--json", "--max-capture", "-1"], "must be >= 0 bytes"),
                            (["--json", "--max-capture", "1M"], "not a whole number of bytes")):
        done = subprocess.run([*CLI, "run", "-q", "--sandbox", "none", *args, "--cwd", str(tmp_path), "--", "true"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2 and complaint in done.stderr, (args, done.stderr)


def test_a_stalled_reader_holds_back_the_script_not_the_timeout(tmp_path):
    # Nobody reads execgate's stdout: the copy stops (no buffer grows), and --timeout still fires.
    done = run_measured("--timeout", "3", "--sandbox", "none", "--cwd", str(tmp_path), "--", "yes",
                        stdout_reader=lambda pipe: b"", timeout_s=60)
    assert done.status == 124 and "timed out after 3 s" in done.stderr
    assert done.peak_rss_kib < RSS_BOUND_KIB


def test_a_reader_that_goes_away_stops_the_script_with_sigpipe(tmp_path):
    # `execgate run -- yes | head -n 1`: as in a plain pipeline, yes dies of SIGPIPE (141).
    def one_line(pipe) -> bytes:
        line = pipe.readline()
        pipe.close()
        return line

    done = run_measured("--sandbox", "none", "--cwd", str(tmp_path), "--", "yes", stdout_reader=one_line, timeout_s=60)
    assert (done.stdout, done.status) == (b"y\n", 141)
