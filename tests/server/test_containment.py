"""Containment in the Python API (issue #9, class 10 (d)) and its parts.

* (d) closing a session kills its escalated descendants — a ``setsid`` daemon forked by an
  escalated command included — and nothing else: neither the host program's own processes nor
  another open session's;
* spawning through ``execgate-contain`` keeps what spawn promised (exact argv[0], env, errors);
* the cgroup v2 directory is found from mountinfo, never hard-coded.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core_support import ESCALATE, TablePolicy
from execgate.server.escalate_server import EscalateServer
from execgate.wrapper.artifacts import native_wrapper_path
from execgate.wrapper.interception import preload_extra_env

pytestmark = pytest.mark.anyio


def _cgroup_or_skip():
    try:
        from execgate.server.containment import ContainmentError, choose
    except ImportError:  # the code before containment: the test must fail on its assertions
        return "auto"
    try:
        return choose("cgroup")
    except ContainmentError as exc:
        pytest.skip(f"no usable cgroup v2 here: {exc}")


def _token() -> str:
    return f"86400.{random.randrange(10**8, 10**9)}"


def _alive(token: str) -> list[int]:
    """Live (non-zombie) processes whose command line holds ``token``, this one excepted."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token in cmdline and state != "Z":
            found.append(int(name))
    return found


def _kill(token: str) -> None:
    for pid in _alive(token):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def spawner(short_tmp: Path) -> Path:
    """``spawner TOKEN PIDFILE``: forks a ``setsid`` daemon (``sleep TOKEN``), waits until it has
    left the spawner's session and written its pid, and exits."""
    path = short_tmp / "spawner"
    path.write_text("#!/bin/sh\n"
                    "setsid sh -c 'echo $$ > \"$1\"; exec sleep \"$2\"' sh \"$2\" \"$1\" </dev/null >/dev/null 2>&1 &\n"
                    "n=0; while [ ! -s \"$2\" ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n + 1)); done\n")
    path.chmod(0o755)
    return path


class _CleanEnvPolicy(TablePolicy):
    """Escalates ``spawner`` with a plain environment (as the rules engine's allowlist would: no
    ``LD_PRELOAD`` of the shim, which refuses to run without the session's ``EXEC_WRAPPER``)."""

    async def prepare_escalated_exec(self, *args, **kw):
        prepared = await super().prepare_escalated_exec(*args, **kw)
        return dataclasses.replace(prepared, env={"PATH": "/usr/bin:/bin"})


def _server(short_tmp: Path, containment) -> EscalateServer:
    return EscalateServer("/bin/sh", str(native_wrapper_path()), _CleanEnvPolicy({"spawner": ESCALATE}),
                          extra_env=preload_extra_env(), socket_dir=str(short_tmp),
                          **({} if isinstance(containment, str) else {"containment": containment}))


async def test_session_close_kills_escalated_daemons_not_the_hosts(short_tmp, spawner):
    containment = _cgroup_or_skip()
    mine, theirs = _token(), _token()
    # The host program's own processes: a child in our group and a setsid daemon of ours.
    host = [subprocess.Popen(["sleep", mine]), subprocess.Popen(["sleep", mine], start_new_session=True)]
    try:
        server = _server(short_tmp, containment)
        result = await server.exec(f"{spawner} {theirs} {short_tmp}/d.pid; echo status=$?", str(short_tmp),
                                   timeout_s=60)
        assert "status=0" in result.stdout and (short_tmp / "d.pid").exists(), result
        assert _alive(theirs) == []  # exec closed the session: its escalated daemon is gone
        assert sorted(_alive(mine)) == sorted(p.pid for p in host)
    finally:
        _kill(theirs)
        for p in host:
            p.kill()
            p.wait()


async def test_closing_one_session_spares_another(short_tmp, spawner):
    containment = _cgroup_or_skip()
    first, second = _token(), _token()
    server = _server(short_tmp, containment)
    try:
        async with server.start_session() as a, server.start_session() as b:
            for session, token in ((a, first), (b, second)):
                env = {"PATH": os.environ["PATH"], **session.env_overlay}
                done = await _shell(session, f"{spawner} {token} {short_tmp}/{token}.pid", env)
                assert done == 0
            assert len(_alive(first)) == len(_alive(second)) == 1
            await a.close()
            assert _alive(first) == [] and len(_alive(second)) == 1
        assert _alive(second) == []
    finally:
        _kill(first)
        _kill(second)


