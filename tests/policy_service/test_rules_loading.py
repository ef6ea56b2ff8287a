"""Rules files: TOML and Codex loading, validation errors, safe parsing, shipped examples."""

from __future__ import annotations

import dataclasses
import os
import textwrap
from pathlib import Path

import pytest

from execgate.policy_service.rules import DEFAULT_RULES_PATH, RuleSet, RulesError
from execgate.server.policy import Execution
from identity_support import system_facts, system_identity

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

GOOD_RULE = '[[rule]]\nid = "r"\nprogram = "git"\nprefix = ["push"]\ndecision = "escalate"\n'

# (file text, regex the RulesError message must match: file, rule and example named)
BAD_TOML = [
    ("[[rule]\nprogram = 'x'", r"bad\.toml: TOML syntax error"),
    ('defualt = "run"\n', r"bad\.toml: unknown key\(s\) 'defualt'"),
    (GOOD_RULE + 'progam = "git"\n', r"bad\.toml: rule 'r' \(#1\): unknown key\(s\) 'progam'"),
    (GOOD_RULE.replace('"escalate"', '"allow"'),
     r"rule 'r' \(#1\): decision must be one of run, escalate, prompt, deny, not 'allow'"),
    (GOOD_RULE.replace('prefix = ["push"]', 'prefix = "push"'), r"rule 'r' \(#1\): prefix must be"),
    (GOOD_RULE.replace('["push"]', '[["push"], 3]'), r"rule 'r' \(#1\): a prefix token must be"),
    (GOOD_RULE.replace('["push"]', '[[]]'), r"rule 'r' \(#1\): a prefix token must be"),
    (GOOD_RULE.replace('"git"', '"bin/git"'), r"program 'bin/git' must be a basename or an abs"),
    (GOOD_RULE.replace('id = "r"\n', "") + 'match = ["git pull"]\n',
     r"bad\.toml: rule 'bad\.toml#1' \(#1\): match example 'git pull' is not matched"),
    ('[[rule]]\nid = "r"\ndecision = "run"\n', r"rule 'r' \(#1\): missing required key 'program'"),
    (GOOD_RULE + 'match = ["git pull"]\n',
     r"bad\.toml: rule 'r' \(#1\): match example 'git pull' is not matched by this rule"),
    (GOOD_RULE + 'not_match = [["git", "push", "-f"]]\n',
     r"rule 'r' \(#1\): not_match example 'git push -f' is matched by this rule"),
    (GOOD_RULE + 'match = ["git \'push"]\n', r"rule 'r' \(#1\): example .* cannot be split"),
    (GOOD_RULE + 'match = [""]\n', r"rule 'r' \(#1\): example '' is empty"),
    (GOOD_RULE + 'execution = "bwrap"\n', r"rule 'r' \(#1\): execution must be"),
    (GOOD_RULE + 'execution = { network = "yes" }\n', r"execution\.network must be true or false"),
    (GOOD_RULE + 'execution = { netwrok = true }\n', r"execution: unknown key\(s\) 'netwrok'"),
    (GOOD_RULE + 'execution = { writable_roots = ["rel"] }\n', r"path 'rel' is not absolute"),
    (GOOD_RULE.replace('"escalate"', '"deny"') + 'execution = "unsandboxed"\n',
     r"execution is only allowed with escalate or prompt, not with deny"),
    (GOOD_RULE + 'allow_env = ["A=1"]\n', r"allow_env must be a list of variable names"),
    (GOOD_RULE + GOOD_RULE, r"rule 'r' \(#2\): duplicate rule id"),
    ('trusted_dirs = ["relative"]\n', r"trusted_dirs: path 'relative' is not absolute"),
    ('[host_executable]\ngit = ["/usr/bin/gat"]\n', r"path '/usr/bin/gat' does not end in 'git'"),
    ('rule = 3\n', r"'rule' must be an array of tables"),
]


@pytest.mark.parametrize(("text", "message"), BAD_TOML)
def test_bad_toml_is_rejected_with_file_rule_and_example(tmp_path, text, message):
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(RulesError, match=message) as info:
        RuleSet.load([tmp_path / "bad.toml"])
    assert str(info.value).startswith(str(tmp_path / "bad.toml"))


