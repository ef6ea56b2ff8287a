"""Both execve wrappers (the Python reference client and the native one: the ``wrapper_path``
fixture) as real subprocesses against a real session (Run/Escalate/Deny, exit statuses, signals,
fallback socket path, failure modes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from core_support import ESCALATE, TablePolicy, group_commands, pid_alive, read_pid_file, wait_until
from execgate.server import protocol as p
from execgate.server.escalate_server import EscalateServer
from execgate.server.policy import Decision

pytestmark = pytest.mark.anyio


async def _start_wrapper(session, args, *, env_overlay=None, stdin=None, cwd=None):
    env = {**os.environ, **(session.env_overlay if env_overlay is None else env_overlay)}
    return await asyncio.create_subprocess_exec(
        session.env_overlay[p.EXEC_WRAPPER_ENV_VAR], *args,
        env=env, stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=(session.client_fd,) if session.client_fd >= 0 else (), cwd=cwd,
    )  # fmt: skip


async def _run_wrapper(session, args, *, input=None, **kw):
    proc = await _start_wrapper(session, args, stdin=subprocess.PIPE if input is not None else None, **kw)
    async with asyncio.timeout(60):
        out, err = await proc.communicate(input)
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def server_for(short_tmp, wrapper_path):
    def make(policy):
        return EscalateServer("/bin/sh", wrapper_path, policy, socket_dir=str(short_tmp))

    return make


async def test_run_execs_in_place_and_keeps_the_socket_for_children(server_for):
    policy = TablePolicy()
    async with server_for(policy).start_session() as s:
        nested = '"$EXEC_WRAPPER" /bin/echo echo nested'
        rc, out, err = await _run_wrapper(s, ["/bin/sh", "sh", "-c", f"echo top; {nested}"])
    assert (rc, out, err) == (0, "top\nnested\n", "")
    assert policy.programs == ["/bin/sh", "/bin/echo"]


async def test_relative_file_is_resolved_against_the_callers_cwd(server_for, short_tmp):
    tool = short_tmp / "tool"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    policy = TablePolicy()
    async with server_for(policy).start_session() as s:
        rc, out, _ = await _run_wrapper(s, ["./tool", "./tool"], cwd=str(short_tmp))
    assert (rc, out) == (0, "tool ran\n")
    assert policy.calls[0][0] == str(tool) and policy.calls[0][2] == str(short_tmp)


async def test_escalate_forwards_stdin_and_returns_output(server_for):
    policy = TablePolicy({"cat": ESCALATE, "sh": ESCALATE})
    async with server_for(policy).start_session() as s:
        assert await _run_wrapper(s, ["/bin/cat", "cat"], input=b"in\n") == (0, "in\n", "")
        rc, out, err = await _run_wrapper(s, ["/bin/sh", "sh", "-c", "echo out; echo err >&2; exit 5"])
    assert (rc, out, err) == (5, "out\n", "err\n")


@pytest.mark.parametrize(
    ("script", "status"),
    [("kill -TERM $$", 143), ("kill -KILL $$", 137), ("exit 300", 44)],
)
async def test_exit_statuses_through_the_wrapper(server_for, script, status):
    async with server_for(TablePolicy({"sh": ESCALATE})).start_session() as s:
        rc, _, err = await _run_wrapper(s, ["/bin/sh", "sh", "-c", script])
    assert rc == status, err


async def test_deny_prints_the_reason_and_exits_1(server_for, short_tmp):
    marker = short_tmp / "ran"
    policy = TablePolicy({"touch": Decision.deny("not today"), "sh": Decision.deny(None)})
    async with server_for(policy).start_session() as s:
        denied = await _run_wrapper(s, ["/usr/bin/touch", "touch", str(marker)])
        assert denied == (1, "", "Execution denied: not today\n")
        assert await _run_wrapper(s, ["/bin/sh", "sh", "-c", "true"]) == (1, "", "Execution denied\n")
    assert not marker.exists()


@pytest.mark.parametrize("name", ["INT", "TERM", "HUP", "QUIT"])
async def test_signal_to_the_wrapper_reaches_the_escalated_child(server_for, name):
    async with server_for(TablePolicy({"sh": ESCALATE})).start_session() as s:
        proc = await _start_wrapper(s, ["/bin/sh", "sh", "-c", f'trap "exit 42" {name}; sleep 100'])
        assert await wait_until(lambda: len(s.children) == 1, 20)
        (child,) = s.children
        # Signal only once `sleep` runs: an INT that reached the group before the fork would leave
        # a fresh sleep behind, holding our stdout pipe open (plain shell semantics).
        assert await wait_until(lambda: "sleep" in group_commands(child.pgid), 20)
        proc.send_signal(getattr(signal, f"SIG{name}"))
        async with asyncio.timeout(20):
            await proc.communicate()
    assert proc.returncode == 42


async def test_sigkill_on_the_wrapper_kills_the_escalated_sleep(server_for, short_tmp):
    pid_file = short_tmp / "pid"
    async with server_for(TablePolicy({"sh": ESCALATE})).start_session() as s:
        proc = await _start_wrapper(s, ["/bin/sh", "sh", "-c", f"echo $$ > {pid_file}; exec sleep 100"])
        pid = await read_pid_file(pid_file)
        assert pid_alive(pid)
        proc.kill()
        await proc.communicate()
        assert await wait_until(lambda: not pid_alive(pid), 5.0)


async def test_fallback_socket_path_when_the_fd_is_gone(server_for):
    policy = TablePolicy({"sh": ESCALATE})
    async with server_for(policy).start_session() as s:
        overlay = {**s.env_overlay, p.ESCALATE_SOCKET_ENV_VAR: "987"}  # not open in the wrapper
        rc, out, _ = await _run_wrapper(s, ["/bin/sh", "sh", "-c", "echo via path; exit 3"], env_overlay=overlay)
        assert (rc, out) == (3, "via path\n")
        # A CPython child with close_fds=True loses the inherited fd but is still gated.
        code = 'import os, subprocess; subprocess.run([os.environ["EXEC_WRAPPER"], "/bin/echo", "echo", "grandchild"])'
        rc, out, err = await _run_wrapper(s, [sys.executable, "python", "-c", code])
    assert (rc, out) == (0, "grandchild\n"), err
    assert policy.programs[-1] == "/bin/echo"


async def test_no_server_fails_closed_with_one_line(server_for, short_tmp):
    marker = short_tmp / "ran"
    async with server_for(TablePolicy()).start_session() as s:
        overlay = {p.ESCALATE_SOCKET_ENV_VAR: "987"}
        rc, out, err = await _run_wrapper(s, ["/usr/bin/touch", "touch", str(marker)], env_overlay=overlay)
    assert rc == 126 and out == "" and not marker.exists()
    assert err.startswith("execgate-wrapper: cannot reach the escalation server") and err.count("\n") == 1


async def test_run_of_a_missing_file_exits_127(server_for):
    async with server_for(TablePolicy()).start_session() as s:
        rc, _, err = await _run_wrapper(s, ["/nonexistent/tool", "tool"])
    assert rc == 127 and err.startswith("execgate-wrapper: cannot execute /nonexistent/tool")


def test_usage_error_and_light_imports():
    proc = subprocess.run([sys.executable, "-m", "execgate.wrapper"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("execgate-wrapper: usage")
    code = "import sys, execgate.wrapper.client; print(sorted({'asyncio', 'subprocess', 'uvloop'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "[]"


async def test_run_restores_default_signal_dispositions(server_for):
    async with server_for(TablePolicy()).start_session() as s:
        rc, out, _ = await _run_wrapper(s, ["/bin/grep", "grep", "SigIgn", "/proc/self/status"])
    assert (rc, out.split()) == (0, ["SigIgn:", "0000000000000000"])
