"""Attacks on the sandbox boundary (issue #9, classes 1, 2, 6, 7), run for real as root and as an
unprivileged user: ``execgate run --sandbox bwrap`` as a subprocess, real bubblewrap, real shells.

* a fake ``bwrap`` on the caller's PATH never launches an escalated command (absolute launcher);
* root inside the shell's sandbox, or inside an escalated one, has no capability: it cannot
  remount ``/`` read-write, write a root-owned file outside its roots, unmount the private ``/tmp``,
  write a sysctl, or reach the host's service sockets in ``/run``;
  no_new_privs is set; no terminal to push input into (``TIOCSTI``);
* an escalated sandbox never sees the host's ``/proc`` or ``/tmp`` through the caller's working
  directory (its ``/tmp`` is the session's own directory, so a working directory there works);
  ``execgate run`` refuses a system directory as its working directory;
* the fallback socket cannot be replaced by a fake server from inside the sandbox;
* execgate's own package, installed inside the working directory, stays read-only (and in place)
  in the session's sandbox and in an escalated one: it runs outside the sandbox later.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from attack_support import ESCALATE_DASH, rules_file
from execgate.server.sandbox import bwrap_usable, own_package_dirs

pytestmark = pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")

#: Run by root or the user inside a sandbox: capabilities, and the classic ways out.
BREAKOUT = """
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status
mount -o remount,rw / 2>/dev/null; echo "remount=$?"
echo pwned 2>/dev/null >> {target}; echo "write=$?"
umount -l /tmp 2>/dev/null || umount /tmp 2>/dev/null; echo "umount=$?"
cat {secret} 2>/dev/null; echo "host-tmp-read=$?"
v=$(cat /proc/sys/kernel/core_pattern); printf '%s\n' "$v" 2>/dev/null > /proc/sys/kernel/core_pattern; echo "sysctl=$?"
"""








def _run(attacker, script: str, *extra: str, cwd: Path | None = None):
    return attacker.execgate("run", "-q", "--sandbox", "bwrap", *extra, "--", script,
                             cwd=cwd or attacker.workdir())


def _assert_confined(out: str, target: Path, secret: str) -> None:
    assert "CapEff:\t0000000000000000" in out and "CapBnd:\t0000000000000000" in out, out
    assert "NoNewPrivs:\t1" in out, out
    assert "remount=0" not in out and "umount=0" not in out, out
    assert "write=0" not in out and target.read_text() == "original\n"
    assert secret not in out and "host-tmp-read=0" not in out, out
    # Root's uid is the host's uid 0 even in a user namespace: sysctls (core_pattern names a program
    # the kernel runs as host root) must be read-only. The value written is the current one.
    assert "sysctl=" in out and "sysctl=0" not in out, out


# ------------------------------------------------------------------ 1: absolute launcher


def test_fake_bwrap_on_path_never_launches_an_escalation(attacker, outside):
    rules = rules_file(outside, ESCALATE_DASH)
    work = attacker.workdir()
    fake = work / "fake"
    fake.mkdir()
    os.chown(fake, attacker.uid, attacker.gid)
    attacker.marker_program(fake, "bwrap")
    script = f'export PATH="{fake}:$PATH"; dash -c "echo escalated-ok"; echo "status=$?"'
    done = _run(attacker, script, "--rules", str(rules))
    assert not attacker.marker_ran("bwrap"), done.stdout + done.stderr
    # Control: the escalation itself ran, under the real bwrap.
    assert "escalated-ok" in done.stdout and "status=0" in done.stdout, done.stderr


# ------------------------------------------------------------------ 2: bwrap confines root too


def test_shell_sandbox_has_no_capabilities_and_no_way_out(attacker, outside, host_tmp_file):
    target = outside / "root-owned"
    target.write_text("original\n")
    target.chmod(0o644)
    path, token = host_tmp_file
    done = _run(attacker, BREAKOUT.format(target=target, secret=path))
    _assert_confined(done.stdout, target, token)


def test_escalated_sandbox_has_no_capabilities_and_no_way_out(attacker, outside, host_tmp_file):
    rules = rules_file(outside, ESCALATE_DASH)
    target = outside / "root-owned"
    target.write_text("original\n")
    target.chmod(0o644)
    path, token = host_tmp_file
    inner = BREAKOUT.format(target=target, secret=path).replace("'", "'\\''")
    done = _run(attacker, f"dash -c '{inner}'", "--rules", str(rules))
    assert "remount=" in done.stdout, done.stderr  # the escalated dash ran
    _assert_confined(done.stdout, target, token)


def test_host_service_sockets_in_run_are_out_of_reach(attacker, outside):
    # docker.sock, systemd's private socket, /run/user/UID/bus: a socket the attacker may write
    # (root-owned for root, which is uid 0 to the host even in a user namespace; its own for the
    # user) in /run. connect(2) needs only that, read-only mount or not.
    rules = rules_file(outside, ESCALATE_DASH)
    path = f"/run/eg-svc-{uuid.uuid4().hex[:8]}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    try:
        os.chown(path, attacker.uid, attacker.gid)
        os.chmod(path, 0o600)
        listener.listen(8)
        probe = f"import socket; socket.socket(socket.AF_UNIX).connect({path!r}); print('connected')"
        script = f'python3 -c "{probe}"; echo "shell=$?"; dash -c \'python3 -c "{probe}"; echo "escalated=$?"\''
        done = _run(attacker, script, "--rules", str(rules))
        listener.setblocking(False)
        reached = True  # a connection would wait in the backlog
        try:
            listener.accept()[0].close()
        except BlockingIOError:
            reached = False
    finally:
        listener.close()
        os.unlink(path)
    assert not reached and "connected" not in done.stdout, done.stdout + done.stderr
    assert "shell=1" in done.stdout and "escalated=1" in done.stdout, done.stdout + done.stderr


#: Run as the attacker: a pseudo-terminal as the controlling terminal of a bwrap sandbox (the
#: session's own argv), inside which a program pushes input into the terminal with TIOCSTI.
_TIOCSTI_HARNESS = r"""
import os, pty, sys
from execgate.server.sandbox import choose_sandbox

