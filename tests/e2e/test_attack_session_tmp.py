"""The session's private ``/tmp`` is one host directory, shared with its sandboxed escalations
(issue #12 item 8, second bullet), run for real as root and as an unprivileged user:
``execgate run --sandbox bwrap`` as a subprocess, real bubblewrap, real shells.

* ``cd "$(mktemp -d)"`` then an escalated command (a rule with ``execution = { network = true }``,
  the shipped ``git-network`` rule's ``git clone``) works, and what it wrote is the session's;
* the host's ``/tmp`` stays invisible to the session and to the escalation;
* an unsandboxed escalation from there is still refused, with a reason;
* the directory is removed when ``execgate run`` exits, after ``--timeout`` too;
* a request the session forges over its fallback socket cannot name another directory: the
  profile, ``tmp_dir`` included, is the escalation server's own.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

import pytest

from attack_support import ESCALATE_DASH, rules_file
from execgate.server.sandbox import bwrap_usable

pytestmark = pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")

#: Escalates ``dash`` unsandboxed: it would run on the host.
ESCALATE_DASH_UNSANDBOXED = """
default = "run"

[[rule]]
id = "dash-unsandboxed"
program = "dash"
decision = "escalate"
execution = "unsandboxed"
"""








def _run(attacker, script: str, *extra: str, timeout: float = 90):
    """``execgate run --sandbox bwrap`` (not quiet: the start lines name the /tmp directory)."""
    return attacker.execgate("run", "--sandbox", "bwrap", *extra, "--", script, cwd=attacker.workdir(),
                             timeout=timeout)


def _tmp_dir(stderr: str) -> Path:
    """The host directory of the session's /tmp, as the start line names it."""
    found = re.search(r"a private /tmp \((/\S+) on the host, removed at exit\)", stderr)
    assert found, stderr
    return Path(found.group(1))


def test_escalation_from_the_private_tmp_sees_the_sessions_tmp(attacker, outside, host_tmp_file):
    rules = rules_file(outside, ESCALATE_DASH)
    marker, token = host_tmp_file
    script = f"""
cd "$(mktemp -d)" || exit 9
dash -c 'echo escalated-wrote > made; ls /tmp >/dev/null; cat {marker} 2>/dev/null; echo "escalated-marker=$?"'
echo "status=$?"
cat made
cat {marker} 2>/dev/null; echo "shell-marker=$?"
"""
    done = _run(attacker, script, "--rules", str(rules))
    out = done.stdout
    assert "status=0" in out and "escalated-wrote" in out, out + done.stderr
    assert token not in out and "escalated-marker=1" in out and "shell-marker=1" in out, out
    assert "exists only inside" not in done.stderr, done.stderr
    assert not _tmp_dir(done.stderr).exists()  # removed at exit


def test_git_clone_in_the_private_tmp_under_the_shippedrules_file(attacker):
    if shutil.which("git", path="/usr/bin:/bin") is None:
        pytest.skip("git is not installed in a system directory")
    script = """
cd "$(mktemp -d)" || exit 9
git init -q src && git -C src -c user.name=t -c user.email=t@example.org commit -q --allow-empty -m first-commit
git clone -q src copy; echo "clone=$?"
git -C copy log --format=%s
"""
    done = _run(attacker, script)
    assert "clone=0" in done.stdout and "first-commit" in done.stdout, done.stdout + done.stderr
    assert "exists only inside" not in done.stderr, done.stderr


def test_unsandboxed_escalation_from_the_private_tmp_is_refused(attacker, outside):
    rules = rules_file(outside, ESCALATE_DASH_UNSANDBOXED)
    script = ('cd "$(mktemp -d)" && dash -c "echo escalated-ok"; echo "status=$?"; '
              'cd ~- && dash -c "echo from-root-ok"')
    done = _run(attacker, script, "--rules", str(rules))
    assert "escalated-ok" not in done.stdout and "status=1" in done.stdout, done.stdout + done.stderr
    assert "escalated unsandboxed" in done.stderr and "/tmp is the host's own" in done.stderr, done.stderr
    assert f"cd to {attacker.workdir()}" in done.stderr, done.stderr
    assert "from-root-ok" in done.stdout, done.stderr  # control: from the session's root it runs


def test_the_directory_is_removed_after_a_timeout(attacker):
    # Left behind: files, a read-only directory holding a file (as Go's module cache).
    script = "cd /tmp && mkdir -p ro/sub && echo x > ro/sub/f && chmod 500 ro/sub ro && echo left; sleep 60"
    done = _run(attacker, script, "--timeout", "3")
    assert done.returncode == 124 and "left" in done.stdout, done.stdout + done.stderr
    assert not _tmp_dir(done.stderr).exists()


#: Run in the session: a request of its own over the fallback socket that names another directory
#: as the sandbox's /tmp in every place a client could think of; then the escalation it gets.
_FORGE = r"""
import json, os, socket, sys
from execgate.server.fdpass import recv_frame_blocking, send_frame_blocking
from execgate.wrapper.client import escalate

victim = sys.argv[1]
box = {"tmp_dir": victim, "writable_roots": [victim], "readable_roots": [victim]}
request = {
    "file": "/usr/bin/dash", "argv": ["dash", "-c", "cat /tmp/victim-file; echo forged-status=$?"],
    "workdir": os.getcwd(), "env": {"PATH": "/usr/bin:/bin"},
    "tmp_dir": victim, "sandbox": box, "session": {"sandbox": box}, "permissions": box,
}
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["EXECGATE_SOCKET_PATH"])
send_frame_blocking(s, json.dumps(request).encode(), [])
payload, _ = recv_frame_blocking(s, max_fds=0)
answer = json.loads(payload)
print("answer=" + str(answer.get("action")), flush=True)
if answer.get("action") == "Escalate":
    print("exit=%d" % escalate(s, False), flush=True)
"""


