"""Agent work under ``execgate run`` and the shipped rules, for real (issue #12 items 3 and 8): real
bwrap, real git, npm, go, ssh and man, as root and as an unprivileged account (the ``attacker``
fixture), in both sandbox modes where it applies.

- ``--sandbox none``: an escalated command gets no less than the unconfined shell (docs/DESIGN.md
  §7): ``git pull ../a`` from a sibling repository, ``npm install`` and ``go mod download``
  writing the caches under the user's real HOME;
- a ``GIT_SSH``/``GIT_SSH_COMMAND`` the caller set is withheld from an escalated git, saying so
  (``execgate: note:``), and the shipped git rules' own ssh fails fast on an unreachable host;
- ``man -P cat ls`` prints the page under the default settings (man-db sandboxes its helpers with
  seccomp of its own; README Limits for ``--seccomp off``);
- without a terminal and without ``--approver-wait`` a prompt's denial says how to answer one.

No test needs the network: the dependencies are local (a ``file:`` tarball, a ``file://`` Go
module proxy) and the ssh address is one that nothing answers.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from attack_support import Attacker
from execgate.server.sandbox import bwrap_usable
from run_support import audit_records

pytestmark = pytest.mark.e2e

BWRAP = pytest.mark.skipif(bwrap_usable() is not None, reason=f"bwrap unusable: {bwrap_usable()}")
SANDBOXES = [pytest.param("bwrap", marks=BWRAP), "none"]


def _own(attacker: Attacker, *paths: Path) -> None:
    """Give ``paths`` (recursively) to the attacker."""
    for top in paths:
        for root, dirs, files in os.walk(top):
            for name in (root, *(os.path.join(root, n) for n in (*dirs, *files))):
                os.lchown(name, attacker.uid, attacker.gid)


def _decisions(log: Path, program: str) -> list[tuple[str, str]]:
    """(decision, rule id) of every audited exec of ``program`` (an absolute path)."""
    return [(r["decision"], r["rule_id"]) for r in audit_records(log) if r["program"] == program]


def _notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("execgate: note: ")]


def _shipped_rule_applies(attacker: Attacker, sandbox: str) -> bool:
    """In an unsandboxed root session nothing is trusted for a basename rule (root can write
    /usr/bin): the shipped rules' escalations do not apply there, the program just runs."""
    return not (attacker.is_root and sandbox == "none")


# ---------------------------------------------------------------- item 8c: git pull ../a


GIT_PULL_RULE = """
[[rule]]
id = "git-pull-net"
program = "/usr/bin/git"
prefix = ["pull"]
decision = "escalate"
execution = { network = true }
justification = "git pull talks to remotes"
"""


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_git_pull_from_a_sibling_repository_works_escalated(attacker: Attacker, sandbox: str) -> None:
    """The repro of issue #12 item 8c: in ``b``, ``../a`` is a repository the shell sees; the
    escalated ``git pull ../a`` (a network profile) must see it too. Without a sandbox the session
    is ``b`` itself (``../a`` lies outside it); with bwrap the session holds both."""
    base = attacker.workdir()
    ident = ["-c", "user.name=a", "-c", "user.email=a@example.org"]
    for argv in (["git", "init", "-q", "-b", "main", "a"], ["git", "-C", "a", *ident, "commit", "-q",
                 "--allow-empty", "-m", "one"], ["git", "clone", "-q", "a", "b"],
                 ["git", "-C", "a", *ident, "commit", "-q", "--allow-empty", "-m", "two"]):
        done = attacker.run(argv, cwd=base)
        assert done.returncode == 0, done.stderr
    rules = base / "rules.toml"
    rules.write_text(GIT_PULL_RULE)
    log = base / "audit.jsonl"
    cwd, go_to_b = (base / "b", "") if sandbox == "none" else (base, "cd b && ")
    done = attacker.execgate("run", "-q", "--sandbox", sandbox, "--rules", str(rules), "--audit-log", str(log),
                             "--cwd", str(cwd), "--",
                             f'{go_to_b}test -d ../a/.git && echo shell-sees-a; git pull -q --ff-only ../a; '
                             'echo "status=$?"; git log -1 --format=%s')
    assert done.stdout == "shell-sees-a\nstatus=0\ntwo\n", done.stdout + done.stderr
    pulls = [(r["decision"], r["rule_id"]) for r in audit_records(log) if r["argv"][1:2] == ["pull"]]
    assert pulls == [("escalate", "git-pull-net")]
    assert "does not appear to be a git repository" not in done.stderr


