"""Sessions seen from inside: a protocol client on the session's real sockets, real children."""

from __future__ import annotations

import array
import asyncio
import os
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

from conftest import open_fd_count
from core_support import ESCALATE, TablePolicy, ask, handshake, pid_alive, request, wait_until
from execgate.server import protocol as p
from execgate.server.escalate_server import EscalateServer
from execgate.server.escalation import Limits
from execgate.server.fdpass import encode_frame, recv_frame, send_frame
from execgate.server.policy import Decision

pytestmark = pytest.mark.anyio


def _server(policy, tmp, **kw) -> EscalateServer:
    return EscalateServer("/bin/sh", "/bin/false", policy, socket_dir=str(tmp), **kw)


async def _escalate_with_devnull(sock: socket.socket) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    try:
        await send_frame(sock, p.SuperExecMessage([0, 1, 2]).to_json(), [null, null, null])
    finally:
        os.close(null)


async def _exit_code(sock: socket.socket) -> int:
    async with asyncio.timeout(20):
        payload, _ = await recv_frame(sock, max_fds=0)
    return p.SuperExecResult.from_obj(p.decode_json(payload)).exit_code


async def test_relative_file_reaches_policy_resolved_against_workdir(short_tmp):
    policy = TablePolicy()
    async with _server(policy, short_tmp).start_session(labels={"agent": "a1"}) as s:
        resp = await request(s.client_fd, "./bin/../tool", ["./tool", "-x"], workdir="/home/u/ws")
    assert resp.action == "Run"
    program, argv, workdir, ctx = policy.calls[0]
    assert (program, argv, workdir) == ("/home/u/ws/tool", ["./tool", "-x"], "/home/u/ws")
    assert ctx.labels == {"agent": "a1"} and ctx.session_id == s.session_id


async def test_overlay_and_fallback_socket_permissions(short_tmp):
    async with _server(TablePolicy(), short_tmp, extra_env={"EXECGATE_X": "1"}).start_session() as s:
        env = s.env_overlay
        assert env[p.ESCALATE_SOCKET_ENV_VAR] == str(s.client_fd)
        assert os.get_inheritable(s.client_fd)
        assert env[p.EXEC_WRAPPER_ENV_VAR] == "/bin/false" and env["EXECGATE_X"] == "1"
        path = env[p.SOCKET_PATH_ENV_VAR]
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_ISSOCK(os.stat(path).st_mode)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.setblocking(False)
        with sock:
            assert (await ask(sock, "/bin/true", ["true"])).action == "Run"
    assert not os.path.exists(path)


async def test_escalated_command_gets_exactly_the_prepared_env(short_tmp, monkeypatch):
    monkeypatch.setenv("EG_SERVER_ONLY", "leak")
    policy = TablePolicy({"sh": ESCALATE})
    async with _server(policy, short_tmp).start_session() as s:
        sock = await handshake(s.client_fd)
        with sock:
            resp = await ask(sock, "/bin/sh", ["sh", "-c", 'test "$KEY" = VALUE && exit 42'], env={"KEY": "VALUE"})
            assert resp.action == "Escalate" and resp.extensions == {p.SIGNALS_EXTENSION_FIELD: True}
            await _escalate_with_devnull(sock)
            assert await _exit_code(sock) == 42
        sock = await handshake(s.client_fd)
        with sock:  # nothing of the server's own env leaks in
            await ask(sock, "/bin/sh", ["sh", "-c", 'test -z "$HOME$EG_SERVER_ONLY" && exit 7'], env={"A": "1"})
            await _escalate_with_devnull(sock)
            assert await _exit_code(sock) == 7


