"""The shell sandbox: real bubblewrap, observed from inside (as root when the suite runs as root)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from execgate.server.policy import Permissions
from execgate.server.sandbox import (
    make_tmp_mount_parents,
    TRUSTED_BIN_DIRS,
    SandboxError,
    bwrap_argv,
    bwrap_usable,
    choose_sandbox,
    find_bwrap,
    hiding,
    own_package_dirs,
    unsafe_workdir,
)

pytestmark = pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_workdir_writable_root_read_only(short_tmp):
    sandbox = choose_sandbox("bwrap", workdir=str(short_tmp))
    script = "touch ok && echo wrote; touch /etc/eg-nope 2>/dev/null || echo root-ro; touch /tmp/t && echo tmp-ok"
    done = _run(sandbox.launch_argv(["/bin/sh", "-c", script], cwd=str(short_tmp)))
    assert done.stdout.split() == ["wrote", "root-ro", "tmp-ok"], done.stderr
    assert (short_tmp / "ok").exists()


def test_no_network_in_shell_sandbox(short_tmp):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        sandbox = choose_sandbox("bwrap", workdir=str(short_tmp))
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
        inside = _run(sandbox.launch_argv(["python3", "-c", probe], cwd=str(short_tmp)))
        outside = _run(["python3", "-c", probe])
    finally:
        listener.close()
    assert outside.returncode == 0, outside.stderr
    assert inside.returncode != 0
    assert "ConnectionRefusedError" in inside.stderr


def test_network_permission_keeps_network(short_tmp):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        argv = bwrap_argv(Permissions(network=True, writable_roots=(str(short_tmp),)), cwd=str(short_tmp))
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
        done = _run(argv + ["python3", "-c", probe])
    finally:
        listener.close()
    assert done.returncode == 0, done.stderr


def test_none_mode_is_unconfined(short_tmp):
    sandbox = choose_sandbox("none", workdir=str(short_tmp))
    assert sandbox.permissions is None
    assert sandbox.launch_argv(["sh", "-c", "true"], cwd=str(short_tmp)) == ["sh", "-c", "true"]


def test_bwrap_missing_is_an_error_for_bwrap_and_a_fallback_for_auto(short_tmp):
    with pytest.raises(SandboxError, match="not found"):
        choose_sandbox("bwrap", workdir=str(short_tmp), bwrap_dirs=(str(short_tmp),))
    auto = choose_sandbox("auto", workdir=str(short_tmp), bwrap_dirs=(str(short_tmp),))
    assert auto.mode == "none" and "not found" in auto.note


def _pids_with_cmdline(needle: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_killing_bwrap_kills_grandchildren_that_left_the_group(short_tmp):
    token = f"4{os.getpid()}.{time.monotonic_ns() % 100000}".encode()
    prefix = bwrap_argv(Permissions(writable_roots=(str(short_tmp),)), cwd=str(short_tmp))
    argv = prefix + ["/bin/sh", "-c", f"setsid sleep {token.decode()} & wait"]
    proc = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 20
        while not _pids_with_cmdline(b"sleep\0" + token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _pids_with_cmdline(b"sleep\0" + token), "the detached sleep started"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while _pids_with_cmdline(b"sleep\0" + token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pids_with_cmdline(b"sleep\0" + token) == []


def test_no_capabilities_no_new_privs_no_terminal_inside(short_tmp):
    # As root too (the suite runs as root): bwrap alone would keep every capability.
    sandbox = choose_sandbox("bwrap", workdir=str(short_tmp))
    script = "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; cut -d' ' -f7 /proc/self/stat"
    done = _run(sandbox.launch_argv(["/bin/sh", "-c", script], cwd=str(short_tmp)))
    fields = dict(line.split(":\t") for line in done.stdout.splitlines() if ":\t" in line)
    assert fields == {**{f"Cap{k}": "0" * 16 for k in ("Inh", "Prm", "Eff", "Bnd", "Amb")}, "NoNewPrivs": "1"}, done.stderr
    assert done.stdout.splitlines()[-1] == "0"  # tty_nr (proc(5)): no controlling terminal


def test_socket_dir_is_read_only_but_connectable(short_tmp):
    work, sockdir = short_tmp / "w", short_tmp / "s"
    work.mkdir()
    sockdir.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sockdir / "s"))
    listener.listen(1)
    try:
        sandbox = choose_sandbox("bwrap", workdir=str(work))
        sock, moved = str(sockdir / "s"), str(work / "x")
        probe = (f"import os, socket\nsocket.socket(socket.AF_UNIX).connect({sock!r}); print('connected')\n"
                 f"for op in (lambda: os.unlink({sock!r}), lambda: os.rename({str(sockdir)!r}, {moved!r})):\n"
                 "    try:\n        op(); print('changed')\n    except OSError as e:\n        print('refused', e.errno)\n")
        done = _run(sandbox.launch_argv(["python3", "-c", probe], cwd=str(work), extra_binds=[str(sockdir)]))
    finally:
        listener.close()
    assert done.stdout.split("\n")[0] == "connected", done.stderr
    assert "changed" not in done.stdout and done.stdout.count("refused") == 2, done.stdout
    assert (sockdir / "s").exists()


def test_socket_dir_inside_a_writable_root_is_refused(short_tmp):
    # Its parent could be renamed away and replaced from inside.
    with pytest.raises(SandboxError, match="overlaps a writable root"):
        bwrap_argv(Permissions(writable_roots=(str(short_tmp),)), cwd=str(short_tmp), extra_binds=[str(short_tmp / "s")])


def test_bwrap_is_found_in_trusted_dirs_only(monkeypatch, short_tmp):
    fake = short_tmp / "bwrap"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{short_tmp}:{os.environ['PATH']}")
    found = find_bwrap()
    assert found is not None and found != str(fake) and os.path.dirname(found) in TRUSTED_BIN_DIRS
    # A bwrap in a directory others can write is no launcher, even when listed.
    short_tmp.chmod(0o777)
    assert find_bwrap([str(short_tmp)]) is None
    with pytest.raises(SandboxError, match="absolute"):
        bwrap_argv(Permissions(writable_roots=(str(short_tmp),)), cwd=str(short_tmp), bwrap="bwrap")


def test_start_dir_is_never_bound_by_itself(short_tmp):
    with pytest.raises(SandboxError, match="not visible"):
        bwrap_argv(Permissions(), cwd=str(short_tmp))  # under the private /tmp, no root covers it
    argv = bwrap_argv(Permissions(), cwd="/usr")  # visible read-only as part of /
    assert "/usr" not in argv[:argv.index("--chdir")]


@pytest.mark.parametrize("path", [
    "/", "/tmp", "/var/tmp", "/proc", "/proc/1", "/dev/shm", "/run/user", "/sys", "/etc", "/usr", "/lib64",
    "/etc/cron.d", "/usr/local/bin", "/usr/lib", "/usr/src/project", "/var", "/var/lib", "/var/spool/cron",
    "/boot/grub", "/root/.ssh", "/home/x/.gnupg/private-keys-v1.d", "/srv", "/opt", "/home",
])
def test_system_dirs_are_not_workdirs(path):
    assert unsafe_workdir(path, home="/home/x") is not None
    with pytest.raises(SandboxError, match="system directory|credentials directory"):
        choose_sandbox("bwrap", workdir=path)


def test_home_and_project_dirs_are_workdirs(short_tmp):
    assert unsafe_workdir("/root", home="/root") is None
    assert unsafe_workdir(str(short_tmp), home="/root") is None
    for project in ("/opt/project", "/srv/site", "/home/x/src", "/root/project", "/var/tmp/work", "/tmp/w"):
        assert unsafe_workdir(project, home="/home/x") is None, project
    # The user's HOME is allowed, never / or a system tree because HOME says so.
    assert unsafe_workdir("/", home="/") is not None and unsafe_workdir("/var/lib/x", home="/var/lib/x") is not None
    assert unsafe_workdir("/home/x/.ssh", home="/home/x/.ssh") is not None


def test_spawn_refuses_a_relative_command():
    from execgate.server.spawn import spawn

    with pytest.raises(ValueError, match="absolute"):
        spawn(["true"], env={"PATH": "/usr/bin:/bin"}, cwd="/")


def test_a_masked_dir_is_empty_but_roots_below_it_show(short_tmp):
    masked = short_tmp / "home"
    (masked / ".ssh").mkdir(parents=True)
    (masked / ".ssh" / "id").write_text("secret\n")
    (masked / "project").mkdir()
    perms = Permissions(writable_roots=(str(masked / "project"),), masked_dirs=(str(masked),))
    script = f"ls -A {masked}; cat {masked}/.ssh/id 2>/dev/null || echo hidden; touch {masked}/project/ok && echo wrote"
    done = _run(bwrap_argv(perms, cwd=str(masked / "project")) + ["/bin/sh", "-c", script])
    assert done.stdout.split() == ["project", "hidden", "wrote"], done.stderr
    assert (masked / "project" / "ok").exists()


def _var_tmp_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="eg-hid-", dir="/var/tmp"))
    path.chmod(0o755)
    return path


def test_a_hidden_file_stays_hidden_when_replaced_on_the_host(short_tmp):
    # The directory of a hidden file is masked: a token renamed into place mid-session stays unseen.
    secrets = _var_tmp_dir()
    try:
        token = secrets / "token"
        token.write_text("old-token\n")
        go = short_tmp / "go"
        sandbox = choose_sandbox("bwrap", workdir=str(short_tmp), hidden=[str(token)])
        assert sandbox.start_warnings(str(short_tmp), prefix="/nonexistent") == []
        script = (f"cat {token}; echo before=$?; touch ready; while [ ! -e {go} ]; do sleep 0.05; done; "
                  f"cat {token}; echo after=$?; ls -A {secrets} | wc -l")
        proc = subprocess.Popen(sandbox.launch_argv(["/bin/sh", "-c", script], cwd=str(short_tmp)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(short_tmp))
        for _ in range(200):
            if (short_tmp / "ready").exists():
                break
            time.sleep(0.05)
        (secrets / "token.new").write_text("new-token\n")
        os.rename(secrets / "token.new", token)
        go.touch()
        out, err = proc.communicate(timeout=30)
        assert "before=" in out and "after=" in out, err
        assert "token" not in out and "before=0" not in out and "after=0" not in out, out
        assert out.split()[-1] == "0", out  # the directory is empty inside
    finally:
        shutil.rmtree(secrets, ignore_errors=True)


def test_a_hidden_file_in_a_writable_root_keeps_a_cover_and_is_warned_about(short_tmp):
    token = short_tmp / "token"
    token.write_text("secret\n")
    sandbox = choose_sandbox("bwrap", workdir=str(short_tmp), hidden=[str(token)])
    masked, covered = hiding(sandbox.permissions, cwd=str(short_tmp), hidden=sandbox.hidden)
    assert masked == [] and covered == [str(token)]
    warnings = sandbox.start_warnings(str(short_tmp), prefix="/nonexistent")
    assert len(warnings) == 1 and str(token) in warnings[0] and "visible" in warnings[0]
    done = _run(sandbox.launch_argv(["/bin/sh", "-c", f"cat {token}; echo status=$?; ls {short_tmp}"],
                                    cwd=str(short_tmp)))
    assert "secret" not in done.stdout and "status=" in done.stdout, done.stdout + done.stderr


def test_a_system_directory_is_never_masked_for_a_hidden_file(short_tmp):
    perms = Permissions(writable_roots=(str(short_tmp),), hidden_paths=("/etc/hostname", "/var/nonexistent-eg"))
    masked, covered = hiding(perms, cwd=str(short_tmp))
    assert masked == [] and covered == ["/etc/hostname"]
    # In a masked directory (the real HOME) that no root shows, a file is out of sight already.
    home = short_tmp / "home"
    (home / "tools").mkdir(parents=True)
    (home / "token").write_text("t\n")
    perms = Permissions(readable_roots=(str(home / "tools"),), masked_dirs=(str(home),), hidden_paths=(str(home / "token"),))
    assert hiding(perms, cwd="/") == ([], [])


def test_a_protected_path_in_a_writable_root_can_neither_be_written_nor_moved(short_tmp):
    pkg = short_tmp / "venv" / "lib" / "site" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text("original\n")
    perms = Permissions(writable_roots=(str(short_tmp),), protected_paths=(str(pkg),))
    script = (f"cd {short_tmp}; echo x >> venv/lib/site/pkg/mod.py; echo write=$?; touch venv/lib/site/pkg/new; "
              "echo create=$?; mv venv/lib/site/pkg venv/lib/site/old; echo mv-pkg=$?; mv venv/lib venv/lib2; "
              "echo mv-lib=$?; mv venv venv2; echo mv-venv=$?; touch venv/lib/site/other && echo other-ok")
    done = _run(bwrap_argv(perms, cwd=str(short_tmp)) + ["/bin/sh", "-c", script])
    for step in ("write", "create", "mv-pkg", "mv-lib", "mv-venv"):
        assert f"{step}=" in done.stdout and f"{step}=0" not in done.stdout, done.stdout + done.stderr
    assert "other-ok" in done.stdout, done.stdout + done.stderr  # the rest of the root stays writable
    assert (pkg / "mod.py").read_text() == "original\n" and not (pkg / "new").exists()


def test_execgate_own_package_is_protected_in_every_sandbox():
    own = own_package_dirs()
    assert len(own) == 1 and os.path.isdir(own[0]) and os.path.isfile(os.path.join(own[0], "server", "sandbox.py"))
    above = os.path.dirname(own[0])
    argv = bwrap_argv(Permissions(writable_roots=(above,)), cwd=above)
    assert argv.index("--ro-bind", argv.index(above)) < argv.index("--chdir")
    last = len(argv) - 1 - argv[::-1].index(own[0])  # the protection, after the writable root
    assert argv[last - 2] == "--ro-bind" and last > argv.index(above)  # --ro-bind SRC DEST


def test_hidden_and_protected_paths_cross_the_wire_and_reach_escalations():
    from execgate.policy_service.decisions import _profile
    from execgate.server.policy import Execution, SessionContext
    from execgate.server.policy_codec import CodecError, permissions_from_pb, permissions_to_pb

    box = Permissions(writable_roots=("/w",), hidden_paths=("/var/tmp/p/token",), protected_paths=("/w/.venv/eg",))
    assert permissions_from_pb(permissions_to_pb(box)) == box
    with pytest.raises(CodecError, match="absolute"):
        permissions_from_pb(permissions_to_pb(Permissions(hidden_paths=("token",))))
    session = SessionContext("s", sandbox=box)
    granted = _profile(Execution("permissions", Permissions(network=True)), session, "/w")
    assert granted.network and granted.hidden_paths == box.hidden_paths
    assert granted.protected_paths == box.protected_paths
    assert _profile(Execution("session_default"), session, "/w") == box


# ------------------------------------------------------------------ the session's own /tmp directory


def test_a_tmp_dir_is_bound_at_tmp_and_the_hosts_tmp_stays_hidden(short_tmp):
    tmp = Path(tempfile.mkdtemp(prefix="eg-sess-tmp-", dir="/tmp"))
    marker = Path(tempfile.mkstemp(prefix="eg-host-", dir="/tmp")[1])
    try:
        (tmp / "made-before").write_text("from-the-session\n")
        perms = Permissions(writable_roots=(str(short_tmp),), tmp_dir=str(tmp))
        script = f"cat /tmp/made-before; echo new > /tmp/made-inside; ls {marker} 2>/dev/null; echo marker=$?"
        # As ShellSandbox.launch_argv does before the session starts: the directories between /tmp
        # and each mount below it (execgate's package, under /tmp in a CI clone) are made first.
        make_tmp_mount_parents(perms)
        done = _run(bwrap_argv(perms, cwd=str(short_tmp)) + ["/bin/sh", "-c", script])
        assert done.stdout.split() == ["from-the-session", "marker=2"], done.stdout + done.stderr
        assert sorted(p.name for p in tmp.iterdir() if p.is_file()) == ["made-before", "made-inside"]
        assert (tmp / "made-inside").read_text() == "new\n"
        argv = bwrap_argv(perms, cwd="/tmp/sub")  # a start directory in it is visible inside
        assert argv[argv.index(str(tmp)) - 1] == "--bind" and argv[argv.index(str(tmp)) + 1] == "/tmp"
        assert "--tmpfs" not in [a for i, a in enumerate(argv) if i + 1 < len(argv) and argv[i + 1] == "/tmp"]
        with pytest.raises(SandboxError, match="not visible"):  # without the directory it is not
            bwrap_argv(Permissions(writable_roots=(str(short_tmp),)), cwd="/tmp/sub")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("bad", ["/", "/tmp", "/etc", "/usr/lib", "relative", "/tmp/../etc", "/tmp/eg-missing-dir"])
def test_a_tmp_dir_that_is_unsafe_is_refused(short_tmp, bad):
    with pytest.raises(SandboxError):
        bwrap_argv(Permissions(writable_roots=(str(short_tmp),), tmp_dir=bad), cwd=str(short_tmp))


def test_a_tmp_dir_through_a_symlink_or_holding_a_hidden_file_is_refused(short_tmp):
    tmp = Path(tempfile.mkdtemp(prefix="eg-sess-tmp-", dir="/tmp"))
    link = Path(f"{tmp}-link")
    try:
        link.symlink_to(tmp)
        with pytest.raises(SandboxError, match="symlinks"):
            bwrap_argv(Permissions(tmp_dir=str(link)), cwd=str(short_tmp))
        (tmp / "token").write_text("t")
        with pytest.raises(SandboxError, match="must stay hidden"):
            bwrap_argv(Permissions(tmp_dir=str(tmp), hidden_paths=(str(tmp / "token"),)), cwd=str(short_tmp))
    finally:
        link.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_tmp_dir_crosses_the_wire_and_only_the_sessions_reaches_escalations():
    from execgate.policy_service.decisions import EscalationRefused, _profile, _stranded_workdir
    from execgate.server.policy import Execution, SessionContext
    from execgate.server.policy_codec import CodecError, permissions_from_pb, permissions_to_pb

    box = Permissions(writable_roots=("/w", "/tmp/execgate-home-x"), tmp_dir="/tmp/execgate-tmp-x")
    assert permissions_from_pb(permissions_to_pb(box)) == box
    assert permissions_from_pb(permissions_to_pb(Permissions())).tmp_dir is None
    for bad in ("tmp", "/tmp", "/", "/tmp/../etc", "/tmp/x/"):
        with pytest.raises(CodecError, match="tmp_dir"):
            permissions_from_pb(permissions_to_pb(Permissions(tmp_dir=bad)))
    session = SessionContext("s", sandbox=box)
    granted = _profile(Execution("permissions", Permissions(network=True, tmp_dir="/var/tmp/other")), session, "/w")
    assert granted.tmp_dir == box.tmp_dir and granted.network
    assert _profile(Execution("session_default"), session, "/w") == box
    with pytest.raises(EscalationRefused, match="lies in /tmp"):  # it would be mounted where the session writes
        _profile(Execution("permissions", Permissions(writable_roots=("/tmp/shared",))), session, "/w")
    # A directory in the session's /tmp: the same for a sandboxed escalation, not for an unsandboxed one.
    assert _stranded_workdir(session, "/tmp/tmp.abc", Execution("permissions", Permissions())) is None
    assert _stranded_workdir(session, "/tmp/tmp.abc", Execution("session_default")) is None
    assert "escalated unsandboxed" in _stranded_workdir(session, "/tmp/tmp.abc", Execution("unsandboxed"))
    assert "exists only inside" in _stranded_workdir(session, "/proc/1", Execution("session_default"))
    bare = SessionContext("s", sandbox=Permissions(writable_roots=("/w",)))  # a tmpfs /tmp: as before
    assert "exists only inside" in _stranded_workdir(bare, "/tmp/tmp.abc", Execution("session_default"))


def test_execgates_own_package_is_always_visible_read_only():
    """Every sandbox binds execgate's package read-only (its launcher starts first inside, then
    the wrapper and shim run): a virtualenv under /tmp, hidden by the private /tmp, made
    bwrap_usable() fail and --sandbox auto fall back to none (found by a fresh clone under /tmp)."""
    from execgate.server.sandbox import own_package_dirs

    argv = bwrap_argv(Permissions(), cwd="/", bwrap="/usr/bin/bwrap")
    (package,) = own_package_dirs()
    binds = [tuple(argv[i:i + 3]) for i in range(len(argv) - 2)]
    assert ("--ro-bind-try", package, package) in binds
    assert argv.index("--ro-bind-try", argv.index("--tmpfs")) < argv.index("--")