async def _shell(session, script: str, env) -> int:
    """Run ``/bin/sh -c script`` as the session's shell (in its containment) and wait for it."""
    from execgate.server.spawn import spawn

    kw = {"placement": session.placement} if hasattr(session, "placement") else {}
    shell = spawn(["/bin/sh", "-c", script], env=env, cwd="/", pass_fds=[session.client_fd], **kw)
    return await shell.wait()


async def test_cgroup_close_kills_and_removes_nested_cgroups(short_tmp):
    """A nested execgate run (root, no sandbox) makes cgroups inside the session's: killed and
    removed with it."""
    containment = _cgroup_or_skip()
    if isinstance(containment, str):
        pytest.fail("no containment module")
    from execgate.server.spawn import spawn

    token = _token()
    scope = containment.open_scope()
    nested = Path(scope.path) / "execgate-nested" / "s1"
    nested.mkdir(parents=True)
    try:
        child = spawn(["/bin/sleep", token], env={}, cwd="/", placement=dataclasses.replace(
            scope.placement, cgroup_procs=str(nested / "cgroup.procs")))
        assert _alive(token) == [child.pid]
        await scope.close()
        assert await child.wait() == 128 + signal.SIGKILL
        assert not Path(scope.path).exists()
    finally:
        _kill(token)


# ------------------------------------------------------------------ spawn through the helper


async def test_placed_spawn_keeps_argv0_env_and_errors(short_tmp):
    from execgate.server.containment import Placement
    from execgate.server.spawn import spawn
    from execgate.wrapper.artifacts import contain_helper_path

    placement = Placement(str(contain_helper_path()), pdeathsig=True)
    out = short_tmp / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        child = spawn(["/bin/sh", "-c", 'echo "$0 $X"; env | wc -l'], env={"X": "y"}, cwd="/",
                      arg0="named", stdio={1: fd}, placement=placement)
        assert await child.wait() == 0
    finally:
        os.close(fd)
    first, count = out.read_text().splitlines()
    assert first == "named y" and int(count) <= 3  # X, and what sh itself sets (PWD)
    with pytest.raises(FileNotFoundError):
        spawn(["/nonexistent/prog"], env={}, cwd="/", placement=placement)
    with pytest.raises(OSError, match="containment"):
        spawn(["/bin/true"], env={}, cwd="/", placement=Placement(placement.helper, cgroup_procs=str(short_tmp / "no")))


def test_cgroup_dir_from_mountinfo(tmp_path):
    from execgate.server.containment import own_cgroup_dir

    cgroup = tmp_path / "cgroup"
    cgroup.write_text("4:memory:/x\n0::/user.slice/session-3.scope\n")
    hybrid = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
              "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
              "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    pure = "29 23 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    bound = "50 23 0:26 /user.slice /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n"
    none = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
    expect = {hybrid: "/sys/fs/cgroup/unified/user.slice/session-3.scope",
              pure: "/sys/fs/cgroup/user.slice/session-3.scope",
              bound: "/mnt/my cg/session-3.scope", none: None}
    for text, want in expect.items():
        info = tmp_path / "mountinfo"
        info.write_text(text)
        assert own_cgroup_dir(str(info), str(cgroup)) == want, text


async def test_sweep_kills_orphans_and_spares_excluded(short_tmp):
    """The subreaper's sweep, in a child process (it makes the whole process a subreaper)."""
    script = f"""
import asyncio, os, subprocess, sys
from execgate.server.containment import set_child_subreaper, sweep_orphans
set_child_subreaper()
keep = subprocess.Popen(["sleep", "60"])
subprocess.run(["/bin/sh", "-c", "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {short_tmp}/orphan"])
orphan = int(open("{short_tmp}/orphan").read())
killed = asyncio.run(sweep_orphans({{keep.pid}}))
print(orphan in killed, keep.poll() is None, os.path.exists(f"/proc/{{orphan}}"))
keep.kill(); keep.wait()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.split() == ["True", "True", "False"], done.stdout + done.stderr