async def test_an_escalated_command_starts_only_in_the_callers_own_directory(short_tmp, monkeypatch):
    """The request's workdir is the caller's word: an escalation whose workdir names another
    directory than the caller's (SO_PEERCRED pid's /proc/PID/cwd), or the caller's through a
    symlink (the approver would be told another directory), is refused, saying why; one naming
    it by its real path starts there — by the directory, not the path: the directory moved away
    and another made in its place once the check passed changes nothing."""
    here, there = short_tmp / "here", short_tmp / "there"
    here.mkdir()
    there.mkdir()
    (short_tmp / "link").symlink_to(here)
    monkeypatch.chdir(here)  # this process is the caller
    policy = TablePolicy({"sh": ESCALATE})
    async with _server(policy, short_tmp).start_session() as s:
        resp = await request(s.client_fd, "/bin/sh", ["sh", "-c", "pwd > pwd.txt"], workdir=str(there))
        assert resp.action == "Deny" and "is another directory than the one the caller is in" in resp.reason, resp
        resp = await request(s.client_fd, "/bin/sh", ["sh", "-c", "true"], workdir=str(short_tmp / "gone"))
        assert resp.action == "Deny" and "does not exist where escalated commands start" in resp.reason, resp
        resp = await request(s.client_fd, "/bin/sh", ["sh", "-c", "true"], workdir=str(short_tmp / "link"))
        assert resp.action == "Deny" and "through a symlink; its real path is" in resp.reason, resp
        sock = await handshake(s.client_fd)
        with sock:
            resp = await ask(sock, "/bin/sh", ["sh", "-c", "pwd -P > pwd.txt"], workdir=str(here))
            assert resp.action == "Escalate", resp
            here.rename(short_tmp / "moved")  # after the check, before the spawn
            here.mkdir()
            await _escalate_with_devnull(sock)
            assert await _exit_code(sock) == 0
    assert (short_tmp / "moved" / "pwd.txt").read_text().strip() == str((short_tmp / "moved").resolve())
    assert not (here / "pwd.txt").exists()


async def test_closing_the_session_kills_escalated_sleep(short_tmp):
    policy = TablePolicy({"sleep": ESCALATE})
    server = _server(policy, short_tmp, limits=Limits(kill_grace_s=2.0))
    s = server.start_session()
    sock = await handshake(s.client_fd)
    with sock:
        await ask(sock, "/bin/sleep", ["sleep", "100"])
        await _escalate_with_devnull(sock)
        assert await wait_until(lambda: len(s.children) == 1)
        (child,) = s.children
        assert pid_alive(child.pid)
        async with asyncio.timeout(5):
            await s.close()
            assert await _exit_code(sock) == 128 + 15
    assert not pid_alive(child.pid)


async def test_stream_eof_kills_the_escalated_group(short_tmp):
    policy = TablePolicy({"sleep": ESCALATE})
    async with _server(policy, short_tmp).start_session() as s:
        sock = await handshake(s.client_fd)
        await ask(sock, "/bin/sleep", ["sleep", "100"])
        await _escalate_with_devnull(sock)
        assert await wait_until(lambda: len(s.children) == 1)
        (child,) = s.children
        sock.close()
        assert await wait_until(lambda: not pid_alive(child.pid), 5.0)


async def _junk_datagrams(client_fd: int, count: int) -> None:
    dgram = socket.socket(fileno=os.dup(client_fd))
    dgram.setblocking(False)
    r, w = os.pipe()
    kinds = [[], [r, w], [r], [w, w, w]]  # no fd, two fds, a non-socket, three fds
    loop = asyncio.get_running_loop()
    try:
        for i in range(count):
            anc = kinds[i % len(kinds)]
            msg = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", anc).tobytes())] if anc else []
            while True:
                try:
                    dgram.sendmsg([b"junk"], msg)
                    break
                except BlockingIOError:
                    fut = loop.create_future()
                    loop.add_writer(dgram.fileno(), lambda: fut.done() or fut.set_result(None))
                    try:
                        await fut
                    finally:
                        loop.remove_writer(dgram.fileno())
    finally:
        dgram.close()
        os.close(r)
        os.close(w)


