"""Attack tests as the quick start runs them (root) and as an ordinary user.

The script inside a session is hostile and reads our source; it may be root inside its sandbox.
Every trust-boundary test runs its attack for real — ``execgate run`` as a subprocess, real bwrap,
real shells — once as root and once as an unprivileged user created here (``useradd``), and judges
the outcome by a **marker**: a program that, if it ever runs, writes a file where the test looks.

Usage::

    def test_x(attacker):            # parametrised: "root" and "user"
        work = attacker.workdir()     # a directory owned by the attacker; markers are written in it
        done = attacker.execgate("run", "--sandbox", "bwrap", "--", script, cwd=work)
        assert not attacker.marker_ran("pwned")
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import pytest

#: The unprivileged account the attack tests create and run as.
ATTACK_USER = "egattack"


def ensure_user(name: str = ATTACK_USER) -> pwd.struct_passwd:
    """The account ``name``, created (with a home directory) if missing. Needs root.

    Raises:
        RuntimeError: ``useradd`` failed.
    """
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    done = subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"useradd {name} failed: {done.stderr.strip()}")
    return pwd.getpwnam(name)


def grant_traverse(user: str, path: Path) -> None:
    """Let ``user`` reach ``path``: every directory above it that others cannot search gets an ACL
    entry granting ``user`` search (x) only — e.g. ``/root`` when the interpreter lives in pyenv.

    Raises:
        RuntimeError: ``setfacl`` failed (the ``acl`` package is installed by scripts/setup.sh).
    """
    for parent in path.parents:
        if parent.stat().st_mode & 0o001:
            continue
        done = subprocess.run(["setfacl", "-m", f"u:{user}:x", str(parent)], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"setfacl on {parent} failed: {done.stderr.strip()}")


@dataclass
class Attacker:
    """Who runs the attack: ``name`` is "root" or the unprivileged account.

    Attributes:
        name: "root" or :data:`ATTACK_USER`.
        uid, gid: the account's ids.
        markers: directory where marker programs write (mode 1777). It lies inside ``base``, so
            it is writable from a session whose working directory is ``workdir()``, confined or not.
        base: the attacker's own directory under /tmp; every ``workdir()`` is made in it.
    """

    name: str
    uid: int
    gid: int
    home: str
    markers: Path
    base: Path

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def workdir(self) -> Path:
        """The attacker's working directory (``base``, owned by the attacker, removed after the
        test): a session started there can write its markers."""
        return self.base

    def marker_program(self, directory: Path, name: str) -> Path:
        """An executable ``directory/name`` that writes ``markers/name`` when it runs (and prints
        ``MARKER name RAN``). Owned by the attacker."""
        path = directory / name
        path.write_text(f"#!/bin/sh\necho ran > {self.markers / name}\necho 'MARKER {name} RAN'\n")
        path.chmod(0o755)
        os.chown(path, self.uid, self.gid)
        return path

    def static_marker(self, source: Path, name: str = "mark") -> Path:
        """``workdir()/name``: ``source`` (a C file taking ``-DMARKER="…"``) compiled *static*
        (it runs where there are no libraries, in a chroot or over a bind mount), writing
        ``markers/name`` by a path relative to the working directory. Owned by the attacker."""
        work = self.workdir()
        rel = os.path.relpath(self.markers / name, work)
        subprocess.run(["gcc", "-O1", "-static", f'-DMARKER="{rel}"', "-o", str(work / name), str(source)],
                       check=True)
        os.chown(work / name, self.uid, self.gid)
        return work / name

    def marker_ran(self, name: str) -> bool:
        """True if the marker program ``name`` ran (its file exists)."""
        return (self.markers / name).exists()

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run as this attacker (``setpriv`` to the unprivileged account; as is for root)."""
        if self.is_root:
            return list(argv)
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--", *argv]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A plain environment for the attacker (HOME, USER, PATH of this interpreter first)."""
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        env = {"PATH": path, "HOME": self.home, "USER": self.name, "LOGNAME": self.name, "LANG": "C.UTF-8"}
        env.update(extra or {})
        return env

    def run(self, argv: list[str], *, cwd: Path | str | None = None, timeout: float = 90,
            env: Mapping[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as the attacker; output captured as text."""
        return subprocess.run(self.command(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              check=False, env=self.env(env), input=stdin)

    def execgate(self, *args: str, cwd: Path | str | None = None, timeout: float = 90,
                 env: Mapping[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``execgate ARGS…`` (this interpreter's) run as the attacker."""
        return self.run([sys.executable, "-m", "execgate.server.cli", *args], cwd=cwd, timeout=timeout,
                        env=env, stdin=stdin)


@pytest.fixture(params=["root", "user"])
def attacker(request):
    """An :class:`Attacker`, once as root and once as an unprivileged account made here."""
    if os.geteuid() != 0:
        pytest.skip("attack tests create an account and switch to it: they need root")
    if request.param == "root":
        entry = pwd.getpwuid(0)
    else:
        entry = ensure_user()
        grant_traverse(entry.pw_name, Path(sys.executable).resolve())
        grant_traverse(entry.pw_name, Path(__file__).resolve())
    base = Path(tempfile.mkdtemp(prefix="eg-atk-", dir="/tmp"))
    markers = base / "markers"
    markers.mkdir(mode=0o1777)
    markers.chmod(0o1777)
    os.chown(base, entry.pw_uid, entry.pw_gid)
    who = Attacker(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir,
                   markers=markers, base=base)
    try:
        yield who
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def outside():
    """A root-owned directory outside every session root (mode 0755, under /var/tmp), removed
    afterwards: rules files live here (a session must not edit them), and files only an
    escalation or the host should reach."""
    path = Path(tempfile.mkdtemp(prefix="eg-out-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def host_tmp_file():
    """``(path, token)``: a file in the host's /tmp holding ``token``, readable by all, which no
    sandbox may see (each has a /tmp of its own)."""
    token = f"host-tmp-{uuid.uuid4().hex}"
    path = Path(f"/tmp/eg-host-{uuid.uuid4().hex[:8]}")
    path.write_text(token + "\n")
    path.chmod(0o644)
    try:
        yield path, token
    finally:
        path.unlink(missing_ok=True)


def rules_file(directory: Path, text: str) -> Path:
    """``directory/rules.toml`` holding ``text``, mode 0644."""
    path = directory / "rules.toml"
    path.write_text(text)
    path.chmod(0o644)
    return path


#: A rules file escalating ``dash`` into a sandbox profile (network on): every ``dash -c`` a test
#: runs in a session is then an escalated bwrap that the policy service prepared.
ESCALATE_DASH = """
default = "run"

[[rule]]
id = "dash-escalated"
program = "dash"
decision = "escalate"
execution = { network = true }
"""


def deny_by_default_rules() -> str:
    """Rules that deny whatever they do not name: this interpreter and ``/usr/bin/true`` run, a
    program named ``mark`` is denied with "the marker must never run"."""
    return f"""
default = "deny"

[[rule]]
id = "python"
program = "{sys.executable}"
decision = "run"

[[rule]]
id = "true"
program = "/usr/bin/true"
decision = "run"

[[rule]]
id = "no-mark"
program = "mark"
decision = "deny"
justification = "the marker must never run"
"""


def gated_run(attacker: Attacker, rules: str, script: str, *extra: str,
              sandbox: str = "none") -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """``execgate run --seccomp on`` of ``script`` as ``attacker``, in its working directory, with
    ``rules`` written there and an audit log; returns the result and the audit records."""
    work = attacker.workdir()
    (work / "rules.toml").write_text(rules)
    audit = work / "audit.jsonl"
    if not attacker.is_root:
        grant_traverse(attacker.name, Path(sys.executable).resolve())
    done = attacker.execgate("run", "-q", "--sandbox", sandbox, "--seccomp", "on", "--rules", str(work / "rules.toml"),
                             "--audit-log", str(audit), "--cwd", str(work), *extra, "--", script, cwd=work)
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return done, records


def sandboxed_run(attacker: Attacker, rules: str, script: str) -> subprocess.CompletedProcess[str]:
    """``execgate run --sandbox bwrap`` of ``script`` as ``attacker``, in its working directory,
    with ``rules`` written there (added to the default rules)."""
    work = attacker.workdir()
    (work / "rules.toml").write_text(rules)
    return attacker.execgate("run", "--sandbox", "bwrap", "--rules", str(work / "rules.toml"), "--cwd", str(work),
                             "--", script, cwd=work)


def approved_after(attacker: Attacker, script: str, wait_s: float) -> tuple[str, str, str]:
    """``execgate run --sandbox bwrap --approver-wait 30`` of ``script`` as ``attacker``, in its
    working directory with the ``rules.toml`` there; an ``execgate approve`` (named "person",
    from the command line the run prints) answers ``y`` to the first question ``wait_s`` seconds
    after it starts — a person reading it. Returns the run's stdout and stderr and what the
    approver showed."""
    work = attacker.workdir()
    cli = (sys.executable, "-m", "execgate.server.cli")
    run = subprocess.Popen(
        attacker.command([*cli, "run", "-q", "--sandbox", "bwrap", "--rules", str(work / "rules.toml"),
                          "--approver-wait", "30", "--cwd", str(work), "--", script]),
        cwd=work, env=attacker.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    approver = None
    try:
        assert run.stderr is not None
        line = run.stderr.readline()
        prefix = "execgate: approvals: execgate approve "
        assert line.startswith(prefix), line
        words = line[len(prefix):].split()
        approver = subprocess.Popen([*cli, "approve", "--policy", words[1], "--token-file", words[3],
                                     "--name", "person"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert approver.stdin is not None
        time.sleep(wait_s)
        approver.stdin.write("y\n")
        approver.stdin.flush()
        out, err = run.communicate(timeout=60)
        try:
            shown, _ = approver.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            approver.kill()
            shown, _ = approver.communicate()
    finally:
        for proc in (approver, run):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    return out, err, shown
