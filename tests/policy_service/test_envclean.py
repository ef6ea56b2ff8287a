"""The escalated environment is an allowlist (policy_service/envclean.py, issue #9 class 5), plus a
rule's ``set_env``; a variable the caller set for the program that does not reach it is noted
(issue #12 item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from execgate.policy_service.envclean import SAFE_PATH, clean_env, withheld, withheld_note
from execgate.policy_service.rules import DEFAULT_RULES_PATH, RulesError
from execgate.policy_service.rules_toml import load_toml


def test_only_plain_base_variables_pass_and_path_is_fixed() -> None:
    env = {
        "TERM": "xterm", "LANG": "en_US.UTF-8", "LC_ALL": "C", "TZ": "Europe/Paris", "USER": "a",
        "HOME": "/home/a", "APT_CONFIG": "/x", "XDG_CONFIG_HOME": "/x", "GIT_DIR": "/x", "PATH": "/x:/usr/bin",
        "TMPDIR": "/x", "SOMETHING_NEW": "1",
    }
    assert clean_env(env) == {"TERM": "xterm", "LANG": "en_US.UTF-8", "LC_ALL": "C", "TZ": "Europe/Paris",
                              "USER": "a", "PATH": SAFE_PATH}


def test_base_variables_that_name_files_are_dropped() -> None:
    env = {"LANG": "/x/locale", "LC_CTYPE": "../../x", "TERM": "/x/terminfo", "TZ": "/x/zone",
           "LANGUAGE": "a\nb", "COLUMNS": "8" * 300}
    assert clean_env(env) == {"PATH": SAFE_PATH}
    assert clean_env({"TZ": ":/etc/localtime"}) == {"PATH": SAFE_PATH}
    assert clean_env({"TZ": "Europe/../../x"}) == {"PATH": SAFE_PATH}


def test_rule_allow_env_adds_variables_and_may_pass_path() -> None:
    env = {"PIP_INDEX_URL": "https://i/simple", "LD_PRELOAD": "/x.so", "PATH": "/opt/bin:/usr/bin", "HOME": "/h"}
    assert clean_env(env, ["PIP_*"]) == {"PIP_INDEX_URL": "https://i/simple", "PATH": SAFE_PATH}
    assert clean_env(env, ["PATH", "HOME"]) == {"PATH": "/opt/bin:/usr/bin", "HOME": "/h"}
    assert clean_env({}, ["PATH"]) == {"PATH": SAFE_PATH}


def test_entries_no_environment_can_hold_are_dropped_even_if_allowed() -> None:
    assert clean_env({"A=B": "1", "": "x", "N": "a\0b"}, ["*"]) == {"PATH": SAFE_PATH}


def test_set_env_is_set_last_over_the_caller() -> None:
    env = {"GIT_SSH_COMMAND": "evil", "LANG": "C"}
    assert clean_env(env, ["GIT_*"], {"GIT_SSH_COMMAND": "ssh -o BatchMode=yes"}) == {
        "GIT_SSH_COMMAND": "ssh -o BatchMode=yes", "LANG": "C", "PATH": SAFE_PATH}
    assert clean_env({}, (), {"PATH": "/opt/bin"}) == {"PATH": "/opt/bin"}
    assert clean_env({}, (), {"A=B": "x", "N": "a\0b"}) == {"PATH": SAFE_PATH}


def test_withheld_names_only_what_configures_the_program() -> None:
    env = {"GIT_SSH_COMMAND": "x", "GIT_SSH": "/bin/false", "GIT_TERMINAL_PROMPT": "0", "LD_PRELOAD": "/s.so",
           "PWD": "/w", "HOME": "/h", "HTTPS_PROXY": "http://p:3128", "PIP_INDEX_URL": "https://i", "CARGO_HOME": "/c"}
    assert withheld(env, "/usr/bin/git", ["GIT_TERMINAL_PROMPT", "HOME"]) == [
        "GIT_SSH", "GIT_SSH_COMMAND", "HTTPS_PROXY"]
    # A value the rule sets itself counts as withheld unless it is the caller's own.
    assert withheld({"GIT_SSH_COMMAND": "ssh"}, "git", (), {"GIT_SSH_COMMAND": "ssh"}) == []
    assert withheld(env, "/usr/bin/pip3", ["PIP_*", "HOME"]) == ["HTTPS_PROXY"]
    # Programs execgate knows nothing of: only their own NAME_* variables.
    assert withheld({"TOOL_MODE": "fast", "HTTPS_PROXY": "p", "LD_PRELOAD": "x"}, "/opt/bin/tool") == ["TOOL_MODE"]
    assert withheld(env, "/usr/bin/sleep") == []


def test_withheld_note_says_what_and_how_and_shows_only_plain_names() -> None:
    note = withheld_note({"GIT_SSH_COMMAND": "x", "GIT_SSH": "y"}, "/usr/bin/git", (),
                         {"GIT_SSH_COMMAND": "ssh -o BatchMode=yes"}, "git-network")
    assert note.startswith("/usr/bin/git runs escalated (rule git-network) without your GIT_SSH, GIT_SSH_COMMAND; "
                           "GIT_SSH_COMMAND='ssh -o BatchMode=yes' is the rule's own: ")
    assert 'allow_env = ["GIT_SSH"]' in note and "\n" not in note
    assert withheld_note({"LANG": "C"}, "git") == ""
    hostile = {f"GIT_{i}": "v" for i in range(20)} | {"GIT_\x1b[2J": "v", "GIT_" + "A" * 100: "v"}
    note = withheld_note(hostile, "git")
    assert "\x1b" not in note and "A" * 100 not in note and "and 14 more" in note


@pytest.mark.parametrize(("body", "words"), [
    ('decision = "run"\nset_env = { A = "1" }', "set_env is only allowed with escalate or prompt"),
    ('decision = "escalate"\nset_env = { "A-B" = "1" }', "is not a variable name"),
    ('decision = "escalate"\nset_env = { A = 1 }', "must be a string"),
    ('decision = "escalate"\nset_env = ["A=1"]', "set_env must be a table"),
])
def test_a_bad_set_env_rejects_the_file(tmp_path, body: str, words: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(f'[[rule]]\nid = "r"\nprogram = "git"\n{body}\n')
    with pytest.raises(RulesError, match=words):
        load_toml(path)


def test_set_env_loads_in_order_and_the_shipped_git_rules_set_a_fail_fast_ssh(tmp_path) -> None:
    path = tmp_path / "r.toml"
    path.write_text('[[rule]]\nid = "r"\nprogram = "git"\ndecision = "prompt"\nset_env = { B = "2", A = "x y" }\n')
    assert load_toml(path).rules[0].set_env == (("B", "2"), ("A", "x y"))
    shipped = {r.id: dict(r.set_env) for r in load_toml(Path(DEFAULT_RULES_PATH)).rules}
    assert shipped["git-network"] == shipped["git-submodule-network"] == {
        "GIT_SSH_COMMAND": "ssh -o BatchMode=yes -o ConnectTimeout=10"}
