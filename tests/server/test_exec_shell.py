"""``EscalateServer.exec`` with a real bash, and the hooks (launcher, extra env, env, on_output).

Stock bash does not honour ``EXEC_WRAPPER``; these scripts call ``"$EXEC_WRAPPER" FILE ARGV0 ...``
explicitly to exercise the wrapper-based flow through a real shell. Interception of every exec
of a stock shell arrives with the preload shim (the native branch).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil

import pytest

from core_support import ESCALATE, TablePolicy, pid_alive, wait_until, wrapper_script
from execgate.server import protocol as p
from execgate.server.escalate_server import TIMEOUT_EXIT_CODE, EscalateServer
from execgate.server.policy import Decision, Permissions

pytestmark = pytest.mark.anyio

BASH = shutil.which("bash") or "/bin/bash"


def _server(policy, tmp, **kw) -> EscalateServer:
    return EscalateServer(BASH, wrapper_script(tmp), policy, socket_dir=str(tmp), **kw)


async def test_run_escalate_deny_through_bash(short_tmp):
    policy = TablePolicy({"sh": ESCALATE, "rm": Decision.deny("rm is off limits")})
    script = (
        '"$EXEC_WRAPPER" /bin/echo echo hi; '
        '"$EXEC_WRAPPER" /bin/sh sh -c "echo escalated; echo warn >&2; exit 3"; echo "status=$?"; '
        '"$EXEC_WRAPPER" /bin/rm rm -rf /; echo "deny=$?"'
    )
    result = await _server(policy, short_tmp).exec(script, str(short_tmp), timeout_s=60)
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout == "hi\nescalated\nstatus=3\ndeny=1\n"
    assert result.stderr == "warn\nExecution denied: rm is off limits\n"
    assert sorted(result.output.splitlines()) == sorted((result.stdout + result.stderr).splitlines())
    assert policy.programs == ["/bin/echo", "/bin/sh", "/bin/rm"]
    assert json.loads(result.to_json())["stdout"] == result.stdout


async def test_exit_status_login_flag_and_base_env(short_tmp):
    server = _server(TablePolicy(), short_tmp)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "EG_BASE": "base"}
    result = await server.exec('echo "$EG_BASE $0"; exit 7', str(short_tmp), env=env, login=False)
    assert (result.exit_code, result.stdout) == (7, f"base {BASH}\n")
    killed = await server.exec("kill -TERM $$", str(short_tmp))
    assert killed.exit_code == 143


async def test_timeout_kills_shell_and_escalated_children(short_tmp):
    pid_file = short_tmp / "pid"
    policy = TablePolicy({"sh": ESCALATE})
    script = f'"$EXEC_WRAPPER" /bin/sh sh -c "echo \\$\\$ > {pid_file}; exec sleep 100"'
    async with asyncio.timeout(30):
        result = await _server(policy, short_tmp).exec(script, str(short_tmp), timeout_s=2)
    assert result.timed_out and result.exit_code == TIMEOUT_EXIT_CODE
    pid = int(pid_file.read_text())
    assert await wait_until(lambda: not pid_alive(pid), 5.0)


async def test_on_output_streams_chunks_live(short_tmp):
    seen: list[tuple[str, bytes]] = []
    first_chunk = asyncio.Event()

    def on_output(stream: str, data: bytes) -> None:
        seen.append((stream, data))
        first_chunk.set()

    server = _server(TablePolicy(), short_tmp)
    task = asyncio.ensure_future(server.exec("echo early; sleep 2; echo late >&2", str(short_tmp), on_output=on_output))
    async with asyncio.timeout(20):
        await first_chunk.wait()
        assert seen == [("stdout", b"early\n")] and not task.done()  # streamed before the shell ended
        result = await task
    assert seen[-1] == ("stderr", b"late\n") and result.output == "early\nlate\n"


async def test_launcher_extra_env_and_sandbox_reach_shell_and_policy(short_tmp):
    profile = Permissions(network=False, writable_roots=(str(short_tmp),))

    class EnvLauncher:
        permissions = profile

        def __call__(self, argv, *, session, workdir):
            return ["/usr/bin/env", f"EG_LAUNCHED={session.session_id}", *argv]

    policy = TablePolicy()
    server = _server(policy, short_tmp, launcher=EnvLauncher(), extra_env=lambda s: {"EXECGATE_SHIM": s.socket_path})
    script = 'echo "$EG_LAUNCHED"; test -S "$EXECGATE_SHIM" && echo shim-ok; "$EXEC_WRAPPER" /bin/true true'
    result = await server.exec(script, str(short_tmp), session_id="agent-7", labels={"team": "x"})
    assert result.stdout == "agent-7\nshim-ok\n", result.stderr
    ctx = policy.calls[0][3]
    assert (ctx.session_id, dict(ctx.labels)) == ("agent-7", {"team": "x"})
    # the profile, with the session's socket directory readable (every sandboxed escalation binds it)
    (socket_dir,) = set(ctx.sandbox.readable_roots) - set(profile.readable_roots)
    assert ctx.sandbox == dataclasses.replace(profile, readable_roots=(*profile.readable_roots, socket_dir))
    assert os.path.basename(socket_dir).startswith("execgate-")


async def test_overlay_is_exported_and_client_fd_inherited(short_tmp):
    server = _server(TablePolicy(), short_tmp)
    script = f'echo "${p.ESCALATE_SOCKET_ENV_VAR}"; test -S /proc/self/fd/${p.ESCALATE_SOCKET_ENV_VAR} && echo open'
    result = await server.exec(script, str(short_tmp))
    fd_text, state = result.stdout.split()
    assert fd_text.isdigit() and state == "open"


async def test_concurrent_execs_share_one_loop(short_tmp):
    policy = TablePolicy({"sh": ESCALATE})
    server = _server(policy, short_tmp)
    results = await asyncio.gather(
        *(
            server.exec(f'"$EXEC_WRAPPER" /bin/sh sh -c "exit {i}"; echo $?', str(short_tmp), session_id=f"s{i}")
            for i in range(4)
        )
    )
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert {c[3].session_id for c in policy.calls} == {"s0", "s1", "s2", "s3"}


async def test_pipeline_stdin_reaches_an_escalated_cat(short_tmp):
    policy = TablePolicy({"cat": ESCALATE})
    result = await _server(policy, short_tmp).exec('echo in | "$EXEC_WRAPPER" /bin/cat cat', str(short_tmp))
    assert (result.exit_code, result.stdout) == (0, "in\n")
    assert policy.programs == ["/bin/cat"]


async def test_launch_argv_launcher_gets_the_socket_dir_to_bind(short_tmp):
    calls = []

    class SandboxLike:  # the shape of execgate.server.sandbox.ShellSandbox
        permissions = Permissions(network=True)

        def launch_argv(self, shell_argv, *, cwd, extra_binds):
            calls.append((cwd, list(extra_binds)))
            return ["/usr/bin/env", "EG_SANDBOXED=1", *shell_argv]

    policy = TablePolicy()
    result = await _server(policy, short_tmp, launcher=SandboxLike()).exec(
        'echo "$EG_SANDBOXED"; "$EXEC_WRAPPER" /bin/true true', str(short_tmp)
    )
    assert result.stdout == "1\n"
    ((cwd, binds),) = calls
    assert cwd == str(short_tmp) and len(binds) == 1 and os.path.dirname(binds[0]) == str(short_tmp)
    assert policy.calls[0][3].sandbox == Permissions(network=True, readable_roots=(binds[0],))
