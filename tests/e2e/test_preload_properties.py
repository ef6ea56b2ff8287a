"""Properties of the preload shim beyond "each launcher is gated": libc-identical PATH search and
errno, the vfork path under load, two execs per gated exec, static binaries, lost sockets,
cleared environments, the depth guard and escalation through the native wrapper."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from preload_support import (
    ALLOWED, ALLOWED_OUTPUT, DENIED, DENIED_OUTPUT, DENY_REASON, ESCALATED, Gate, write_script,
)
from execgate.wrapper.artifacts import native_wrapper_path, preload_library_path

pytestmark = pytest.mark.e2e

PY = sys.executable
DATA = Path(__file__).parent / "data"

# (PATH value or -unset, function, file) — each run once with and once without the shim.
PROBES = [
    ("d_none", "execvp", "foo"),
    ("d_noexec:d_none", "execvp", "foo"),
    ("d_noexec:d_exec", "execvp", "foo"),
    ("plainfile:d_exec", "execvp", "foo"),
    ("", "execvp", "foo"),
    (":d_none", "execvp", "foo"),
    ("d_none:", "execlp", "foo"),
    ("-unset", "execvp", "foo"),
    ("-unset", "execvp", "echo"),
    ("-unset", "posix_spawnp", "echo"),
    ("d_none", "execvp", "./noshebang"),
    ("d_none:.", "execvpe", "noshebang"),
    ("d_none", "execve", "./noshebang"),
    ("d_none", "posix_spawn", "./noshebang"),
    ("d_none:.", "posix_spawnp", "noshebang"),
    ("d_noexec", "posix_spawnp", "foo"),
    ("d_none", "posix_spawnp", "foo"),
    ("d_noexec:d_exec", "posix_spawnp", "foo"),
    ("d_none", "posix_spawn", "missing"),
    ("d_none", "execve", "adir"),
    ("d_none", "execve", "d_noexec/foo"),
    ("d_none", "execve", "./badinterp"),
    ("d_none", "execv", ""),
    ("d_none", "execvp", ""),
    ("d_none", "execvp", "d_exec"),
    ("d_none", "execvpe", "missing/x"),
    ("d_none", "execl", "d_exec/foo"),
    ("d_none", "execle", "d_exec/foo"),
    ("d_none", "fexecve", "/bin/echo"),
    ("d_none", "execveat", "d_exec/foo"),
]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("probe") / "probe"
    subprocess.run(["cc", "-O1", "-o", str(out), str(DATA / "probe.c")], check=True)
    return out


def _layout(root: Path) -> None:
    for d in ("d_exec", "d_noexec", "d_none", "adir"):
        (root / d).mkdir()
    write_script(root / "d_exec" / "foo", '#!/bin/sh\necho ran d_exec/foo "$@"\n')
    write_script(root / "d_noexec" / "foo", '#!/bin/sh\necho ran d_noexec/foo\n', 0o644)
    write_script(root / "foo", '#!/bin/sh\necho ran ./foo "$@"\n')
    write_script(root / "noshebang", 'echo ran noshebang "$@"\n')
    write_script(root / "badinterp", "#!/nonexistent/interp\necho never\n")
    (root / "plainfile").write_text("")


def test_path_search_and_errno_match_glibc(gate: Gate, probe: Path) -> None:
    _layout(gate.workdir)
    script = "".join(
        f"{probe} {shlex.quote(path)} {fn} {shlex.quote(file)} a1; echo rc=$?\n" for path, fn, file in PROBES
    )
    plain = subprocess.run(
        ["sh", "-c", script], cwd=gate.workdir, capture_output=True, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("LD_")}, timeout=60,
    )
    gated = gate.run("sh", script)
    assert gated.stdout == plain.stdout
    assert "ENOEXEC" in plain.stdout and "EACCES" in plain.stdout and "ran ./foo" in plain.stdout
    assert len(re.findall(r"^rc=", gated.stdout, re.M)) == len(PROBES)
    programs = gate.policy.programs()
    assert str(gate.workdir / "d_exec" / "foo") in programs
    assert str(gate.workdir / "foo") in programs
    assert "/bin/echo" in programs
    # execvp's ENOEXEC fallback is decided as the exec of /bin/sh FILE.
    assert ["/bin/sh", "./noshebang", "a1"] in [argv for _, argv in gate.policy.calls]


def test_500_sequential_subprocess_runs_all_gated(gate: Gate) -> None:
    script = (
        f"{PY} -c 'import subprocess\nfor i in range(500):\n    subprocess.run([\"/bin/true\"], check=True)\n"
        "print(\"parent-intact\", i + 1)'"
    )
    res = gate.run("sh", script, timeout=120)
    assert res.exit_code == 0, res.stderr
    assert "parent-intact 500" in res.stdout
    assert gate.policy.programs().count("/bin/true") == 500


def test_two_execs_per_gated_exec_under_strace(gate: Gate) -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    trace = gate.workdir / "trace"
    res = gate.run("sh", f"strace -f -qq -s 4096 -e trace=execve,execveat -o {trace} /bin/sh -c '/bin/echo hi; /bin/true'")
    assert res.exit_code == 0, res.stderr
    # The wrapper runs the very file it opened and the server judged: execveat(fd, "", argv, …,
    # AT_EMPTY_PATH) — named here by its argv[0].
    done = [path or arg0 for path, arg0 in re.findall(
        r'^\d+\s+(?:execve\("([^"]+)"|execveat\(\d+, "", \["([^"]*)").*= 0$', trace.read_text(), re.M)]
    wrapper = str(native_wrapper_path())
    assert done == [wrapper, "/bin/sh", wrapper, "/bin/echo", wrapper, "/bin/true"], trace.read_text()


def _static_binary(directory: Path, name: str, source: str) -> Path:
    src = directory / f"{name}.c"
    src.write_text(source)
    out = directory / name
    if subprocess.run(["cc", "-static", "-O1", "-o", str(out), str(src)], capture_output=True).returncode != 0:
        pytest.skip("no static libc to link a static test binary")
    assert "not a dynamic executable" in subprocess.run(["ldd", str(out)], capture_output=True, text=True).stdout + \
        subprocess.run(["ldd", str(out)], capture_output=True, text=True).stderr
    return out


@pytest.mark.parametrize("seccomp", [True, False], ids=["backstop", "shim-only"])
def test_exec_of_static_binary_is_decided(gate: Gate, seccomp: bool) -> None:
    gate.seccomp = seccomp
    prog = (
        '#include <stdio.h>\n#include <unistd.h>\nint main(int c, char **v) {\n'
        '  printf("static-ran\\n"); fflush(stdout);\n'
        '  if (c > 1) execl("/bin/echo", "echo", "static-child", (char *)0);\n  return 0; }\n'
    )
    static = _static_binary(gate.bindir, "eg-static", prog)
    shutil.copy(static, gate.bindir / DENIED)
    res = gate.run("bash", f'eg-static; {DENIED}; echo "denied-status=$?"; eg-static child')
    assert res.stdout.count("static-ran") == 2 and "denied-status=1" in res.stdout
    assert f"Execution denied: {DENY_REASON}" in res.stderr
    assert gate.policy.programs().count(str(static)) == 2
    assert "static-child" in res.stdout
    # What a static binary execs: the shim cannot see it (README); the seccomp backstop decides it, once.
    assert gate.policy.programs().count("/bin/echo") == (1 if seccomp else 0)


def test_cleared_environment_stays_gated(gate: Gate) -> None:
    script = (
        f"unset LD_PRELOAD EXEC_WRAPPER CODEX_ESCALATE_SOCKET EXECGATE_SOCKET_PATH; {DENIED}; echo \"denied-status=$?\"; "
        f"{PY} -c 'import os, shutil; os.execve(shutil.which(\"{ALLOWED}\"), [\"a\", \"x\"], {{}})'"
    )
    res = gate.run("bash", script)
    assert DENIED_OUTPUT not in res.stdout and "denied-status=1" in res.stdout
    assert f"{ALLOWED_OUTPUT} x" in res.stdout
    assert str(gate.bindir / ALLOWED) in gate.policy.programs()


def test_reused_socket_fd_is_not_mistaken_for_the_session(gate: Gate) -> None:
    # The program replaces the inherited fd by its own datagram socket (as syslog would): the
    # wrapper must see the inode changed and use the fallback path instead of handshaking into it.
    script = (
        f"{PY} -c 'import os, shutil, socket, subprocess\n"
        "fd = int(os.environ[\"CODEX_ESCALATE_SOCKET\"])\n"
        "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "os.dup2(a.fileno(), fd)\n"
        f"subprocess.run([shutil.which(\"{ALLOWED}\"), \"x\"], close_fds=False, timeout=20)'"
    )
    res = gate.run("sh", script)
    assert f"{ALLOWED_OUTPUT} x" in res.stdout, res.stderr


def test_unreachable_server_fails_closed(gate: Gate) -> None:
    # The child of a close_fds subprocess has no inherited socket, and the session's fallback
    # socket is moved away (the path itself cannot be changed: the shim forces it, see below).
    script = (
        'mv "$EXECGATE_SOCKET_PATH" "$EXECGATE_SOCKET_PATH.away"; '
        f"{PY} -c 'import shutil, subprocess\n"
        f"r = subprocess.run([shutil.which(\"{ALLOWED}\"), \"x\"])\nprint(\"child-status=%d\" % r.returncode)'; "
        'mv "$EXECGATE_SOCKET_PATH.away" "$EXECGATE_SOCKET_PATH"'
    )
    res = gate.run("sh", script)
    assert ALLOWED_OUTPUT not in res.stdout
    assert "child-status=126" in res.stdout
    assert "execgate-wrapper: cannot reach the escalation server" in res.stderr
    assert str(gate.bindir / ALLOWED) not in gate.policy.programs()


def test_changed_socket_path_is_replaced_by_the_sessions(gate: Gate) -> None:
    # A caller's EXECGATE_SOCKET_PATH never reaches the wrapper (was: an odd value failed closed):
    # the shim forces the value it captured, so the close_fds child is still gated by the session.
    script = (
        f"EXECGATE_SOCKET_PATH=/nonexistent/s {PY} -c 'import os, shutil, subprocess\n"
        "print(\"python-sees=%s\" % os.environ[\"EXECGATE_SOCKET_PATH\"], flush=True)\n"
        f"r = subprocess.run([shutil.which(\"{ALLOWED}\"), \"x\"], env={{**os.environ, \"EXECGATE_SOCKET_PATH\": \"/x\"}})\n"
        "print(\"child-status=%d\" % r.returncode)'"
    )
    res = gate.run("sh", script)
    assert "python-sees=/nonexistent/s" not in res.stdout and "python-sees=/" in res.stdout
    assert f"{ALLOWED_OUTPUT} x" in res.stdout and "child-status=0" in res.stdout, res.stderr
    assert str(gate.bindir / ALLOWED) in gate.policy.programs()


def test_depth_guard_turns_a_loop_into_a_denial(gate: Gate) -> None:
    nest = "sh -c 'sh -c \"sh -c true; echo inner-status=\\$?\"'"
    res = gate.run("sh", nest, env={"EXECGATE_MAX_DEPTH": "2"})
    assert "exec depth limit reached" in res.stderr
    assert "inner-status=126" in res.stdout


def test_escalated_marker_runs_through_the_server(gate: Gate) -> None:
    res = gate.run("bash", f'{ESCALATED} a b; echo "escalated-status=$?"')
    assert "escalated-marker-ran a b" in res.stdout
    assert "escalated-status=7" in res.stdout


@pytest.mark.parametrize("seccomp", [True, False], ids=["backstop", "shim-only"])
def test_system_shell_is_not_seen_but_its_execs_are(gate: Gate, seccomp: bool) -> None:
    # Documented limit of the shim: glibc's system() spawns /bin/sh through libc-internal calls;
    # the seccomp backstop decides that exec (once).
    gate.seccomp = seccomp
    script = f"{PY} -c 'import os; os.system(\"{DENIED}; echo denied-status=$?; {ALLOWED} x\")'"
    res = gate.run("sh", script)
    assert "denied-status=1" in res.stdout and f"{ALLOWED_OUTPUT} x" in res.stdout
    assert f"Execution denied: {DENY_REASON}" in res.stderr
    assert len([argv for _, argv in gate.policy.calls if argv[:2] == ["sh", "-c"]]) == (1 if seccomp else 0)


def test_gated_inside_bubblewrap(gate: Gate) -> None:
    from execgate.server.policy import Permissions
    from execgate.server.sandbox import bwrap_argv, bwrap_usable

    if (why := bwrap_usable()) is not None:
        pytest.skip(why)
    # The shim and the wrapper must stay visible inside (they may live under the private /tmp).
    shown = (str(gate.bindir), str(native_wrapper_path().parent), str(preload_library_path().parent))
    perms = Permissions(writable_roots=(str(gate.workdir),), readable_roots=shown)

    def launcher(argv: list[str], workdir: str, socket_dir: str) -> list[str]:
        return bwrap_argv(perms, cwd=workdir, extra_binds=(socket_dir,)) + argv

    gate.launcher = launcher
    py = os.path.realpath(sys.executable)  # a venv under /tmp is hidden by the private /tmp
    res = gate.run(
        "bash",
        f'{DENIED}; echo "denied-status=$?"; {ALLOWED} x; {py} -c "import subprocess; subprocess.run([\'{ALLOWED}\', \'y\'])"',
    )
    assert "denied-status=1" in res.stdout and f"{ALLOWED_OUTPUT} x" in res.stdout, res.stderr
    assert f"{ALLOWED_OUTPUT} y" in res.stdout  # close_fds child: the fallback socket is bound in
    assert f"Execution denied: {DENY_REASON}" in res.stderr
    assert str(gate.bindir / ALLOWED) in gate.policy.programs()


def test_posix_spawn_file_actions_closing_the_socket(gate: Gate) -> None:
    # The spawned wrapper gets the caller's file actions and attributes: here the inherited socket
    # is closed and the child starts a new session; the wrapper then uses the fallback path.
    script = (
        f"{PY} -c 'import os, shutil\n"
        "fd = int(os.environ[\"CODEX_ESCALATE_SOCKET\"])\n"
        f"pid = os.posix_spawn(shutil.which(\"{ALLOWED}\"), [\"m\", \"x\"], os.environ,"
        " file_actions=[(os.POSIX_SPAWN_CLOSE, fd)], setsid=True)\n"
        "print(\"spawn-status=%d\" % os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))'"
    )
    res = gate.run("sh", script)
    assert f"{ALLOWED_OUTPUT} x" in res.stdout and "spawn-status=0" in res.stdout, res.stderr


def test_each_wrapper_under_preload_decides_once(gate: Gate, wrapper_path: str) -> None:
    # The wrapper's own final exec is not intercepted again, whichever wrapper it is.
    gate.wrapper = wrapper_path
    res = gate.run("bash", f'{DENIED}; echo "denied-status=$?"; {ALLOWED} x')
    assert "denied-status=1" in res.stdout and f"{ALLOWED_OUTPUT} x" in res.stdout, res.stderr
    assert gate.policy.programs().count(str(gate.bindir / ALLOWED)) == 1
    assert len(gate.policy.calls) == 2


def test_non_utf8_arguments_reach_the_policy_and_the_program(gate: Gate) -> None:
    res = gate.run("bash", f"{ALLOWED} $'caf\\xe9' | od -An -c")
    assert "c   a   f 351" in res.stdout, (res.stdout, res.stderr)
    assert [ALLOWED, "caf\udce9"] in [argv for _, argv in gate.policy.calls]
