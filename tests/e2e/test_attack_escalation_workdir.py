"""Attack (red team A): an unsandboxed escalation started in a directory that, outside the sandbox,
is another one than the session's (docs/DESIGN.md §8 Escalation; README ``--sandbox``: "An
*unsandboxed* escalation from there is refused with a reason (it would run on the host, where
``/tmp`` is the host's)").

The escalated command's working directory is the request's ``workdir`` string, checked lexically
(``_stranded_workdir``: under a session root, or outside ``/tmp``, ``/run``, ``/dev``, ``/proc``)
and never against the caller's real working directory:

* (a) the session makes a symlink ``link -> /tmp/D`` in its working directory and sends a request
  (its own execve wrapper, ``os.getcwdb`` patched) naming ``WORK/link`` as its workdir: the path
  is lexically in a writable root, so the unsandboxed ``ls`` runs in the **host's** ``/tmp/D``
  (the honest request from ``/tmp/D`` is refused: the control). The approver of a prompt would see
  ``cwd: WORK/link``;
* (b) no forging at all: the session ``cd``\\ s into the attacker's HOME, an empty tmpfs in the
  sandbox (the real HOME is hidden, README ``--home``); the unsandboxed escalation runs in the
  real HOME and lists it.

The escalation must be refused (as it is from ``/tmp/D`` and ``/run``), or run where the session is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from attack_support import Attacker, sandboxed_run

pytestmark = pytest.mark.e2e

LS = shutil.which("ls") or "/usr/bin/ls"

RULES = f"""
[[rule]]
id = "ls-outside"
program = "{LS}"
decision = "escalate"
execution = "unsandboxed"
justification = "stands for any escalated command that works in its working directory"
"""

FORGE = ("import os, sys; fake = sys.argv[1].encode(); os.getcwdb = lambda: fake; "
         "from execgate.wrapper.client import main; sys.argv = ['wrapper'] + sys.argv[2:]; sys.exit(main())")


def _run(attacker: Attacker, script: str) -> subprocess.CompletedProcess[str]:
    return sandboxed_run(attacker, RULES, script)


@pytest.fixture
def host_tmp_dir():
    """A directory in the host's /tmp holding a file ``HOSTFILE-<hex>``; (path, file name)."""
    name = f"HOSTFILE-{uuid.uuid4().hex[:8]}"
    path = Path(f"/tmp/eg-hostdir-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o755)
    (path / name).write_text("host\n")
    try:
        yield path, name
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_symlinked_workdir_cannot_start_an_unsandboxed_escalation_in_the_hosts_tmp(
        attacker: Attacker, host_tmp_dir) -> None:
    hostdir, hostfile = host_tmp_dir
    work = attacker.workdir()
    script = (f"mkdir -p {hostdir} && touch {hostdir}/SESSIONFILE && ln -sfn {hostdir} link && "
              f"(cd link && {LS}; echo \"honest=$?\"); "
              f"{sys.executable} -c \"{FORGE}\" {work}/link {LS} ls; echo \"forged=$?\"; "
              f"touch WORKFILE; {LS}; echo \"plain=$?\"")
    done = _run(attacker, script)
    out = done.stdout + done.stderr
    # Control: the honest request (getcwd: /tmp/…, the session's private /tmp) is refused.
    assert "honest=1" in done.stdout and "lies in this session's private /tmp" in done.stderr, out
    # The forged request is refused by the server: the path is not the caller's directory.
    assert "forged=1" in done.stdout and "is another directory than the one the caller is in" in done.stderr, out
    # And an escalation from the working directory itself runs there (started by its fd).
    assert "plain=0" in done.stdout and "WORKFILE" in done.stdout, out
    assert hostfile not in done.stdout, (
        f"the escalated ls ran in the host's {hostdir} for a request naming {work}/link:\n{out}")


def test_the_hidden_home_is_not_where_an_unsandboxed_escalation_runs(attacker: Attacker) -> None:
    secret = f"eg-hidden-{uuid.uuid4().hex[:8]}"
    real = Path(attacker.home) / secret
    real.write_text("in the real HOME\n")
    try:
        done = _run(attacker, f"cd {attacker.home} && echo \"inside: $(echo *)\"; {LS}; echo \"ls=$?\"")
    finally:
        real.unlink(missing_ok=True)
    out = done.stdout + done.stderr
    assert "inside: *" in done.stdout, out  # the session sees an empty HOME
    assert "ls=1" in done.stdout and "the empty directory in place of your hidden HOME" in done.stderr, out
    assert secret not in done.stdout, f"the escalated ls listed the hidden real HOME {attacker.home}:\n{out}"


def test_a_symlink_cannot_name_the_directory_an_escalation_runs_in(attacker: Attacker) -> None:
    """(Red team C of 2026-12-02.) The session makes ``build -> /``, ``cd /`` (the sandbox's
    read-only root: the host's ``/``, the same inode) and sends a request naming ``WORK/build``:
    the first version of the check compared inodes only, and the unsandboxed ``ls`` ran in ``/``
    while the audit log (and a prompt) said ``WORK/build``. Now refused, naming the real path;
    the audit log records the decision for the name asked, and nothing ran."""
    work = attacker.workdir()
    audit = work / "logs" / "audit.jsonl"
    audit.parent.mkdir()
    audit.parent.chmod(0o777)
    (work / "rules.toml").write_text(RULES)
    script = (f"ln -s / build && cd / && {sys.executable} -c \"{FORGE}\" {work}/build {LS} ls -d etc proc; "
              "echo \"forged=$?\"")
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--rules", str(work / "rules.toml"),
                             "--audit-log", str(audit), "--cwd", str(work), "--", script, cwd=work)
    out = done.stdout + done.stderr
    assert "forged=1" in done.stdout and "etc" not in done.stdout.split(), out
    assert f"the working directory {work}/build names the caller's directory through a symlink; its real path is /" \
        in done.stderr, out


TOUCH_RULES = f"""
[[rule]]
id = "touch-outside"
program = "{shutil.which("touch") or "/usr/bin/touch"}"
decision = "escalate"
execution = "unsandboxed"
justification = "writes where the host lets it"
"""


def test_an_unsandboxed_escalation_works_in_the_hosts_view_of_its_directory(attacker: Attacker) -> None:
    """Not an attack: the working directory an unsandboxed escalation starts in is the host's
    mount of it, not the sandbox's (a directory read-only inside, writable on the host: a
    relative write of the escalated command lands there), though it was checked against the
    caller's own (red team C of 2026-12-02 found the first version of the check starting it in
    the sandbox's read-only mount: EROFS)."""
    place = Path(f"/var/tmp/eg-rel-{uuid.uuid4().hex[:8]}")
    place.mkdir()
    place.chmod(0o777)
    try:
        done = sandboxed_run(attacker, TOUCH_RULES, f"cd {place} && touch rel; echo \"rel=$?\"")
        out = done.stdout + done.stderr
        assert "rel=0" in done.stdout and (place / "rel").exists(), out
    finally:
        shutil.rmtree(place, ignore_errors=True)