def test_bad_file_rejects_the_whole_set(tmp_path):
    (tmp_path / "good.toml").write_text(GOOD_RULE)
    (tmp_path / "bad.toml").write_text(GOOD_RULE.replace('id = "r"', 'id = "s"') + "oops = 1\n")
    with pytest.raises(RulesError, match="bad.toml"):
        RuleSet.load([tmp_path / "good.toml", tmp_path / "bad.toml"])


@pytest.mark.parametrize(
    ("name", "message"),
    [("missing.toml", "no such rules file"), ("rules.yaml", "unknown rules file type")],
)
def test_missing_file_and_unknown_suffix(tmp_path, name, message):
    if name.endswith(".yaml"):
        (tmp_path / name).write_text("x: 1")
    with pytest.raises(RulesError, match=message):
        RuleSet.load([tmp_path / name])


CODEX = """
# comment
host_executable(name = "gh", paths = ["/opt/gh/bin/gh"])

prefix_rule(
    pattern = ["git", ["push", "fetch"]],
    decision = "prompt",
    justification = "remote",
    match = [["git", "push", "origin"], "git fetch"],
    not_match = ["git status"],
)
prefix_rule(pattern = [["ls", "cat"]], match = ["ls -l", "cat x"])
prefix_rule(pattern = ("git", "reset", "--hard"), decision = "forbidden")
prefix_rule(pattern = ["gh"], decision = "allow")
"""


@pytest.mark.parametrize(
    ("program", "argv", "decision", "rule_id", "execution"),
    [
        ("/usr/bin/git", ["git", "push"], "prompt", "c.rules#2", Execution("unsandboxed")),
        ("/tmp/x/git", ["git", "fetch"], "prompt", "c.rules#2", Execution("unsandboxed")),
        ("/usr/bin/ls", ["ls", "-l"], "escalate", "c.rules#3", Execution("unsandboxed")),
        ("/usr/bin/cat", ["cat"], "escalate", "c.rules#3", Execution("unsandboxed")),
        ("/tmp/x/ls", ["ls"], "run", None, None),
        ("/usr/bin/git", ["git", "reset", "--hard", "HEAD"], "deny", "c.rules#4", None),
        ("/usr/bin/git", ["git", "reset", "--soft"], "run", None, None),
        ("/opt/gh/bin/gh", ["gh", "pr"], "escalate", "c.rules#5", Execution("unsandboxed")),
        ("/usr/bin/gh", ["gh", "pr"], "run", None, None),  # not the declared host executable
    ],
)
def test_codex_rules(tmp_path, program, argv, decision, rule_id, execution):
    (tmp_path / "c.rules").write_text(CODEX)
    ev = RuleSet.load([tmp_path / "c.rules"]).evaluate(program, argv, system_facts(program))
    assert (ev.decision, ev.rule.id if ev.rule else None, ev.execution) == (
        decision, rule_id, execution)


def test_codex_rule_location_names_the_line(tmp_path):
    (tmp_path / "c.rules").write_text(CODEX)
    rule = RuleSet.load([tmp_path / "c.rules"]).rules[0]
    assert (rule.line, rule.location, rule.justification) == (5, f"{tmp_path}/c.rules:5", "remote")


