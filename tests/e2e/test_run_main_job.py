"""``execgate run`` as people run it: rules that layer on the shipped defaults, and the words after
``--`` (one word is a script, several are an exact argv)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from run_support import execgate

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
OFFLINE = REPO / "examples" / "offline.toml"
PRIVILEGE_REASON = "privilege escalation is not allowed"


def test_rules_file_layers_on_the_defaults(tmp_path):
    done = execgate("run", "--sandbox", "none", "--rules", str(OFFLINE), "--",
                    "chroot / true; echo status=$?", cwd=tmp_path)
    assert "status=1" in done.stdout, done.stderr
    assert f"Execution denied: {PRIVILEGE_REASON}" in done.stderr
    rules_line = next(line for line in done.stderr.splitlines() if line.startswith("execgate: rules: "))
    assert str(OFFLINE) in rules_line and "default (" in rules_line


def test_no_default_rules_drops_the_shipped_file(tmp_path):
    with_defaults = execgate("policy", "check", "--json", "--rules", str(OFFLINE), "--", "/usr/sbin/chroot", "/", "true")
    without = execgate("policy", "check", "--json", "--no-default-rules", "--rules", str(OFFLINE), "--",
                       "/usr/sbin/chroot", "/", "true")
    assert json.loads(with_defaults.stdout)["decision"] == "deny"
    report = json.loads(without.stdout)
    assert report["decision"] == "run"
    assert report["rules_files"] == [str(OFFLINE)]
    assert len(json.loads(with_defaults.stdout)["rules_files"]) == 2


def test_no_default_rules_without_rules_is_an_error(tmp_path):
    done = execgate("run", "--sandbox", "none", "--no-default-rules", "--", "true", cwd=tmp_path)
    assert done.returncode == 2
    assert "--no-default-rules needs at least one --rules FILE" in done.stderr


def test_the_word_default_names_the_shipped_file(tmp_path):
    done = execgate("policy", "check", "--no-default-rules", "--rules", "default", "--", "/usr/sbin/chroot", "/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("rules:    default (")
    assert "decision: deny (rule privilege-tools)" in done.stdout


def test_several_words_are_one_command_quoted_exactly(tmp_path):
    done = execgate("run", "-q", "--sandbox", "none", "--", sys.executable, "-c", 'print("hi there")', cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "hi there\n"), done.stderr
    done = execgate("run", "-q", "--sandbox", "none", "--", "printf", "[%s]\\n", "a b", "$HOME", "*", cwd=tmp_path)
    assert done.stdout == "[a b]\n[$HOME]\n[*]\n", done.stderr


def test_one_word_is_a_script(tmp_path):
    done = execgate("run", "-q", "--sandbox", "none", "--", "echo a && echo b; exit 3", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (3, "a\nb\n"), done.stderr


def test_the_examples_folder_loads_as_one_directory():
    done = execgate("policy", "check", "--rules", str(REPO / "examples"), "--", "/usr/bin/git", "push", "-f")
    assert done.returncode == 0, done.stderr
    assert "decision: deny" in done.stdout


def test_an_empty_policy_address_is_an_error_not_the_embedded_service(tmp_path):
    done = execgate("run", "--policy", "", "--", "true", cwd=tmp_path)
    assert done.returncode == 2
    assert "--policy: empty address" in done.stderr