# ---------------------------------------------------------------- item 8d: npm install, go caches


def _npm_project(attacker: Attacker) -> tuple[Path, Path]:
    """A project dir holding ``dep-1.0.0.tgz`` (an npm tarball) and ``app/`` depending on it by
    ``file:``, and a HOME for an unconfined session; both the attacker's."""
    project, home = attacker.workdir() / "proj", attacker.workdir() / "home"
    (project / "app").mkdir(parents=True)
    home.mkdir()
    with tarfile.open(project / "dep-1.0.0.tgz", "w:gz") as tar:
        for name, text in (("package.json", '{"name": "dep", "version": "1.0.0", "main": "index.js"}\n'),
                           ("index.js", "module.exports = 42;\n")):
            data = text.encode()
            info = tarfile.TarInfo(f"package/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    (project / "app" / "package.json").write_text(json.dumps(
        {"name": "app", "version": "1.0.0", "dependencies": {"dep": "file:../dep-1.0.0.tgz"}}))
    _own(attacker, project, home)
    return project, home


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed (scripts/setup.sh installs it)")
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_npm_install_writes_its_cache_under_the_node_install_rule(attacker: Attacker, sandbox: str) -> None:
    """Issue #12 item 8d: the shipped ``node-install`` rule escalates ``npm install`` with network;
    the escalation must write npm's cache (``~/.npm``) where the session's HOME is: the private
    one under bwrap, the user's real one without a sandbox (it hit EROFS there)."""
    project, home = _npm_project(attacker)
    log = attacker.workdir() / "audit.jsonl"
    script = ("cd app && npm install --offline --no-audit --no-fund >&2; echo \"status=$?\"; "
              "node -p 'require(\"dep\")'; ls \"${npm_config_cache:-$HOME/.npm}/_cacache\" | sort")
    done = attacker.execgate("run", "-q", "--sandbox", sandbox, "--audit-log", str(log), "--cwd", str(project),
                             "--", script, env={"HOME": str(home), "npm_config_update_notifier": "false"},
                             timeout=110)
    assert done.stdout.splitlines()[:3] == ["status=0", "42", "content-v2"], done.stdout + done.stderr
    assert "EROFS" not in done.stderr and "Log files were not written" not in done.stderr, done.stderr
    installs = [d for d in audit_records(log) if d["argv"][:2] == ["npm", "install"]]
    expected = ("escalate", "node-install") if _shipped_rule_applies(attacker, sandbox) else ("run", "")
    assert [(d["decision"], d["rule_id"]) for d in installs] == [expected], installs
    if sandbox == "none":  # the user's real HOME (here: the HOME it was started with) holds the cache
        assert (home / ".npm" / "_cacache" / "content-v2").is_dir()


def _go_proxy(root: Path) -> str:
    """A ``file://`` Go module proxy under ``root`` serving ``example.org/m v1.0.0``."""
    versions = root / "example.org" / "m" / "@v"
    versions.mkdir(parents=True)
    (versions / "list").write_text("v1.0.0\n")
    (versions / "v1.0.0.info").write_text('{"Version":"v1.0.0","Time":"2024-01-01T00:00:00Z"}\n')
    (versions / "v1.0.0.mod").write_text("module example.org/m\n")
    with zipfile.ZipFile(versions / "v1.0.0.zip", "w") as zf:
        zf.writestr("example.org/m@v1.0.0/go.mod", "module example.org/m\n")
        zf.writestr("example.org/m@v1.0.0/m.go", "package m\n\nconst Answer = 42\n")
    return f"file://{root}"