BAD_CODEX = [
    ("import os\n", r"line 1: only prefix_rule\(\.\.\.\) and host_executable\(\.\.\.\) calls"),
    ("x = 1\n", r"line 1: .*not assign statements"),
    ("os.system('true')\n", r"line 1: only .* may be called, not 'os\.system'"),
    ("print('hi')\n", r"may be called, not 'print'"),
    ("prefix_rule(['ls'])\n", r"takes keyword arguments only"),
    ("prefix_rule(**{'pattern': ['ls']})\n", r"\*\*kwargs is not allowed"),
    ("prefix_rule(pattern=['ls'], decision=d)\n", r"line 1: only string literals .*not 'd'"),
    ("prefix_rule(pattern=[f'{1}'])\n", r"only string literals"),
    ("prefix_rule(pattern=['ls'] + ['x'])\n", r"only string literals"),
    ("prefix_rule(pattern=['ls'], decision='allow', decision='prompt')\n", r"given twice"),
    ("\n\nprefix_rule(pattern=['ls'], bogus='x')\n",
     r"prefix_rule #1 \(line 3\): unknown keyword\(s\) 'bogus'"),
    ("prefix_rule(pattern=['ls'], decision='deny')\n", r"decision must be allow, prompt or forb"),
    ("prefix_rule(pattern=[])\n", r"pattern must be a non-empty list"),
    ("prefix_rule(pattern=['ls'], match=['cat x'])\n",
     r"prefix_rule #1 \(line 1\): match example 'cat x' is not matched by this rule"),
    ("prefix_rule(pattern=['ls'], not_match=[['ls', '-l']])\n",
     r"not_match example 'ls -l' is matched"),
    ("host_executable(name='git', paths=['git'])\n", r"path 'git' is not absolute"),
    ("host_executable(name='git')\n", r"missing: \['paths'\]"),
    ("prefix_rule(pattern=['ls']\n", r"line 1: syntax error"),
    ("lambda: 0\n", r"not expr statements|only prefix_rule"),
]


@pytest.mark.parametrize(("text", "message"), BAD_CODEX)
def test_bad_codex_rules_are_rejected_with_file_and_line(tmp_path, text, message):
    (tmp_path / "bad.rules").write_text(text)
    with pytest.raises(RulesError, match=message) as info:
        RuleSet.load([tmp_path / "bad.rules"])
    assert str(info.value).startswith(f"{tmp_path}/bad.rules: ")


@pytest.mark.parametrize(
    "template",
    [
        "__import__('os').system('touch {marker}')\n",
        "prefix_rule(pattern=[__import__('os').system('touch {marker}')])\n",
        "prefix_rule(pattern=['ls'], justification=open('{marker}', 'w').name)\n",
        "import os\nos.system('touch {marker}')\n",
        "[__import__('os').system('touch {marker}') for _ in 'x']\n",
    ],
)
def test_codex_rules_are_never_executed(tmp_path, template):
    marker = tmp_path / "pwned"
    (tmp_path / "evil.rules").write_text(template.format(marker=marker))
    with pytest.raises(RulesError, match="evil.rules: line 1"):
        RuleSet.load([tmp_path / "evil.rules"])
    assert not marker.exists()


def _example_files() -> list[Path]:
    return sorted(p for p in EXAMPLES.iterdir() if p.suffix in (".toml", ".rules"))


def test_there_are_example_files():
    names = {p.name for p in _example_files()}
    assert {"strict.toml", "codex.rules", "ci-bot.toml"} <= names
    assert (EXAMPLES / "README.md").is_file()


@pytest.mark.parametrize("path", [DEFAULT_RULES_PATH, *_example_files()], ids=lambda p: p.name)
def test_shipped_rules_load_and_pass_their_examples(path):
    rules = RuleSet.load([path])
    assert rules.rules
    # examples were checked at load; the engine agrees: run from a trusted system directory,
    # each match example is among the matched rules and each not_match example is not
    checked = 0
    for rule in rules.rules:
        for example, expected in [(e, True) for e in rule.match] + [
                (e, False) for e in rule.not_match]:
            head = example[0]
            program = head if head.startswith("/") else f"/usr/bin/{head}"
            if "/" in rule.program or "/" in head:
                program = rule.program if expected else head
            facts = dataclasses.replace(example.facts, identity=system_identity(program))
            ids = {r.id for r in rules.evaluate(program, example, facts).matched}
            hit = rule.id in ids
            if expected:
                checked += 1
                assert hit, (rule.id, example)
            elif example[0] == rule.program or os.path.basename(example[0]) == rule.program:
                assert not hit, (rule.id, example)
    assert checked


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: p.name)
def test_examples_load_together_with_the_defaults(path):
    assert RuleSet.load([DEFAULT_RULES_PATH, path]).rules


