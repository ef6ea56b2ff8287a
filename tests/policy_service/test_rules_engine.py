"""Rules engine evaluation: decisions, strictest wins, alternatives, defaults and path trust."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from execgate.policy_service.rules import DEFAULT_RULES_PATH, RuleSet, RulesError
from execgate.server.policy import Execution, Permissions
from identity_support import system_facts, system_identity

RULES = """
[[rule]]
id = "git-net"
program = "git"
prefix = [["push", "fetch"]]
decision = "escalate"
execution = { network = true, writable_roots = ["/var/cache/x"] }
allow_env = ["SSH_AUTH_SOCK"]
match = ["git push origin", "git fetch"]
not_match = ["git status"]

[[rule]]
id = "git-force"
program = "git"
prefix = ["push", ["-f", "--force"]]
decision = "deny"
justification = "no force pushes"
match = ["git push -f", "git push --force origin"]
not_match = ["git push origin"]

[[rule]]
id = "git-push-review"
program = "git"
prefix = ["push", "upstream"]
decision = "prompt"
match = ["git push upstream main"]

[[rule]]
id = "git-push-sandboxed"
program = "git"
prefix = ["push", "local"]
decision = "run"
match = ["git push local"]

[[rule]]
id = "ls-abs"
program = "/opt/tools/ls"
decision = "escalate"
execution = "session_default"
match = ["/opt/tools/ls -l"]
not_match = ["ls -l", "/usr/bin/ls"]