@pytest.mark.skipif(not os.path.exists("/usr/bin/go"), reason="Go is not installed (scripts/setup.sh installs it)")
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_go_mod_download_writes_the_module_cache_under_the_go_rules(attacker: Attacker, sandbox: str) -> None:
    """The Go cache rules the same way: ``go mod download`` (shipped ``go-mod-network``) fills
    ``$GOPATH/pkg/mod`` in the session's HOME, from a local ``file://`` proxy."""
    project, home = attacker.workdir() / "proj", attacker.workdir() / "home"
    (project / "app").mkdir(parents=True)
    home.mkdir()
    proxy = _go_proxy(project / "proxy")
    (project / "app" / "go.mod").write_text("module app\n\ngo 1.19\n\nrequire example.org/m v1.0.0\n")
    _own(attacker, project, home)
    log = attacker.workdir() / "audit.jsonl"
    script = ('cd app && go mod download example.org/m; echo "status=$?"; '
              'ls "$(go env GOMODCACHE)/example.org/m@v1.0.0"')
    done = attacker.execgate("run", "-q", "--sandbox", sandbox, "--audit-log", str(log), "--cwd", str(project),
                             "--", script, env={"HOME": str(home), "GOPROXY": proxy, "GONOSUMDB": "example.org",
                                                "GOFLAGS": "-mod=mod"}, timeout=110)
    assert done.stdout == "status=0\ngo.mod\nm.go\n", done.stdout + done.stderr
    downloads = [d for d in audit_records(log) if d["argv"][1:3] == ["mod", "download"]]
    expected = ("escalate", "go-mod-network") if _shipped_rule_applies(attacker, sandbox) else ("run", "")
    assert [(d["decision"], d["rule_id"]) for d in downloads] == [expected], downloads
    if sandbox == "none":
        assert (home / "go" / "pkg" / "mod" / "example.org" / "m@v1.0.0" / "m.go").is_file()


# ---------------------------------------------------------------- item 8e: GIT_SSH, GIT_SSH_COMMAND

#: An address nothing answers (TEST-NET-like private space): ssh either gets no route or waits.
UNREACHABLE = "10.255.255.1"


@pytest.mark.skipif(shutil.which("ssh") is None, reason="ssh is not installed (scripts/setup.sh installs it)")
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_withheld_git_ssh_variables_are_named_and_ssh_fails_fast(attacker: Attacker, sandbox: str) -> None:
    """An escalated git gets neither the caller's ``GIT_SSH_COMMAND`` nor ``GIT_SSH`` (they would
    run the caller's command with the rule's network); the caller is told, and the shipped rule's
    own ssh (BatchMode, 10 s to connect) ends an unreachable ``ls-remote`` with an error, never a
    silent hang."""
    work = attacker.workdir()
    log = work / "audit.jsonl"
    if not _shipped_rule_applies(attacker, sandbox):
        # In an unsandboxed root session no basename rule applies: git runs where it was asked,
        # unescalated (with the caller's own environment, as without execgate).
        done = attacker.execgate("run", "-q", "--sandbox", sandbox, "--audit-log", str(log), "--cwd", str(work),
                                 "--", "git --version")
        assert done.stdout.startswith("git version"), done.stdout + done.stderr
        assert [d for d, _ in _decisions(log, "/usr/bin/git")] == ["run"], audit_records(log)
        return
    script = (f'GIT_SSH_COMMAND="echo FAKE; false" git ls-remote ssh://git@{UNREACHABLE}/x.git; echo "status=$?"; '
              f'GIT_SSH=/bin/false git ls-remote git@{UNREACHABLE}:x.git; echo "status=$?"')
    started = time.monotonic()
    done = attacker.execgate("run", "-q", "--sandbox", sandbox, "--audit-log", str(log), "--cwd", str(work),
                             "--timeout", "90", "--", script, timeout=110)
    elapsed = time.monotonic() - started
    assert done.stdout == "status=128\nstatus=128\n", done.stdout + done.stderr
    assert elapsed < 60, f"git ls-remote took {elapsed:.0f} s"
    assert "FAKE" not in done.stdout + done.stderr
    assert _decisions(log, "/usr/bin/git") == [("escalate", "git-network")] * 2
    notes = _notes(done.stderr)
    first = next(n for n in notes if "GIT_SSH_COMMAND='ssh" in n)
    assert "/usr/bin/git runs escalated (rule git-network) without your GIT_SSH_COMMAND" in first
    assert "GIT_SSH_COMMAND='ssh -o BatchMode=yes -o ConnectTimeout=10' is the rule's own" in first
    assert "allow_env" in first and "examples/README.md" in first
    assert any("without your GIT_SSH," in n or "without your GIT_SSH:" in n for n in notes), notes
    # ssh ran and failed on its own terms, saying so.
    assert "Could not read from remote repository" in done.stderr