work = sys.argv[1]
inject = (
    "import fcntl, os, termios\n"
    "res = []\n"
    "for name in ('tty', 'stdin'):\n"
    "    try:\n"
    "        fd = os.open('/dev/tty', os.O_RDWR) if name == 'tty' else 0\n"
    "        fcntl.ioctl(fd, termios.TIOCSTI, b'x')\n"
    "        res.append(name + '=injected')\n"
    "    except OSError as e:\n"
    "        res.append(name + '=errno' + str(e.errno))\n"
    "print(' '.join(res), flush=True)\n"
)
argv = choose_sandbox("bwrap", workdir=work).launch_argv(
    [os.path.realpath(sys.executable), "-c", inject], cwd=work)
pid, master = pty.fork()
if pid == 0:
    os.execv(argv[0], argv)
out = b""
while True:
    try:
        chunk = os.read(master, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
os.waitpid(pid, 0)
print(out.decode(errors="replace"))
"""


def test_no_terminal_to_inject_into(attacker):
    done = attacker.run([sys.executable, "-c", _TIOCSTI_HARNESS, str(attacker.workdir())])
    assert "stdin=errno" in done.stdout, done.stdout + done.stderr  # the injection was tried
    assert "=injected" not in done.stdout, done.stdout


# ------------------------------------------------------------------ 6: only the session's roots


def test_escalation_from_proc_never_sees_the_host_process_table(attacker, outside):
    rules = rules_file(outside, ESCALATE_DASH)
    token = f"3600.{uuid.uuid4().int % 10**9}"
    host = subprocess.Popen(["sleep", token])
    try:
        script = "cd /proc && dash -c 'cat /proc/[0-9]*/cmdline | tr \"\\0\" \" \"'; echo \"status=$?\""
        done = _run(attacker, script, "--rules", str(rules))
    finally:
        host.kill()
        host.wait()
    assert token not in done.stdout, "the host's process table was visible"  # (not printed: host data)
    assert "exists only inside this session's sandbox" in done.stderr, done.stderr


def test_escalation_from_tmp_never_sees_the_host_tmp(attacker, outside, host_tmp_file):
    # /tmp is the session's own directory, in its sandbox and in the escalated one alike.
    rules = rules_file(outside, ESCALATE_DASH)
    path, token = host_tmp_file
    done = _run(attacker, f"cd /tmp && dash -c 'pwd; cat {path}'; echo \"status=$?\"", "--rules", str(rules))
    assert token not in done.stdout, done.stdout
    assert "/tmp\n" in done.stdout and "status=1" in done.stdout, done.stdout + done.stderr  # it ran, saw nothing


def test_escalation_from_a_private_tmp_directory_works(attacker, outside):
    # Was refused while the session's /tmp was a tmpfs of its own (issue #12 item 8); the
    # unsandboxed case still is (tests/e2e/test_attack_session_tmp.py).
    rules = rules_file(outside, ESCALATE_DASH)
    script = ('cd "$(mktemp -d)" && dash -c "echo escalated-ok > out"; echo "status=$?"; cat out; '
              'cd ~- && dash -c "echo from-root-ok"')
    done = _run(attacker, script, "--rules", str(rules))
    assert "escalated-ok" in done.stdout and "status=0" in done.stdout, done.stdout + done.stderr
    assert "from-root-ok" in done.stdout, done.stderr


@pytest.mark.parametrize("system_dir", [
    "/", "/tmp", "/proc", "/etc", "/var/tmp", "/etc/cron.d", "/usr/local/bin", "/usr/lib", "/var/lib",
    "/var/cache", "/usr/share/doc", "/var/log", "~/.ssh", "~/.gnupg",
])
def test_system_directory_is_never_the_working_directory(attacker, system_dir):
    made = None
    if system_dir.startswith("~/"):  # the attacker's own credentials directory, made if missing
        path = Path(attacker.home) / system_dir[2:]
        if not path.exists():
            path.mkdir(mode=0o700)
            os.chown(path, attacker.uid, attacker.gid)
            made = path
        system_dir = str(path)
    if not os.path.isdir(system_dir):
        pytest.skip(f"{system_dir} does not exist here")
    pwned = Path(system_dir) / f"eg-pwned-{uuid.uuid4().hex[:8]}"
    try:
        done = attacker.execgate("run", "--sandbox", "bwrap", "--cwd", system_dir, "--",
                                 f"touch {pwned}; echo ran", cwd=attacker.workdir())
        assert done.returncode == 2, done.stdout + done.stderr
        assert "system directory" in done.stderr or "credentials directory" in done.stderr, done.stderr
        assert "ran" not in done.stdout and not pwned.exists()
    finally:
        if system_dir != "/proc":
            pwned.unlink(missing_ok=True)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def test_home_is_a_working_directory(attacker):
    # With --home real (the default private HOME refuses it: test_attack_home.py).
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--home", "real", "--cwd", attacker.home, "--",
                             "pwd", cwd=attacker.workdir())
    assert done.returncode == 0 and done.stdout.strip() == attacker.home, done.stderr


# ------------------------------------------------------------------ execgate's own install

#: Run in a session whose working directory holds the execgate package that runs it (``site``).
_TAMPER = """
P=site/execgate
echo pwned 2>/dev/null >> $P/policy_service/rules/default.toml; echo rules=$?
echo pwned 2>/dev/null >> $P/wrapper/execgate-wrapper-native; echo wrapper=$?
echo pwned 2>/dev/null >> $P/wrapper/libexecgate_preload.so; echo shim=$?
echo 'raise SystemExit' 2>/dev/null >> $P/server/cli.py; echo source=$?
mv $P $P.old 2>/dev/null; echo mv-pkg=$?
mv site site.old 2>/dev/null && mkdir -p $P; echo mv-site=$?
touch made-in-workdir; echo control=$?
dash -c 'echo pwned 2>/dev/null >> site/execgate/server/sandbox.py; echo escalated=$?; mv site site.old2 2>/dev/null; echo escalated-mv=$?'
"""


def test_execgate_install_in_the_working_directory_stays_read_only(attacker, outside):
    # `execgate run --cwd /work/proj` where execgate is installed in /work/proj/.venv: the session
    # must not rewrite what runs outside the sandbox next time (the native wrapper, the preload
    # shim, the Python sources, the shipped rules). A copy of the installed package, owned by the
    # attacker, is imported first (PYTHONPATH) and lies inside the working directory.
    rules = rules_file(outside, ESCALATE_DASH)
    top = Path(tempfile.mkdtemp(prefix="eg-inst-", dir="/var/tmp"))
    try:
        package = top / "site" / "execgate"
        shutil.copytree(own_package_dirs()[0], package, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        for dirpath, dirnames, filenames in os.walk(top):
            for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
                os.lchown(name, attacker.uid, attacker.gid)
        watched = ["policy_service/rules/default.toml", "wrapper/execgate-wrapper-native",
                   "wrapper/libexecgate_preload.so", "server/cli.py", "server/sandbox.py"]
        before = {name: (package / name).read_bytes() for name in watched}
        probe = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--cwd", str(top), "--", "true",
                                  cwd=top, env={"PYTHONPATH": str(top / "site")})
        assert probe.returncode == 0, probe.stderr
        done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--cwd", str(top), "--rules", str(rules), "--",
                                 _TAMPER, cwd=top, env={"PYTHONPATH": str(top / "site")})
        out = done.stdout + done.stderr
        assert "control=0" in done.stdout and "escalated=" in done.stdout, out
        for step in ("rules", "wrapper", "shim", "source", "mv-pkg", "mv-site", "escalated", "escalated-mv"):
            assert f"{step}=" in done.stdout and f"{step}=0" not in done.stdout, out
        assert sorted(os.listdir(top)) == ["made-in-workdir", "site"], out
        assert {name: (package / name).read_bytes() for name in watched} == before, out
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("layout", ["pth", "installed"])
def test_the_virtualenv_running_execgate_in_the_working_directory_stays_read_only(attacker, layout):
    # The virtualenv that runs execgate lies in the working directory: a .pth file (or a package)
    # the session put there would run outside the sandbox, as the user, the next time execgate
    # starts. The venv (made here, its site-packages pointing at the installed execgate through a
    # .pth of our own — or, "installed", holding a copy of the execgate package itself, as a
    # clone's .venv does) is kept read-only in the session; the rest of the workdir stays
    # writable. "installed" failed before 2026-12-02: the package's own read-only bind, inside the
    # venv, made the venv's directories read-write binds (found by a new user's trial).
    top = Path(tempfile.mkdtemp(prefix="eg-venv-", dir="/var/tmp"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(top / ".venv")], check=True)
        site = next((top / ".venv" / "lib").glob("python3*/site-packages"))
        (site / "execgate-under-test.pth").write_text(os.path.dirname(own_package_dirs()[0]) + "\n")
        if layout == "installed":  # found first on sys.path: the venv's own site-packages
            shutil.copytree(own_package_dirs()[0], site / "execgate", symlinks=True)
        for dirpath, dirnames, filenames in os.walk(top):
            for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
                os.lchown(name, attacker.uid, attacker.gid)
        python = str(top / ".venv" / "bin" / "python")
        script = (f"echo 'import os; os.system(\"touch {top}/pwned\")' > {site}/evil.pth; echo pth=$?; "
                  f"mv {top}/.venv {top}/old; echo mv=$?; touch made; echo control=$?")
        done = attacker.run([python, "-m", "execgate.server.cli", "run", "--sandbox", "bwrap", "--cwd", str(top),
                             "--", script], cwd=top)
        out = done.stdout + done.stderr
        assert "control=0" in done.stdout, out
        assert "pth=" in done.stdout and "pth=0" not in done.stdout, out
        assert "mv=" in done.stdout and "mv=0" not in done.stdout, out
        assert not (site / "evil.pth").exists() and not (top / "pwned").exists(), out
        assert "it is kept read-only in the session" in done.stderr, out
    finally:
        shutil.rmtree(top, ignore_errors=True)


#: Tries every way to leave a set-ID file behind in the working directory (found by review: root
#: in a root session's sandbox is the host's uid 0, so a set-user-ID root shell left there gives
#: root to every local user). Each line prints name=status.
_SETID = """
cp /bin/true suid-chmod; chmod 4755 suid-chmod; echo chmod=$?
cp /bin/true sgid-chmod; chmod g+s sgid-chmod; echo chmod-g=$?
install -m 4755 /bin/true suid-install 2>/dev/null; echo install=$?
/usr/bin/python3 -c 'import os; os.close(os.open("suid-open", os.O_CREAT | os.O_WRONLY, 0o4755))' 2>/dev/null; echo open=$?
/usr/bin/python3 -c 'import os; os.mknod("suid-mknod", 0o104755)' 2>/dev/null; echo mknod=$?
cp /bin/true plain; chmod 755 plain; echo control=$?
/usr/bin/python3 -c 'import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); sys.exit(0 if libc.syscall(425, 8, ctypes.create_string_buffer(120)) < 0 and ctypes.get_errno() == 38 else 1)'; echo uring-refused=$?
"""


@pytest.mark.parametrize("where", ["session", "escalated"])
def test_no_set_id_file_can_be_left_in_a_writable_root(attacker, outside, where):
    work = attacker.workdir()
    if where == "session":
        done = _run(attacker, _SETID)
    else:
        rules = rules_file(outside, ESCALATE_DASH)
        inner = _SETID.replace("'", "'\\''")
        done = _run(attacker, f"dash -c '{inner}'", "--rules", str(rules))
    out = done.stdout + done.stderr
    assert "control=0" in done.stdout, out
    # io_uring's IORING_OP_OPENAT creates files in the kernel, unseen by the filter: no io_uring
    # (io_uring_setup is ENOSYS) (review round 3 made an empty set-uid root file that way)
    assert "uring-refused=0" in done.stdout, out
    for step in ("chmod", "chmod-g", "install", "open", "mknod"):
        assert f"{step}=" in done.stdout and f"{step}=0" not in done.stdout, (step, out)
    for path in work.iterdir():
        if path.is_file():
            assert not path.stat().st_mode & 0o6000, (path, oct(path.stat().st_mode), out)


def test_every_process_of_the_sandbox_is_under_its_filters(attacker):
    # bwrap's own init (pid 1 of the sandbox's pid namespace) ran without the set-ID filter and the
    # backstop, and the session could ptrace it: injected chmod and execve calls made a set-uid
    # root file and ran a denied program ungated (review round 3). The session's command is pid 1
    # now (--as-pid-1): every process the session can see carries the seccomp filters.
    script = 'for p in /proc/[0-9]*; do echo "$(basename $p) $(grep Seccomp: $p/status 2>/dev/null)"; done'
    done = _run(attacker, script)
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()]
    assert ["1", "Seccomp:", "2"] in rows, done.stdout + done.stderr
    assert rows and all(row[1:] == ["Seccomp:", "2"] for row in rows if len(row) > 1), done.stdout


# ------------------------------------------------------------------ 7: the fallback socket

#: A fake escalation server that answers Run to every request: 4-byte little-endian length + JSON
#: (execgate.server.protocol); it touches READY once listening.
_FAKE_SERVER = r"""
import socket, struct, sys
path, ready = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(8)
open(ready, "w").close()
while True:
    c, _ = s.accept()
    (n,) = struct.unpack("<I", c.recv(4, socket.MSG_WAITALL))
    c.recv(n, socket.MSG_WAITALL)
    body = b'{"action":"Run"}'
    c.sendall(struct.pack("<I", len(body)) + body)
    c.close()
"""


def test_fallback_socket_cannot_be_replaced_by_a_fake_server(attacker, outside):
    work = attacker.workdir()
    bindir = work / "bin"
    bindir.mkdir()
    os.chown(bindir, attacker.uid, attacker.gid)
    marker = attacker.marker_program(bindir, "pwned")
    rules = rules_file(outside, f'default = "run"\n\n[[rule]]\nid = "no-pwned"\nprogram = "{marker}"\ndecision = "deny"\n')
    fake = outside / "fake_server.py"
    fake.write_text(_FAKE_SERVER)
    fake.chmod(0o644)
    ready = work / "ready"
    # Replace the socket (or its directory) with a fake server, then exec the denied marker from a
    # child that lost CODEX_ESCALATE_SOCKET (close_fds): its wrapper uses EXECGATE_SOCKET_PATH.
    script = f"""
S="$EXECGATE_SOCKET_PATH"; D="${{S%/*}}"
rm -f "$S" 2>/dev/null; echo "rm=$?"
mv "$D" "$D.old" 2>/dev/null && mkdir "$D"; echo "mv=$?"
python3 {fake} "$S" {ready} 2>/dev/null &
while [ ! -e {ready} ] && kill -0 $! 2>/dev/null; do sleep 0.1; done
python3 -c 'import subprocess; subprocess.run(["{marker}"], close_fds=True)'
python3 -c 'import subprocess; subprocess.run(["/bin/echo", "fallback-ok"], close_fds=True)'
kill $! 2>/dev/null
"""
    done = _run(attacker, script, "--rules", str(rules))
    assert not attacker.marker_ran("pwned"), done.stdout + done.stderr
    assert "rm=0" not in done.stdout and "mv=0" not in done.stdout, done.stdout
    # Control: the real server answered through the fallback path (echo allowed, marker denied).
    assert "fallback-ok" in done.stdout and "Execution denied" in done.stderr, done.stdout + done.stderr