[[rule]]
id = "no-sudo"
program = ["sudo", "doas"]
decision = "deny"
match = ["sudo id", "doas sh"]
"""


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    path = tmp_path / "t.toml"
    path.write_text(RULES)
    return RuleSet.load([path])


@pytest.mark.parametrize(
    ("program", "argv", "decision", "rule_id", "n_matched"),
    [
        # alternatives in a token
        ("/usr/bin/git", ["git", "push", "origin"], "escalate", "git-net", 1),
        ("/usr/bin/git", ["git", "fetch"], "escalate", "git-net", 1),
        ("/usr/bin/git", ["git", "status"], "run", None, 0),
        ("/usr/bin/git", ["git"], "run", None, 0),
        # strictest wins: deny > prompt > run > escalate
        ("/usr/bin/git", ["git", "push", "--force"], "deny", "git-force", 2),
        ("/usr/bin/git", ["git", "push", "upstream", "main"], "prompt", "git-push-review", 2),
        ("/usr/bin/git", ["git", "push", "local"], "run", "git-push-sandboxed", 2),
        # absolute-path rule matches only that path
        ("/opt/tools/ls", ["ls", "-l"], "escalate", "ls-abs", 1),
        ("/usr/bin/ls", ["ls", "-l"], "run", None, 0),
        # program alternatives
        ("/usr/bin/sudo", ["sudo", "id"], "deny", "no-sudo", 1),
        ("/usr/bin/doas", ["doas", "sh"], "deny", "no-sudo", 1),
        # untrusted paths: no escalation borrowed, no denial dodged
        ("/tmp/x/git", ["git", "push", "origin"], "run", None, 0),
        ("/tmp/x/git", ["git", "push", "-f"], "deny", "git-force", 1),
        ("/tmp/x/git", ["git", "push", "upstream"], "prompt", "git-push-review", 1),
        ("/tmp/x/sudo", ["sudo", "id"], "deny", "no-sudo", 1),
        ("/home/u/bin/sudo", ["sudo"], "deny", "no-sudo", 1),
        # argv[0] naming a denied program is denied whatever the file is called
        ("/usr/bin/busybox", ["sudo", "id"], "deny", "no-sudo", 1),
        # lexical normalization: the server sends absolute paths, possibly with ..
        ("/tmp/x/../../usr/bin/git", ["git", "fetch"], "escalate", "git-net", 1),
    ],
)
def test_evaluate(rules, program, argv, decision, rule_id, n_matched):
    ev = rules.evaluate(program, argv, system_facts(program))
    assert ev.decision == decision
    assert (ev.rule.id if ev.rule else None) == rule_id
    assert len(ev.matched) == n_matched


def test_escalation_carries_execution_and_allow_env(rules):
    ev = rules.evaluate("/usr/bin/git", ["git", "push"], system_facts("/usr/bin/git"))
    assert ev.execution == Execution("permissions", Permissions(True, ("/var/cache/x",), ()))
    assert ev.allow_env == ("SSH_AUTH_SOCK",)
    assert "git-net" in ev.reason
    ev = rules.evaluate("/opt/tools/ls", ["ls"], system_facts("/opt/tools/ls"))
    assert ev.execution == Execution("session_default")


def test_prompt_defaults_to_unsandboxed_and_deny_has_none(rules):
    assert rules.evaluate("/usr/bin/git", ["git", "push", "upstream"]).execution == Execution()
    denied = rules.evaluate("/usr/bin/git", ["git", "push", "-f"])
    assert denied.execution is None
    assert denied.reason == "no force pushes"


def test_untrusted_path_is_reported_as_skipped(rules):
    ev = rules.evaluate("/tmp/x/git", ["git", "push"])
    assert [r.id for r in ev.skipped] == ["git-net"]
    assert "/tmp/x/git is not in a trusted directory" in ev.reason


def test_symlink_in_untrusted_dir_to_trusted_git_is_untrusted(rules, tmp_path):
    link = tmp_path / "git"
    link.symlink_to("/usr/bin/git")
    assert rules.evaluate(str(link), ["git", "push"]).decision == "run"


def test_renamed_symlink_to_denied_program_is_denied(rules, tmp_path):
    link = tmp_path / "innocent"
    link.symlink_to("/usr/bin/sudo")
    # The server sends the real file it identified; its basename carries the denied name.
    ev = rules.evaluate(str(link), ["innocent", "id"], system_facts(str(link), real_path="/usr/bin/sudo"))
    assert (ev.decision, ev.rule.id) == ("deny", "no-sudo")


def test_trusted_dirs_add_to_the_root_owned_check(tmp_path):
    (tmp_path / "t.toml").write_text(RULES)
    rules = RuleSet.load([tmp_path / "t.toml"], trusted_dirs=[str(tmp_path / "bin")])
    assert rules.evaluate(str(tmp_path / "bin" / "git"), ["git", "push"], system_facts(str(tmp_path / "bin" / "git"))).decision == "escalate"
    # Listing a virtualenv's bin does not take trust away from the system's git.
    assert rules.evaluate("/usr/bin/git", ["git", "push"], system_facts("/usr/bin/git")).decision == "escalate"
    assert rules.evaluate(str(tmp_path / "bin/sub/git"), ["git", "push"], system_facts(str(tmp_path / "bin/sub/git"))).decision == "run"
    assert rules.evaluate(str(tmp_path / "git"), ["git", "push"], system_facts(str(tmp_path / "git"))).decision == "run"


def test_host_executable_limits_trust_to_listed_paths(tmp_path):
    (tmp_path / "h.toml").write_text(textwrap.dedent("""
        [host_executable]
        git = ["/opt/homebrew/bin/git"]

        [[rule]]
        program = "git"
        decision = "escalate"
    """))
    rules = RuleSet.load([tmp_path / "h.toml"])
    assert rules.evaluate("/opt/homebrew/bin/git", ["git"], system_facts("/opt/homebrew/bin/git", uid=1000, caller_can_modify=True)).decision == "escalate"
    assert rules.evaluate("/usr/bin/git", ["git"], system_facts("/usr/bin/git")).decision == "run"
    assert rules.rules[0].id == "h.toml#1"


@pytest.mark.parametrize(
    ("file_default", "arg_default", "expected"),
    [
        (None, None, "run"),
        (None, "deny", "deny"),
        ("prompt", None, "prompt"),
        ("prompt", "run", "prompt"),  # the argument tightens, never loosens
        ("prompt", "deny", "deny"),
    ],
)
def test_unmatched_gets_the_default(tmp_path, file_default, arg_default, expected):
    text = f'default = "{file_default}"\n' if file_default else ""
    (tmp_path / "d.toml").write_text(text + RULES)
    rules = RuleSet.load([tmp_path / "d.toml"], default=arg_default)
    ev = rules.evaluate("/usr/bin/make", ["make", "-j4"])
    assert (ev.decision, ev.rule, ev.matched) == (expected, None, ())
    assert f"default: {expected}" in ev.reason
    expect_exec = Execution() if expected in ("prompt", "escalate") else None
    assert ev.execution == expect_exec


def test_bad_default_argument(tmp_path):
    (tmp_path / "d.toml").write_text(RULES)
    with pytest.raises(RulesError, match="decision must be one of"):
        RuleSet.load([tmp_path / "d.toml"], default="allow")


def test_duplicate_ids_across_files(tmp_path):
    (tmp_path / "a.toml").write_text(RULES)
    (tmp_path / "b.toml").write_text(RULES)
    with pytest.raises(RulesError, match=r"b\.toml: rule 'git-net': id already used in .*a\.toml"):
        RuleSet.load([tmp_path / "a.toml", tmp_path / "b.toml"])


def test_directory_loads_its_rules_files_in_order(tmp_path):
    (tmp_path / "a.toml").write_text('[[rule]]\nprogram = "x"\ndecision = "escalate"\n')
    (tmp_path / "b.rules").write_text('prefix_rule(pattern=["x"], decision="forbidden")\n')
    (tmp_path / "notes.txt").write_text("ignored")
    rules = RuleSet.load(tmp_path)
    assert [r.id for r in rules.rules] == ["a.toml#1", "b.rules#1"]
    assert rules.evaluate("/usr/bin/x", ["x"]).decision == "deny"


# (program, argv, decision, rule id) for the shipped default rules
DEFAULTS = [
    ("/usr/bin/git", ["git", "push", "origin", "main"], "escalate", "git-network"),
    ("/usr/bin/git", ["git", "clone", "https://example.org/r"], "escalate", "git-network"),
    ("/usr/bin/git", ["git", "submodule", "update", "--init"], "escalate", "git-submodule-network"),
    ("/usr/bin/git", ["git", "commit", "-m", "x"], "run", None),
    ("/tmp/x/git", ["git", "push"], "run", None),
    ("/usr/bin/pip3", ["pip3", "install", "requests"], "escalate", "pip-install"),
    ("/usr/bin/python3", ["python3", "-m", "pip", "install", "x"], "escalate",
     "python-m-pip-install"),
    ("/usr/bin/npm", ["npm", "ci"], "escalate", "node-install"),
    ("/usr/bin/cargo", ["cargo", "fetch"], "escalate", "cargo-network"),
    ("/usr/bin/go", ["go", "mod", "download"], "escalate", "go-mod-network"),
    ("/usr/bin/uv", ["uv", "pip", "install", "x"], "escalate", "uv-network"),
    ("/usr/bin/apt-get", ["apt-get", "install", "-y", "curl"], "prompt", "system-packages"),
    ("/usr/bin/sudo", ["sudo", "ls"], "deny", "privilege-tools"),
    ("/tmp/x/sudo", ["sudo", "ls"], "deny", "privilege-tools"),
    ("/usr/bin/rm", ["rm", "-rf", "/"], "deny", "rm-root"),
    ("/usr/bin/rm", ["rm", "-rf", "/bin", "/boot", "/etc"], "deny", "rm-root"),
    ("/usr/bin/rm", ["rm", "-r", "-f", "/"], "deny", "rm-root-split-flags"),
    ("/usr/bin/rm", ["rm", "-rf", "build"], "run", None),
    ("/usr/sbin/mkfs.ext4", ["mkfs.ext4", "/dev/sda1"], "deny", "format-disks"),
    ("/usr/sbin/reboot", ["reboot"], "deny", "power"),
    ("/usr/bin/ls", ["ls", "-la"], "run", None),
]


@pytest.mark.parametrize(("program", "argv", "decision", "rule_id"), DEFAULTS)
def test_default_rules(program, argv, decision, rule_id):
    ev = RuleSet.load([DEFAULT_RULES_PATH]).evaluate(program, argv, system_facts(program))
    assert (ev.decision, ev.rule.id if ev.rule else None) == (decision, rule_id)
    if decision == "escalate":
        assert ev.execution == Execution("permissions", Permissions(network=True))


def test_is_trusted_uses_root_owned_system_dirs():
    rules = RuleSet([])
    assert rules.is_trusted("/usr/bin/env", system_identity("/usr/bin/env"))
    assert not rules.is_trusted("/tmp/env", system_identity("/tmp/env"))  # the caller's own
    assert not rules.is_trusted("env", system_identity("/usr/bin/env"))
