"""Red team (2026-12-02, after 8ede036): ways around ``_protect`` that leave the protected files
read-only but put other files where execgate will look for them next time.

* ``--home DIR`` holding the working directory (``--home real`` with ``--cwd ~/proj`` is the
  everyday case): the working directory is then nested in another writable root, so it is no
  mount point of its own, and ``_protect`` binds nothing between it and ``.venv`` (or ``logs``):
  the session renames the whole working directory away and builds a new one (a venv with a .pth
  of its own, a fake audit log) at the same path.
* the virtualenv running execgate reached through a symlink (``.venv -> venv-real``): the
  resolved directory is bound read-only, the link itself lies in the writable root and is
  replaced (``sys.prefix`` is the link's path: the next start goes through the new link).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from execgate.server.sandbox import own_package_dirs

pytestmark = pytest.mark.e2e


def _venv(where: Path) -> Path:
    """A virtualenv at ``where`` that holds a copy of execgate (the clone's ``.venv``); its
    site-packages returned."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site = next((where / "lib").glob("python3*/site-packages"))
    (site / "execgate-under-test.pth").write_text(os.path.dirname(own_package_dirs()[0]) + "\n")
    shutil.copytree(own_package_dirs()[0], site / "execgate", symlinks=True)
    return site


def _own(top: Path, who) -> None:
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
            os.lchown(name, who.uid, who.gid)


def test_venv_in_a_working_directory_inside_the_session_home_cannot_be_moved_away(attacker):
    top = Path(tempfile.mkdtemp(prefix="eg-rth-", dir="/var/tmp"))
    try:
        work = top / "proj"
        work.mkdir()
        site = _venv(work / ".venv")
        _own(top, attacker)
        rel_site = os.path.relpath(site, work)
        script = (f"mv {work} {top}/proj.old; echo mvW=$?; mkdir {work} && cp -a {top}/proj.old/.venv {work}/.venv "
                  f"&& echo 'import os; os.system(\"touch {top}/pwned\")' > {work}/{rel_site}/evil.pth; echo made=$?")
        python = str(work / ".venv" / "bin" / "python")
        done = attacker.run([python, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "bwrap",
                             "--home", str(top), "--cwd", str(work), "--", script], cwd=work)
        out = done.stdout + done.stderr
        assert "mvW=" in done.stdout, out
        # The next start of execgate from the same virtualenv path.
        attacker.run([python, "-c", "pass"], cwd="/")
        assert not (top / "pwned").exists(), out
        assert "mvW=0" not in done.stdout, out
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_audit_log_in_a_working_directory_inside_the_session_home_cannot_be_replaced(attacker):
    top = Path(tempfile.mkdtemp(prefix="eg-rth-", dir="/var/tmp"))
    try:
        work = top / "proj"
        (work / "logs").mkdir(parents=True)
        _own(top, attacker)
        log = work / "logs" / "a.jsonl"
        script = (f"mv {work} {top}/proj.old; echo mvW=$?; mkdir -p {work}/logs && echo '{{\"forged\": true}}' > {log}; "
                  f"echo made=$?; ln {log} {work}/hard 2>/dev/null; echo link=$?")
        done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--home", str(top), "--cwd", str(work),
                                 "--audit-log", str(log), "--", script, cwd=work)
        out = done.stdout + done.stderr
        assert "mvW=" in done.stdout, out
        assert "forged" not in log.read_text(), out
        assert "mvW=0" not in done.stdout, out
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_venv_reached_through_a_symlink_in_the_working_directory_cannot_be_redirected(attacker):
    top = Path(tempfile.mkdtemp(prefix="eg-rts-", dir="/var/tmp"))
    try:
        site = _venv(top / "venv-real")
        (top / ".venv").symlink_to("venv-real")
        _own(top, attacker)
        rel_site = os.path.relpath(site, top / "venv-real")
        script = (f"rm {top}/.venv; echo rm=$?; cp -a {top}/venv-real {top}/v2 && "
                  f"echo 'import os; os.system(\"touch {top}/pwned\")' > {top}/v2/{rel_site}/evil.pth && "
                  f"ln -s v2 {top}/.venv; echo made=$?")
        python = str(top / ".venv" / "bin" / "python")
        done = attacker.run([python, "-m", "execgate.server.cli", "run", "-q", "--sandbox", "bwrap",
                             "--cwd", str(top), "--", script], cwd=top)
        out = done.stdout + done.stderr
        # Refused at start since 2026-12-02 (the link could not be kept in place), naming the real path.
        assert done.returncode == 2 and "is reached through the symlink" in done.stderr, out
        assert "rm=" not in done.stdout and "venv-real" in done.stderr, out
        attacker.run([python, "-c", "pass"], cwd="/")  # the next start, through the same path
        assert not (top / "pwned").exists(), out
        assert os.readlink(top / ".venv") == "venv-real", out
    finally:
        shutil.rmtree(top, ignore_errors=True)
