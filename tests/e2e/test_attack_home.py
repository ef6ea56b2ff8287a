"""Attack: the user's secrets in their real HOME under the default ``--home`` (private), run for real
as root and as an unprivileged user (issue #12 item 6, docs/DESIGN.md §7).

The session gets a private writable HOME and the real one is masked: a key in the real HOME's
``.ssh`` can be read neither by the shell (by absolute path, through ``$HOME``, or through
``/proc/self/root``) nor by a command the default rules escalate with network (``git fetch
--upload-pack`` runs a shell command of the caller's choice). ``--home real`` is the control: the
same probes read the key there, so the probes do work. A working directory that is the real HOME
or an ancestor of it would be bound writable over the mask: refused unless ``--home real``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from execgate.server.sandbox import bwrap_usable

pytestmark = pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")

PROBE = """
cat {key} 2>/dev/null; echo "abs=$?"
cat /proc/self/root{key} 2>/dev/null; echo "proc-root=$?"
cat "$HOME/.ssh/{name}" 2>/dev/null; echo "home=$?"
git init -q -b main up && git -C up -c user.name=a -c user.email=a@example.org commit -q --allow-empty -m x
git init -q -b main down
n=$(git -C down fetch --upload-pack='cat {key} >&2; false' ../up 2>&1 | grep -c {token}); echo "fetch-leaks=$n"
"""


@pytest.fixture
def real_home(attacker):
    """The attacker's HOME with a private key in ``.ssh`` (0600, the attacker's). For the
    unprivileged account its real home directory; for root a root-owned stand-in under /var/tmp
    (so that the machine's /root is not touched), passed as HOME."""
    token = f"PRIVATE-{uuid.uuid4().hex}"
    made = None
    if attacker.is_root:
        made = home = Path(tempfile.mkdtemp(prefix="eg-roothome-", dir="/var/tmp"))
    else:
        home = Path(attacker.home)
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    key = ssh / f"id_eg_{uuid.uuid4().hex[:8]}"
    key.write_text(token + "\n")
    key.chmod(0o600)
    for path in (ssh, key):
        os.chown(path, attacker.uid, attacker.gid)
    try:
        yield home, key, token
    finally:
        key.unlink(missing_ok=True)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def _probe(attacker, home: Path, key: Path, token: str, *extra: str):
    script = PROBE.format(key=key, name=key.name, token=token)
    return attacker.execgate("run", "-q", "--sandbox", "bwrap", *extra, "--", script,
                             cwd=attacker.workdir(), env={"HOME": str(home)})


def test_private_home_hides_the_real_ssh_keys(attacker, real_home):
    home, key, token = real_home
    done = _probe(attacker, home, key, token)
    out = done.stdout + done.stderr
    assert "fetch-leaks=0" in done.stdout, out  # the script ran to its end
    assert token not in out, out
    assert "abs=0" not in out and "proc-root=0" not in out and "home=0" not in out, out


def test_home_real_control_reads_the_key(attacker, real_home):
    home, key, token = real_home
    done = _probe(attacker, home, key, token, "--home", "real")
    out = done.stdout + done.stderr
    assert "abs=0" in done.stdout and "home=0" in done.stdout and "proc-root=0" in done.stdout, out
    assert "fetch-leaks=1" in done.stdout, out  # the escalated git (default rule git-network) read it too


def _private_homes(uid: int) -> set[str]:
    """The private HOMEs (``/tmp/execgate-home-*``) owned by ``uid`` now."""
    found = set()
    for name in os.listdir("/tmp"):
        try:
            if name.startswith("execgate-home-") and os.stat(os.path.join("/tmp", name)).st_uid == uid:
                found.add(name)
        except FileNotFoundError:
            pass
    return found


def test_workdir_at_or_above_the_real_home_is_refused(attacker):
    # HOME is a stand-in under /var/tmp (so that an ancestor of it is no system directory).
    top = Path(tempfile.mkdtemp(prefix="eg-homeup-", dir="/var/tmp"))
    try:
        home = top / "users" / attacker.name
        (home / ".ssh").mkdir(parents=True)
        (home / "project").mkdir()
        token = f"PRIVATE-{uuid.uuid4().hex}"
        (home / ".ssh" / "id_eg").write_text(token + "\n")
        for dirpath, dirnames, filenames in os.walk(top):
            for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
                os.chown(name, attacker.uid, attacker.gid)
        script = f"cat {home}/.ssh/id_eg; touch {home}/pwned; echo ran"
        homes_before = _private_homes(attacker.uid)
        for cwd in (home, top / "users", top):
            done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--cwd", str(cwd), "--", script,
                                     cwd=attacker.workdir(), env={"HOME": str(home)})
            out = done.stdout + done.stderr
            assert done.returncode == 2 and "--home real" in done.stderr, out
            assert len(done.stderr.strip().splitlines()) == 1, out  # one clear line
            assert "ran" not in done.stdout and token not in out and not (home / "pwned").exists(), out
        assert _private_homes(attacker.uid) <= homes_before  # the refused runs left no private HOME behind
        # A project below HOME is fine, the real HOME still hidden; --home real works there on purpose.
        done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--cwd", str(home / "project"), "--", script,
                                 cwd=attacker.workdir(), env={"HOME": str(home)})
        assert "ran" in done.stdout and token not in done.stdout + done.stderr, done.stdout + done.stderr
        assert not (home / "pwned").exists()
        done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--home", "real", "--cwd", str(home), "--",
                                 "pwd", cwd=attacker.workdir(), env={"HOME": str(home)})
        assert done.returncode == 0 and done.stdout.strip() == str(home), done.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)