def test_every_default_rule_has_examples():
    for rule in RuleSet.load([DEFAULT_RULES_PATH]).rules:
        assert rule.match and rule.not_match, rule.id


@pytest.mark.parametrize(
    ("files", "program", "argv", "decision", "rule_id"),
    [
        (["strict.toml"], "/usr/bin/curl", ["curl", "x"], "prompt", None),
        (["strict.toml"], "/usr/bin/ls", ["ls", "-la"], "run", "read-only-tools"),
        (["strict.toml"], "/usr/bin/git", ["git", "push", "-f"], "deny", "git-push-force"),
        (["strict.toml"], "/usr/bin/npm", ["npm", "ci"], "prompt", "package-installs-prompt"),
        (["ci-bot.toml"], "/opt/ci/bin/publish", ["publish", "--release"], "escalate",
         "publish-artifacts"),
        (["ci-bot.toml"], "/usr/bin/git", ["git", "push", "origin", "ci-x"], "escalate",
         "git-push"),
        (["ci-bot.toml"], "/usr/bin/git", ["git", "push", "origin", "main"], "deny",
         "git-push-protected"),
        (["default.toml", "offline.toml"], "/usr/bin/pip", ["pip", "install", "x"], "run",
         "offline-packages"),
        (["default.toml", "offline.toml"], "/usr/bin/git", ["git", "fetch"], "deny",
         "offline-git"),
        (["codex.rules"], "/usr/bin/gh", ["gh", "pr", "view", "1"], "escalate", "codex.rules#2"),
        (["codex.rules"], "/usr/bin/gh", ["gh", "pr", "merge", "1"], "prompt", "codex.rules#3"),
        (["codex.rules"], "/home/u/gh", ["gh", "repo", "delete", "x"], "deny", "codex.rules#4"),
    ],
)
def test_example_decisions(files, program, argv, decision, rule_id):
    paths = [DEFAULT_RULES_PATH if f == "default.toml" else EXAMPLES / f for f in files]
    ev = RuleSet.load(paths).evaluate(program, argv, system_facts(program))
    assert (ev.decision, ev.rule.id if ev.rule else None) == (decision, rule_id)


def test_toml_docstring_schema_is_a_valid_rules_file(tmp_path):
    from execgate.policy_service import rules_toml

    doc = rules_toml.__doc__ or ""
    block = doc.split("::", 1)[1].split("A file is accepted", 1)[0]
    (tmp_path / "doc.toml").write_text(textwrap.dedent(block))
    rules = RuleSet.load([tmp_path / "doc.toml"])
    assert rules.rules[0].id == "git-network"


def test_rules_directory_loads_its_files_and_an_empty_one_is_rejected(tmp_path):
    rules_dir = tmp_path / "rules.d"
    rules_dir.mkdir()
    with pytest.raises(RulesError, match=r"rules\.d: rules directory holds no \.toml or \.rules file"):
        RuleSet.load([rules_dir])
    (rules_dir / "b.toml").write_text('[[rule]]\nid = "deny-id"\nprogram = "id"\ndecision = "deny"\n')
    (rules_dir / "notes.txt").write_text("not a rules file")
    ruleset = RuleSet.load([rules_dir])
    assert [r.id for r in ruleset.rules] == ["deny-id"]
    assert ruleset.evaluate("/usr/bin/id", ["id"]).decision == "deny"


@pytest.mark.parametrize("name", ["empty.toml", "empty.rules"])
def test_an_empty_rules_file_is_rejected(tmp_path, name):
    (tmp_path / name).write_text("# nothing here\n")
    with pytest.raises(RulesError, match=r"holds no rule and no setting"):
        RuleSet.load([tmp_path / name])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / name).write_text("")
    with pytest.raises(RulesError, match=r"holds no rule and no setting"):
        RuleSet.load([tmp_path / "d"])


def test_a_file_with_only_a_default_is_a_policy(tmp_path):
    (tmp_path / "deny-all.toml").write_text('default = "deny"\n')
    assert RuleSet.load([tmp_path / "deny-all.toml"]).evaluate("/usr/bin/id", ["id"]).decision == "deny"
