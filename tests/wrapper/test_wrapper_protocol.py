"""The client side of the escalation protocol, byte for byte, for both execve wrappers (Python and
native), against a server driven step by step over real sockets (tests/native_support.RawPeer)."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from native_support import RawPeer, raw_frame, read_raw_frame, write_frame

#: Byte-exact frames of the Codex shell-escalation protocol, kept in the repository.
VECTORS = Path(__file__).resolve().parents[1] / "data" / "protocol.json"


def vector(name: str) -> bytes:
    frames = json.loads(VECTORS.read_text())["frames"]
    return bytes.fromhex(next(f["frame_hex"] for f in frames if f["name"] == name))


@pytest.fixture
def peer(tmp_path: Path):
    p = RawPeer(tmp_path)
    try:
        yield p
    finally:
        p.close()


def finish(proc: subprocess.Popen[bytes], timeout: float = 20) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(), err.decode()


def test_request_frame_is_byte_exact(peer: RawPeer, wrapper_path: str, wrapper_kind: str) -> None:
    env = {"A": "1", **peer.overlay(wrapper_path)}
    proc = peer.spawn(wrapper_path, ["/bin/echo", "echo", "hi"], env, cwd="/tmp")
    with peer.accept_handshake() as stream:
        frame, fds = read_raw_frame(stream)
        stream.sendall(vector("response_deny_reason"))
    code, out, err = finish(proc)
    request = json.loads(frame[4:])
    try:
        # The execgate extension: the target, opened O_PATH, rides on the frame (the very file).
        assert len(fds) == 1 and _same_file(os.fstat(fds[0]), os.stat("/bin/echo"))
        assert os.readlink(f"/proc/self/fd/{fds[0]}") == os.path.realpath("/bin/echo")
    finally:
        for fd in fds:
            os.close(fd)
    assert struct.unpack("<I", frame[:4])[0] == len(frame) - 4
    assert request["file"] == "/bin/echo" and request["argv"] == ["echo", "hi"] and request["workdir"] == "/tmp"
    assert "CODEX_ESCALATE_SOCKET" not in request["env"] and "EXEC_WRAPPER" not in request["env"]
    assert request["execgate_target_fd"] is True and list(request)[-1] == "execgate_target_fd"
    if wrapper_kind == "native":  # the Python interpreter may add LC_CTYPE (PEP 538) to its env
        # The Codex frame byte for byte, with the extension field appended (Codex servers ignore it).
        codex = vector("escalate_request")[4:]
        assert frame[4:] == codex[:-1] + b',"execgate_target_fd":true}'
    assert (code, out, err) == (1, "", "Execution denied: Execution forbidden by policy\n")


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_request_without_openable_target_is_the_codex_request(peer: RawPeer, wrapper_path: str) -> None:
    proc = peer.spawn(wrapper_path, ["/nonexistent/tool", "tool"], peer.overlay(wrapper_path), cwd="/tmp")
    with peer.accept_handshake() as stream:
        frame, fds = read_raw_frame(stream)
        write_frame(stream, {"action": "Run"})
    code, _, err = finish(proc)
    request = json.loads(frame[4:])
    assert fds == [] and list(request) == ["file", "argv", "workdir", "env"]
    assert code == 127 and "/nonexistent/tool" in err  # execve's own error, nothing ran


def test_run_executes_the_very_file_that_was_sent(peer: RawPeer, wrapper_path: str, tmp_path: Path) -> None:
    # The path is retargeted between the request and the answer: Run executes the file judged.
    link = tmp_path / "tool"
    link.symlink_to("/bin/echo")
    proc = peer.spawn(wrapper_path, [str(link), "tool", "judged-file-ran"], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        _, fds = read_raw_frame(stream)
        for fd in fds:
            os.close(fd)
        link.unlink()
        link.symlink_to("/bin/false")
        write_frame(stream, {"action": "Run"})
    assert finish(proc) == (0, "judged-file-ran\n", "")


def test_run_of_a_script_goes_by_path_when_unchanged(peer: RawPeer, wrapper_path: str, tmp_path: Path) -> None:
    script = tmp_path / "hello"
    script.write_text('#!/bin/sh\necho "script $0 $1"\n')
    script.chmod(0o755)
    proc = peer.spawn(wrapper_path, [str(script), "hello", "x"], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        _, fds = read_raw_frame(stream)
        assert len(fds) == 1
        os.close(fds[0])
        write_frame(stream, {"action": "Run"})
    # $0 is the script's path, as without execgate (not /dev/fd/N).
    assert finish(proc) == (0, f"script {script} x\n", "")


def test_run_of_a_script_replaced_after_the_request_is_refused(peer: RawPeer, wrapper_path: str, tmp_path: Path) -> None:
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\necho judged\n")
    script.chmod(0o755)
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\necho swapped-in\n")
    other.chmod(0o755)
    proc = peer.spawn(wrapper_path, [str(script), "tool"], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        _, fds = read_raw_frame(stream)
        for fd in fds:
            os.close(fd)
        other.rename(script)
        write_frame(stream, {"action": "Run"})
    code, out, err = finish(proc)
    assert (code, out) == (126, "") and "names another file now than the one approved" in err


@pytest.mark.parametrize(
    ("answer", "message"),
    [("response_deny_reason", "Execution denied: Execution forbidden by policy\n"), ("response_deny_null", "Execution denied\n")],
)
def test_deny(peer: RawPeer, wrapper_path: str, answer: str, message: str) -> None:
    proc = peer.spawn(wrapper_path, ["/bin/echo", "echo", "must-not-run"], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        read_raw_frame(stream)
        stream.sendall(vector(answer))
    assert finish(proc) == (1, "", message)


def test_run_execs_in_place_keeping_the_inherited_socket(peer: RawPeer, wrapper_path: str) -> None:
    script = 'echo "run-ok $0 $1"; [ -S /proc/$$/fd/$CODEX_ESCALATE_SOCKET ] && echo socket-kept'
    proc = peer.spawn(wrapper_path, ["/bin/sh", "sh", "-c", script, "zero", "arg1"], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        read_raw_frame(stream)
        stream.sendall(vector("response_run"))
    code, out, _ = finish(proc)
    assert (code, out) == (0, "run-ok zero arg1\nsocket-kept\n")


def test_unknown_fields_and_any_spacing_are_accepted(peer: RawPeer, wrapper_path: str) -> None:
    answer = b' { "extra" : [1, {"a": null, "b": "\\u00e9\\"]"}], "action" :\n"Run", "z": -1.5e3 } '
    proc = peer.spawn(wrapper_path, ["/bin/echo", "echo", "ran"], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        read_raw_frame(stream)
        stream.sendall(raw_frame(answer))
    assert finish(proc)[:2] == (0, "ran\n")


def test_escalate_passes_stdio_and_exits_with_the_status(peer: RawPeer, wrapper_path: str) -> None:
    proc = peer.spawn(wrapper_path, ["/bin/echo", "echo", "x"], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        read_raw_frame(stream)
        stream.sendall(vector("response_escalate"))
        frame, fds = read_raw_frame(stream)
        try:
            assert frame == vector("super_exec_message") and len(fds) == 3
            os.write(fds[1], b"escalated-out\n")
            os.write(fds[2], b"escalated-err\n")
        finally:
            for fd in fds:
                os.close(fd)
        stream.sendall(vector("super_exec_result"))
    assert finish(proc) == (42, "escalated-out\n", "escalated-err\n")


def test_signals_are_forwarded_when_the_server_offers_it(peer: RawPeer, wrapper_path: str) -> None:
    proc = peer.spawn(wrapper_path, ["/bin/sleep", "sleep", "100"], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        read_raw_frame(stream)
        write_frame(stream, {"action": "Escalate", "execgate_signals": True})
        _, fds = read_raw_frame(stream)
        for fd in fds:
            os.close(fd)
        time.sleep(0.3)  # the Python wrapper installs its handlers after sending the fds
        proc.send_signal(signal.SIGTERM)
        frame, _ = read_raw_frame(stream)
        assert json.loads(frame[4:]) == {"signal": signal.SIGTERM}
        write_frame(stream, {"exit_code": 128 + signal.SIGTERM})
    assert finish(proc)[0] == 128 + signal.SIGTERM


@pytest.mark.parametrize(
    "answer",
    [
        raw_frame(b"not json"),
        raw_frame(b'{"action":"Launch"}'),
        raw_frame(b"[]"),
        raw_frame(b'{"action":{"Deny":{"reason":5}}}'),
        raw_frame(b'{"action":"Run"} x'),
        raw_frame(b'{"action":"Run'),
        raw_frame(b'{"action":"R\\qun"}'),
        raw_frame(b'{"a":' + b"[" * 100_000 + b'], "action":"Run"}'),
        struct.pack("<I", (1 << 20) + 1),
        b"",
    ],
    ids=[
        "not-json", "unknown-action", "not-object", "bad-reason", "trailing-garbage", "unterminated",
        "bad-escape", "deep-nesting", "oversized", "eof",
    ],
)
def test_broken_answers_fail_closed(peer: RawPeer, wrapper_path: str, answer: bytes) -> None:
    proc = peer.spawn(wrapper_path, ["/bin/echo", "echo", "must-not-run"], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        read_raw_frame(stream)
        stream.sendall(answer)
    code, out, err = finish(proc)
    assert code == 126 and out == ""
    assert err.startswith("execgate-wrapper: ") and err.count("\n") == 1


@pytest.mark.parametrize("fd_state", ["unset", "closed", "not-a-socket"])
def test_fallback_path_when_the_inherited_fd_is_gone(peer: RawPeer, wrapper_path: str, fd_state: str) -> None:
    env = peer.overlay(wrapper_path, fd=False, path=True)
    if fd_state == "closed":
        env["CODEX_ESCALATE_SOCKET"] = "987"
    elif fd_state == "not-a-socket":
        env["CODEX_ESCALATE_SOCKET"] = "0"  # /dev/null
    proc = peer.spawn(wrapper_path, ["/bin/echo", "echo", "via-fallback"], env)
    with peer.accept_fallback() as conn:
        frame, _ = read_raw_frame(conn)
        assert json.loads(frame[4:])["argv"] == ["echo", "via-fallback"]
        conn.sendall(vector("response_run"))
    assert finish(proc)[:2] == (0, "via-fallback\n")


def test_no_server_at_all_fails_closed(peer: RawPeer, wrapper_path: str) -> None:
    env = {"EXEC_WRAPPER": wrapper_path, "CODEX_ESCALATE_SOCKET": "987", "EXECGATE_SOCKET_PATH": "/nonexistent/s"}
    code, out, err = finish(peer.spawn(wrapper_path, ["/bin/echo", "echo", "must-not-run"], env))
    assert code == 126 and out == ""
    assert err.startswith("execgate-wrapper: cannot reach the escalation server") and err.count("\n") == 1


def test_json_string_escaping_round_trips(peer: RawPeer, wrapper_path: str) -> None:
    tricky = ['q"uote', "back\\slash", "new\nline\ttab\r", "\x01\x1f\x7f", "é漢😀", "/", ""]
    proc = peer.spawn(wrapper_path, ["/bin/true", *tricky], {"K\x02": "v\"\\", **peer.overlay(wrapper_path)})
    with peer.accept_handshake() as stream:
        frame, _ = read_raw_frame(stream)
        stream.sendall(vector("response_deny_null"))
    finish(proc)
    request = json.loads(frame[4:].decode("utf-8"))
    assert request["argv"] == tricky and request["env"]["K\x02"] == 'v"\\'


def test_non_utf8_bytes_use_surrogateescape(peer: RawPeer, wrapper_path: str) -> None:
    raw = [b"\xff\xfe", b"ok\xc3", b"\xed\xa0\x80", b"\xc3\xa9"]  # invalid, truncated, surrogate, valid
    proc = peer.spawn(wrapper_path, [b"/bin/true", *raw], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        frame, _ = read_raw_frame(stream)
        stream.sendall(vector("response_deny_null"))
    finish(proc)
    payload = frame[4:]
    payload.decode("utf-8")  # the frame itself is valid UTF-8
    assert b"\\udcff\\udcfe" in payload
    assert [os.fsencode(a) for a in json.loads(payload)["argv"]] == raw


def test_non_utf8_bytes_in_file_env_and_workdir_round_trip_and_run(peer: RawPeer, wrapper_path: str, tmp_path: Path) -> None:
    workdir = os.fsencode(tmp_path) + b"/d\xe9\xff"
    os.mkdir(workdir)
    script = workdir + b"/t\xfe"
    with open(script, "wb") as f:
        f.write(b'#!/bin/sh\nprintf "%s|%s|" "$1" "$K"; pwd\n')
    os.chmod(script, 0o755)
    env = {b"K": b"v\x80", b"N\xc3": b"x", **{os.fsencode(k): os.fsencode(v) for k, v in peer.overlay(wrapper_path).items()}}
    proc = peer.spawn(wrapper_path, [script, b"t", b"a\xff\xc3\xa9"], env, cwd=workdir)  # type: ignore[arg-type]
    with peer.accept_handshake() as stream:
        frame, _ = read_raw_frame(stream)
        stream.sendall(vector("response_run"))
    out, _ = proc.communicate(timeout=20)
    request = json.loads(frame[4:].decode("utf-8"))
    assert os.fsencode(request["file"]) == script and os.fsencode(request["workdir"]) == workdir
    assert request["argv"] == ["t", "a\udcff\u00e9"]
    assert request["env"]["K"] == "v\udc80" and request["env"]["N\udcc3"] == "x"
    assert (proc.returncode, out) == (0, b"a\xff\xc3\xa9|v\x80|" + workdir + b"\n")


def test_file_alone_is_an_exec_with_an_empty_argv(peer: RawPeer, wrapper_path: str, tmp_path: Path) -> None:
    script = tmp_path / "argc"
    script.write_text('#!/bin/sh\necho "ran $#"\n')
    script.chmod(0o755)
    proc = peer.spawn(wrapper_path, [str(script)], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        frame, _ = read_raw_frame(stream)
        stream.sendall(vector("response_run"))
    request = json.loads(frame[4:])
    assert request["file"] == str(script) and request["argv"] == []
    assert finish(proc) == (0, "ran 0\n", "")


def test_empty_argv0_is_passed_on(peer: RawPeer, wrapper_path: str) -> None:
    proc = peer.spawn(wrapper_path, ["/bin/sh", "", "-c", 'echo "[$0]"'], peer.overlay(wrapper_path))
    with peer.accept_handshake() as stream:
        frame, _ = read_raw_frame(stream)
        stream.sendall(vector("response_run"))
    assert json.loads(frame[4:])["argv"] == ["", "-c", 'echo "[$0]"']
    assert finish(proc) == (0, "[]\n", "")


def test_no_arguments_at_all_is_a_usage_error(peer: RawPeer, wrapper_path: str) -> None:
    code, out, err = finish(peer.spawn(wrapper_path, [], peer.overlay(wrapper_path)))
    assert code == 2 and out == "" and err.startswith("execgate-wrapper: usage: ") and err.count("\n") == 1