# ---------------------------------------------------------------- item 8g: man


def _man_page_present() -> bool:
    if shutil.which("man") is None:
        return False
    found = subprocess.run(["man", "-w", "ls"], capture_output=True, text=True, check=False, timeout=30)
    return found.returncode == 0


@pytest.mark.skipif(not _man_page_present(), reason="man or the ls page is missing (scripts/setup.sh installs man-db)")
def test_man_prints_the_page_under_the_default_settings(attacker: Attacker) -> None:
    """man-db runs its helpers (groff, col, …) under a seccomp filter of its own that refuses
    sockets; with the backstop on (the default) man-db sees a filter in force and loads none, so
    every exec still reaches the gate and the page prints. With ``--seccomp off`` its filter would
    keep the helpers from reaching the gate (README Limits); ``MAN_DISABLE_SECCOMP=1`` is the
    documented way out there."""
    work = attacker.workdir()
    done = attacker.execgate("run", "-q", "--cwd", str(work), "--", "man -P cat ls", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ls - list directory contents" in done.stdout, done.stdout[:500] + done.stderr
    off = attacker.execgate("run", "-q", "--seccomp", "off", "--cwd", str(work), "--",
                            "MAN_DISABLE_SECCOMP=1 man -P cat ls", timeout=60)
    assert off.returncode == 0 and "ls - list directory contents" in off.stdout, off.stderr


# ---------------------------------------------------------------- item 3: prompts without a terminal


PROMPT_RULE = """
[[rule]]
id = "ask-marker"
program = "{marker}"
decision = "prompt"
execution = "session_default"
justification = "the marker needs a person"
"""


@BWRAP
def test_a_prompt_without_a_terminal_says_how_to_answer_it(attacker: Attacker) -> None:
    """Stdin a pipe, no ``--approver-wait``: no approver can ever answer, and the denial says how
    to get one (a terminal, or ``--approver-wait`` with ``execgate approve``)."""
    work = attacker.workdir()
    marker = attacker.marker_program(work, "asked")
    rules = work / "rules.toml"
    rules.write_text(PROMPT_RULE.format(marker=marker))
    done = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--rules", str(rules), "--cwd", str(work), "--",
                             './asked; echo "status=$?"', stdin="")
    assert done.stdout == "status=1\n", done.stdout + done.stderr
    assert not attacker.marker_ran("asked")
    denial = next(line for line in done.stderr.splitlines() if line.startswith("Execution denied: "))
    assert "no approver can answer it" in denial and "run it at a terminal" in denial
    assert "--approver-wait SECONDS" in denial and "execgate approve" in denial
    # With --approver-wait the endpoint is there: the prompt waits for an approver instead.
    waited = attacker.execgate("run", "-q", "--sandbox", "bwrap", "--approver-wait", "1", "--rules", str(rules),
                               "--cwd", str(work), "--", './asked; echo "status=$?"', stdin="")
    assert waited.stdout == "status=1\n" and "execgate approve --policy" in waited.stderr, waited.stderr
    assert "no approver can answer it" not in waited.stderr and not attacker.marker_ran("asked")