async def _bad_streams(client_fd: int) -> None:
    bad = [
        (0xFFFFFFF0).to_bytes(4, "little"),  # huge length
        encode_frame(b"{not json"),
        encode_frame(b'{"file": 3, "argv": "x"}'),  # wrong shape
        encode_frame(b"[1, 2]"),
        encode_frame(b'{"file":"/bin/true","argv":["true"],"workdir":"/","env":{}}')[:20],  # truncated
        encode_frame(b'{"file":"/bin/true","argv":["true"],"workdir":"relative","env":{}}'),
    ]
    for data in bad:
        sock = await handshake(client_fd)
        with sock:
            await asyncio.get_running_loop().sock_sendall(sock, data)
            sock.shutdown(socket.SHUT_WR)
            with pytest.raises(p.ProtocolError):  # closed without an answer
                async with asyncio.timeout(10):
                    await recv_frame(sock)


async def test_bad_input_leaves_server_serving_and_fds_at_baseline(short_tmp):
    policy = TablePolicy()
    async with _server(policy, short_tmp).start_session() as s:
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
        baseline = open_fd_count()
        await _bad_streams(s.client_fd)
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
        await handshake(s.client_fd, fds=[])
        a, b = socket.socketpair()
        with a, b:
            await handshake(s.client_fd, fds=[a.fileno(), b.fileno()])
        await _junk_datagrams(s.client_fd, 10_000)
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
        assert await wait_until(lambda: open_fd_count() == baseline), (open_fd_count(), baseline)
    assert len(policy.calls) == 3


async def test_request_deadline_and_queueing_past_the_concurrency_limit(short_tmp):
    limits = Limits(request_timeout_s=0.5, max_concurrent=1)
    async with _server(TablePolicy(), short_tmp, limits=limits).start_session() as s:
        idle = await handshake(s.client_fd)  # holds the only slot, sends nothing
        with idle:
            # Queued behind the idle one, not refused: answered once the deadline frees the slot.
            resp = await request(s.client_fd, "/bin/true", ["true"])
            assert resp.action == "Run"
            with pytest.raises(p.ProtocolError):
                async with asyncio.timeout(5):  # closed by the server after its 0.5 s deadline
                    await recv_frame(idle)
        assert await wait_until(lambda: len(s._conns) == 0)
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"


async def test_hard_cap_on_connections_is_a_deny_saying_so(short_tmp):
    limits = Limits(request_timeout_s=30, max_concurrent=1, max_connections=2)
    policy = TablePolicy()
    async with _server(policy, short_tmp, limits=limits).start_session() as s:
        idle = await handshake(s.client_fd)  # deciding (holds the slot)
        queued = await handshake(s.client_fd)  # waiting for the slot
        with idle, queued:
            assert await wait_until(lambda: len(s._conns) == 2)
            resp = await request(s.client_fd, "/bin/true", ["true"])
            assert resp.action == "Deny" and "hard cap 2" in (resp.reason or "")
        assert await wait_until(lambda: len(s._conns) == 0)
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
    assert len(policy.calls) == 1


async def test_running_escalated_commands_hold_no_decision_slot(short_tmp):
    """Two escalated commands run at once with one slot; a third exec is decided meanwhile."""
    limits = Limits(max_concurrent=1)
    policy = TablePolicy({"sh": ESCALATE})
    gate = short_tmp / "gate"
    os.mkfifo(gate)
    async with _server(policy, short_tmp, limits=limits).start_session() as s:
        socks = []
        for _ in range(2):  # each blocks reading the fifo until the test writes to it
            sock = await handshake(s.client_fd)
            socks.append(sock)
            assert (await ask(sock, "/bin/sh", ["sh", "-c", f"read x < {gate}; exit 7"])).action == "Escalate"
            await _escalate_with_devnull(sock)
        assert await wait_until(lambda: len(s.children) == 2)
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
        with open(gate, "w") as fifo:  # both readers get EOF (or the line) and exit
            fifo.write("go\n")
        for sock in socks:
            with sock:
                assert await _exit_code(sock) == 7


