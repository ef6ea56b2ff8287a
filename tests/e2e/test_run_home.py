"""The everyday loop under ``execgate run --sandbox bwrap`` and the default rules (issue #12 item 6):
a private writable HOME with caches (``--home``), ``git config --global`` and commits, a venv,
escalated commands that see the session's HOME, and notes that say why a command stays in the
sandbox or which rule sandboxed an escalation that failed. No test needs the network."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from execgate.server.sandbox import bwrap_usable
from run_support import execgate, write_rules

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")]

#: Escalates ``env`` into a sandbox with network on, passing HOME and the cache directory.
ESCALATE_ENV = """
[[rule]]
id = "env-net"
program = "env"
decision = "escalate"
execution = { network = true }
justification = "a test escalation"
allow_env = ["HOME", "XDG_CACHE_HOME"]
"""


@pytest.fixture
def user_home():
    """A HOME for ``execgate run`` (outside every session root, under /var/tmp): a .gitconfig with
    an identity and a credential helper, and a key in .ssh."""
    home = Path(tempfile.mkdtemp(prefix="eg-home-", dir="/var/tmp"))
    (home / ".gitconfig").write_text('[user]\n\tname = Real Person\n\temail = real@example.org\n'
                                     '[credential]\n\thelper = store --file /var/tmp/secret-creds\n')
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "id_test").write_text("PRIVATE-KEY-of-the-user\n")
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _home_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("execgate: home: "))


def test_cache_dir_git_config_global_and_commit_work(tmp_path, user_home):
    script = ("set -e; mkdir -p ~/.cache/x; git config --global user.name Agent; git init -q -b main; "
              "echo a > a; git add a; git commit -q -m first; git log --format='%an <%ae>'; "
              'echo "HOME=$HOME"; test -d "$XDG_CACHE_HOME/x" && echo cache-ok; '
              'git config --global --get credential.helper || echo no-helper')
    done = execgate("run", "--sandbox", "bwrap", "--", script, cwd=tmp_path,
                    env={**os.environ, "HOME": str(user_home)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # The identity is the user's e-mail (seeded) with the name set inside; the helper was not copied.
    assert lines[0] == "Agent <real@example.org>"
    home = lines[1].removeprefix("HOME=")
    assert home != str(user_home) and lines[2:] == ["cache-ok", "no-helper"], done.stdout
    assert f"private {home}" in _home_line(done.stderr)
    assert not os.path.exists(home)  # removed when execgate run ended
    assert "helper = store" in (user_home / ".gitconfig").read_text()  # the user's own is untouched


def test_home_real_is_writable_and_home_dir_is_kept(tmp_path, user_home):
    done = execgate("run", "-q", "--sandbox", "bwrap", "--home", "real", "--",
                    'touch ~/made-inside && echo "HOME=$HOME"', cwd=tmp_path, env={**os.environ, "HOME": str(user_home)})
    assert done.stdout == f"HOME={user_home}\n", done.stderr
    assert (user_home / "made-inside").exists()
    kept, work = tmp_path / "agent-home", tmp_path / "work"
    work.mkdir()
    for _ in range(2):
        done = execgate("run", "-q", "--sandbox", "bwrap", "--home", str(kept), "--",
                        'echo run >> ~/.cache/runs; wc -l < ~/.cache/runs', cwd=work)
    assert done.stdout.strip() == "2", done.stderr


def test_a_venv_and_its_pip_work(tmp_path):
    done = execgate("run", "-q", "--sandbox", "bwrap", "--",
                    "python3 -m venv .venv && .venv/bin/python -m pip --version", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pip ") and str(tmp_path / ".venv") in done.stdout


def test_an_escalated_command_sees_the_session_home(tmp_path):
    rules = write_rules(tmp_path / "rules.toml", ESCALATE_ENV)
    work = tmp_path / "work"
    work.mkdir()
    script = ('echo "shell=$HOME"; env sh -c \'echo "escalated=$HOME"; mkdir "$XDG_CACHE_HOME/from-escalated"\'; '
              'test -d ~/.cache/from-escalated && echo seen-by-shell')
    done = execgate("run", "-q", "--sandbox", "bwrap", "--rules", str(rules), "--", script, cwd=work)
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("shell=/"), done.stdout + done.stderr
    assert lines[1] == lines[0].replace("shell=", "escalated=") and lines[2] == "seen-by-shell"


def test_the_default_network_rules_use_the_session_home(tmp_path):
    # git clone is escalated by the default rules (git-network); it reads the session's ~/.gitconfig.
    script = ("set -e; git config --global clone.defaultRemoteName upstream; git init -q -b main src; "
              "git -C src -c user.name=a -c user.email=a@example.org commit -q --allow-empty -m x; "
              "git clone -q src copy; git -C copy remote")
    log = tmp_path / "audit.jsonl"
    work = tmp_path / "work"
    work.mkdir()
    done = execgate("run", "-q", "--sandbox", "bwrap", "--audit-log", str(log), "--", script, cwd=work)
    assert done.stdout == "upstream\n", done.stderr
    assert '"rule_id":"git-network"' in log.read_text()


def test_an_untrusted_pip_says_which_rule_it_missed(tmp_path):
    script = ("mkdir -p venv/bin && printf '#!/bin/sh\\nexit 1\\n' > venv/bin/pip && chmod +x venv/bin/pip && "
              "venv/bin/pip install some-package; echo status=$?")
    done = execgate("run", "-q", "--sandbox", "bwrap", "--", script, cwd=tmp_path)
    assert done.stdout == "status=1\n", done.stderr
    note = next(line for line in done.stderr.splitlines() if line.startswith("execgate: note: "))
    assert f"{tmp_path}/venv/bin/pip runs in the session's sandbox without network" in note
    assert "rule pip-install would escalate it" in note
    assert f'trusted_dirs = ["{tmp_path}/venv/bin"]' in note


def test_a_failing_sandboxed_escalation_names_its_rule(tmp_path):
    rules = write_rules(tmp_path / "rules.toml", ESCALATE_ENV)
    work = tmp_path / "work"
    work.mkdir()
    done = execgate("run", "-q", "--sandbox", "bwrap", "--rules", str(rules), "--",
                    "env false; env false; echo status=$?", cwd=work)
    assert done.stdout == "status=1\n", done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("execgate: note: ")]
    assert len(notes) == 1, done.stderr  # told once per session
    assert notes[0].endswith("/env exited with status 1; rule env-net escalated it (a test escalation) in a "
                             "sandbox with network on, writable only where the session can write"), notes