def test_a_forged_request_cannot_choose_the_tmp_directory(attacker, outside):
    rules = rules_file(outside, ESCALATE_DASH)
    victim = outside / "victim"
    victim.mkdir(mode=0o755)
    token = f"victim-{uuid.uuid4().hex}"
    (victim / "victim-file").write_text(token + "\n")
    (victim / "victim-file").chmod(0o644)
    forge = outside / "forge.py"
    forge.write_text(_FORGE)
    forge.chmod(0o644)
    done = _run(attacker, f'cd "$(mktemp -d)" && python3 {forge} {victim}', "--rules", str(rules))
    out = done.stdout
    assert "answer=Escalate" in out and "forged-status=" in out, out + done.stderr  # the escalation ran
    assert token not in out and "forged-status=1" in out, out


def test_a_renamed_parent_cannot_move_an_escalations_mounts(attacker, outside):
    """A working directory two levels under /tmp: its parent, in the session's own /tmp
    directory, was a plain directory the session could rename and replace with a symlink, so that
    an escalation's bwrap mounted the working directory through it, anywhere (review round 3 put
    it over execgate's own launcher and ran a fake one; over /usr/share here). Every directory
    between /tmp and a mount is a mount point of its own: the rename fails, the escalation's
    /usr/share is the real one."""
    base = attacker.workdir()
    work = base / "deep"
    work.mkdir()
    (work / "MARK").write_text("from the workdir\n")
    for path in (work, work / "MARK"):
        os.chown(path, attacker.uid, attacker.gid)
    rules = rules_file(outside, ESCALATE_DASH)
    script = (f"mv {base} /tmp/moved-away 2>/dev/null; echo mv=$?; "
              f"mkdir -p {base} 2>/dev/null; ln -s ../../usr/share {work} 2>/dev/null; echo ln=$?; "
              "dash -c 'test -e /usr/share/MARK && echo shadowed; test -d /usr/share/doc && echo doc-visible'")
    done = attacker.execgate("run", "--sandbox", "bwrap", "--rules", str(rules), "--cwd", str(work), "--", script,
                             cwd=work)
    out = done.stdout + done.stderr
    assert "mv=0" not in done.stdout and "mv=" in done.stdout, out
    assert "shadowed" not in done.stdout and "doc-visible" in done.stdout, out


def test_a_tree_deeper_than_the_recursion_limit_is_removed_at_exit(attacker):
    """Review round 3: 1,300 nested directories in the session's /tmp crashed the cleanup
    (RecursionError): execgate run exited 1 with a traceback instead of the script's status, and
    the directory stayed on the host."""
    done = _run(attacker, 'cd /tmp && for i in $(seq 1300); do mkdir d && cd d || exit 3; done; exit 7', timeout=180)
    assert done.returncode == 7, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not _tmp_dir(done.stderr).exists()


def test_a_root_nested_in_the_working_directory_is_not_bound_again(attacker, outside):
    """``--home DIR`` two levels inside the working directory: an escalation's bwrap bound the
    HOME by its path after the working directory, so a symlink the session put in place of the
    HOME's parent made it bind a host directory of the session's choosing, read-write (review
    round 4 read a secret and wrote a file there). A root inside a writable root is not bound
    again: it shows through the outer one."""
    base = attacker.workdir()
    work, secret_dir = base / "p", base / "hostsecret" / "home"
    (work / ".x").mkdir(parents=True)
    secret_dir.mkdir(parents=True)
    (secret_dir / "secret.txt").write_text("TOPSECRET\n")
    for path in (work, work / ".x"):
        os.chown(path, attacker.uid, attacker.gid)
    (base / "hostsecret").chmod(0o700)
    os.chown(base / "hostsecret", attacker.uid, attacker.gid)
    rules = rules_file(outside, ESCALATE_DASH)
    script = (f"mkdir -p {base}/hostsecret/home; mv .x .x.old; ln -s ../hostsecret .x; "
              f"dash -c 'cat {work}/.x/home/secret.txt; echo W > {work}/.x/home/pwned'; echo done")
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--rules", str(rules), "--cwd", str(work),
                             "--home", str(work / ".x" / "home"), "--", script, cwd=work)
    out = done.stdout + done.stderr
    assert "done" in done.stdout, out
    assert "TOPSECRET" not in out, out
    assert not (secret_dir / "pwned").exists(), out


def test_an_escalation_cannot_move_the_sessions_socket_directory(attacker, outside):
    """Review round 4: in an escalation's view of the session's /tmp directory, the session's
    fallback-socket directory was a plain directory: an escalated command renamed it away and the
    session bound a socket of its own at EXECGATE_SOCKET_PATH. Escalations bind it read-only too."""
    rules = rules_file(outside, ESCALATE_DASH)
    script = ('S=$(dirname "$EXECGATE_SOCKET_PATH"); dash -c "mv $S /tmp/gone-away"; echo mv=$?; '
              'mkdir -p "$S" 2>/dev/null; /usr/bin/python3 -c "import os, socket; '
              's = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(os.environ[\'EXECGATE_SOCKET_PATH\'])" '
              '2>/dev/null; echo bind=$?')
    done = _run(attacker, script, "-q", "--rules", str(rules))
    out = done.stdout + done.stderr
    assert "mv=" in done.stdout and "mv=0" not in done.stdout, out
    assert "bind=" in done.stdout and "bind=0" not in done.stdout, out