async def test_policy_failure_is_a_deny_naming_the_cause(short_tmp):
    class Broken(TablePolicy):
        async def determine_action(self, *a):
            raise RuntimeError("service down")

    async with _server(Broken(), short_tmp).start_session() as s:
        resp = await request(s.client_fd, "/bin/true", ["true"])
    assert resp.action == "Deny" and "service down" in (resp.reason or "")


async def test_deny_carries_the_reason(short_tmp):
    policy = TablePolicy({"rm": Decision.deny("no rm"), "cp": Decision.deny(None)})
    async with _server(policy, short_tmp).start_session() as s:
        assert (await request(s.client_fd, "/bin/rm", ["rm"])).reason == "no rm"
        resp = await request(s.client_fd, "/bin/cp", ["cp"])
    assert resp.action == "Deny" and resp.reason is None


async def test_many_sessions_in_one_loop(short_tmp):
    policy = TablePolicy({"sh": ESCALATE})
    server = _server(policy, short_tmp)

    async def one(i: int) -> int:
        async with server.start_session(session_id=f"s{i}") as s:
            sock = await handshake(s.client_fd)
            with sock:
                await ask(sock, "/bin/sh", ["sh", "-c", f"exit {i}"])
                await _escalate_with_devnull(sock)
                return await _exit_code(sock)

    assert await asyncio.gather(*(one(i) for i in range(8))) == list(range(8))
    assert {c[3].session_id for c in policy.calls} == {f"s{i}" for i in range(8)}


SPAWN_ON_LOW_FDS = textwrap.dedent(
    """
    import os, sys
    from execgate.server.spawn import spawn
    out_path = sys.argv[1]
    for fd in (0, 1, 2):
        os.close(fd)
    r, w = os.pipe()                      # r == 0, w == 1: the source of stdin is fd 0
    out = os.open(out_path, os.O_WRONLY)  # == 2
    assert (r, w, out) == (0, 1, 2), (r, w, out)
    os.write(w, b"in\\n")
    os.close(w)
    # stdin from fd 0, stdout and stderr onto fd 2
    child = spawn(["/bin/sh", "-c", "cat; echo err >&2; kill -TERM $$"], env={}, cwd="/",
                  stdio={0: r, 1: out, 2: out})
    os.close(r)
    os.close(out)
    child.popen.wait()
    os._exit(child.exit_status)
    """
)


def test_spawn_maps_sources_numbered_0_to_2_and_reports_128_plus_signal(short_tmp):
    out = short_tmp / "out"
    out.write_bytes(b"")
    proc = subprocess.run([sys.executable, "-c", SPAWN_ON_LOW_FDS, str(out)], timeout=60)
    assert proc.returncode == 143
    assert out.read_bytes() == b"in\nerr\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
async def test_fallback_socket_refuses_other_uids(short_tmp):
    async with _server(TablePolicy(), short_tmp).start_session() as s:
        for d in (short_tmp, s.socket_dir):  # let the other uid reach the socket: the uid check must stop it
            os.chmod(d, 0o755)
        os.chmod(s.socket_path, 0o777)
        code = textwrap.dedent(
            f"""
            import os, socket
            os.setgid(65534); os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect({s.socket_path!r})
            sock.settimeout(10)
            try:
                sock.sendall({encode_frame(p.EscalateRequest("/bin/true", ["true"], "/", {}).to_json())!r})
                print(repr(sock.recv(100)))  # a served peer would read the Run frame here
            except (BrokenPipeError, ConnectionResetError):
                print(repr(b""))
            """
        )
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=subprocess.PIPE)
        async with asyncio.timeout(20):
            out, _ = await proc.communicate()
        assert (proc.returncode, out) == (0, b"b''\n")  # connected, then closed without a word
        assert (await request(s.client_fd, "/bin/true", ["true"])).action == "Run"
