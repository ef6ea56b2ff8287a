"""Bounded output (docs/DESIGN.md §3, §8): :class:`CaptureBuffer` keeps a prefix and counts the
rest, cutting before a split UTF-8 character; ``EscalateServer.exec(max_capture=...)`` caps what a
real bash and an escalated command print; :class:`StdioWriter` copies chunks to fds in order and a
reader that went away gives the script EPIPE instead of a hang."""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from core_support import ESCALATE, TablePolicy, wrapper_script
from execgate.server.escalate_server import DEFAULT_MAX_CAPTURE, EscalateServer, ExecResult
from execgate.server.output import CaptureBuffer, StdioWriter, complete_utf8_prefix

BASH = shutil.which("bash") or "/bin/bash"
E_ACUTE = "é".encode()  # 2 bytes
EURO = "€".encode()  # 3 bytes
CLEF = "𝄞".encode()  # 4 bytes


@pytest.mark.parametrize("data, want", [
    (b"", 0), (b"abc", 3), (b"ab" + E_ACUTE, 4), (b"ab" + E_ACUTE[:1], 2),
    (EURO[:2], 0), (b"x" + EURO[:1], 1), (CLEF[:3], 0), (CLEF, 4), (b"a" + CLEF[:2], 1),
    (b"\x80\x80\x80\x80", 4),  # not UTF-8 at all: left alone
    (b"a\xff", 2),
])
def test_complete_utf8_prefix(data, want):
    assert complete_utf8_prefix(data) == want


def test_capture_buffer_keeps_a_prefix_across_chunks_and_counts_the_rest():
    buf = CaptureBuffer(10)
    for chunk in (b"0123", b"4567", b"89ab", b"cdef"):
        buf.add(chunk)
    assert (buf.value(), buf.text(), buf.total, buf.dropped) == (b"0123456789", "0123456789", 16, 6)


def test_capture_buffer_exact_fit_is_not_truncated():
    buf = CaptureBuffer(4)
    buf.add(b"ab" + E_ACUTE)
    assert (buf.text(), buf.dropped) == ("abé", 0)


def test_capture_buffer_cut_inside_a_character_drops_the_whole_character():
    # The cap falls inside the 3-byte euro sign, which straddles two chunks.
    buf = CaptureBuffer(4)
    buf.add(b"ab" + EURO[:1])
    buf.add(EURO[1:] + b"cd")
    assert (buf.value(), buf.text(), buf.dropped) == (b"ab", "ab", 5)


def test_capture_buffer_untruncated_output_keeps_its_own_broken_tail():
    buf = CaptureBuffer(100)
    buf.add(b"ab" + EURO[:2])  # the script itself ended inside a character
    assert (buf.value(), buf.text(), buf.dropped) == (b"ab" + EURO[:2], "ab\ufffd", 0)


def test_capture_buffer_zero_keeps_nothing_and_negative_is_refused():
    buf = CaptureBuffer(0)
    buf.add(b"hello")
    assert (buf.value(), buf.dropped) == (b"", 5)
    with pytest.raises(ValueError, match=">= 0"):
        CaptureBuffer(-1)


def test_default_cap_and_untruncated_result_shape():
    assert DEFAULT_MAX_CAPTURE == 16 * 1024 * 1024
    result = ExecResult(0, "", "", "", 0.0, False)
    assert result.truncated == {} and result.to_dict()["truncated"] == {}


def _server(policy, tmp) -> EscalateServer:
    return EscalateServer(BASH, wrapper_script(tmp), policy, socket_dir=str(tmp))


@pytest.mark.anyio
async def test_exec_caps_each_stream_and_reports_what_it_dropped(short_tmp):
    # 100 000 bytes of stdout from bash, 50 000 of stderr from an escalated sh (which writes into
    # the same pipes through the wrapper's fds): every stream is cut at 1000 bytes and counted.
    policy = TablePolicy({"sh": ESCALATE})
    script = ("head -c 100000 /dev/zero | tr '\\0' o; "
              '"$EXEC_WRAPPER" /bin/sh sh -c "head -c 50000 /dev/zero | tr \'\\\\0\' e >&2"; echo "status=$?"')
    result = await _server(policy, short_tmp).exec(script, str(short_tmp), timeout_s=60, max_capture=1000)
    assert result.exit_code == 0 and policy.programs == ["/bin/sh"]
    assert (result.stdout, result.stderr) == ("o" * 1000, "e" * 1000)
    assert len(result.output) == 1000 and result.output.startswith("o")
    assert result.truncated == {"stdout": 100000 + len("status=0\n") - 1000, "stderr": 49000,
                                "output": 150000 + len("status=0\n") - 1000}


@pytest.mark.anyio
async def test_exec_refuses_a_negative_cap(short_tmp):
    with pytest.raises(ValueError):
        await _server(TablePolicy(), short_tmp).exec("true", str(short_tmp), max_capture=-1)


@pytest.mark.anyio
async def test_stdio_writer_copies_both_streams_in_order_to_its_fds(short_tmp):
    out = short_tmp / "out"
    with open(out, "wb") as sink:
        writer = StdioWriter({"stdout": sink.fileno(), "stderr": sink.fileno()})
        script = "for i in 1 2 3; do echo out$i; echo err$i >&2; done"
        result = await _server(TablePolicy(), short_tmp).exec(script, str(short_tmp), on_output=writer,
                                                              max_capture=0)
    assert result.exit_code == 0 and (result.stdout, result.output) == ("", "")
    # Two pipes: each stream's order is exact; how the two interleave depends on when they were read.
    lines = out.read_text().splitlines()
    assert [x for x in lines if x.startswith("out")] == ["out1", "out2", "out3"]
    assert [x for x in lines if x.startswith("err")] == ["err1", "err2", "err3"] and len(lines) == 6
    assert result.truncated == {"stdout": 15, "stderr": 15, "output": 30}


@pytest.mark.anyio
async def test_a_reader_that_went_away_gives_the_script_epipe_not_a_hang(short_tmp):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        writer = StdioWriter({"stdout": write_end, "stderr": write_end})
        result = await _server(TablePolicy(), short_tmp).exec("yes", str(short_tmp), timeout_s=60,
                                                              on_output=writer, max_capture=0)
    finally:
        os.close(write_end)
    assert (result.exit_code, result.timed_out) == (128 + signal.SIGPIPE, False)


@pytest.mark.anyio
async def test_stderr_to_stdout_keeps_the_exact_order_written(short_tmp):
    # One pipe for both (2>&1): the order is the order written, even for writes made back to back.
    script = "for i in $(seq 200); do echo out$i; echo err$i >&2; done"
    result = await _server(TablePolicy(), short_tmp).exec(script, str(short_tmp), stderr_to_stdout=True)
    want = "".join(f"out{i}\nerr{i}\n" for i in range(1, 201))
    assert (result.exit_code, result.stdout, result.stderr, result.output) == (0, want, "", want)
