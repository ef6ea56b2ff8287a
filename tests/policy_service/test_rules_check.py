"""``execgate policy check``: text and JSON reports, exit statuses."""

from __future__ import annotations

import argparse
import io
import json
import shutil

import pytest

from execgate.policy_service import check

RULES = """
[[rule]]
id = "env-escalate"
program = "env"
prefix = [["-i", "-u"]]
decision = "escalate"
execution = { network = true }
justification = "env may escalate"
allow_env = ["HOME"]
match = ["env -i true"]

[[rule]]
id = "env-u-deny"
program = "env"
prefix = ["-u"]
decision = "deny"
justification = "no unsetting"
match = ["env -u X true"]
"""


def _run(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="execgate policy check")
    check.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    status = check.run(parser.parse_args(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture
def rules_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    path = tmp_path / "r.toml"
    path.write_text(RULES)
    return str(path)


def test_text_report_lists_matches_and_winner(rules_file):
    status, out, err = _run(["--rules", rules_file, "--", "env", "-u", "X", "true"])
    env = shutil.which("env", path="/usr/bin:/bin")
    assert (status, err) == (0, "")
    assert f"program:  {env}\n" in out
    assert "argv:     env -u X true\n" in out
    assert f"    env-escalate  escalate  env [-i|-u]  ({rules_file}#1)\n" in out
    assert f"  * env-u-deny  deny  env -u  ({rules_file}#2)\n" in out
    assert "decision: deny (rule env-u-deny)\n" in out
    assert "reason:   no unsetting\n" in out


def test_text_report_escalation_and_default(rules_file):
    _, out, _ = _run(["--rules", rules_file, "--", "env", "-i", "true"])
    assert "decision: escalate (rule env-escalate)\n" in out
    assert "execution: permissions (network=on;" in out
    assert "allow_env: HOME\n" in out
    _, out, _ = _run(["--rules", rules_file, "--default", "prompt", "--", "env"])
    assert "matched:  (no rule)\n" in out and "decision: prompt (default)\n" in out


def test_json_report(rules_file):
    status, out, _ = _run(["--json", "--rules", rules_file, "--", "env", "-u", "X"])
    report = json.loads(out)
    assert status == 0
    assert report["decision"] == "deny" and report["rule"] == "env-u-deny"
    assert [(m["id"], m["source"], m["decision"]) for m in report["matched"]] == [
        ("env-escalate", rules_file, "escalate"), ("env-u-deny", rules_file, "deny")]
    assert report["argv"] == ["env", "-u", "X"] and report["execution"] is None
    assert report["reason"] == "no unsetting"


def test_json_report_default_rules_and_untrusted_path(tmp_path):
    status, out, _ = _run(["--json", "--", "/usr/bin/git", "push", "origin"])
    report = json.loads(out)
    assert (status, report["decision"], report["rule"]) == (0, "escalate", "git-network")
    assert report["execution"] == {"kind": "permissions", "permissions": {
        "network": True, "writable_roots": [], "readable_roots": []}}
    _, out, _ = _run(["--json", "--", str(tmp_path / "git"), "push"])
    report = json.loads(out)
    assert (report["decision"], report["rule"]) == ("run", None)
    assert [s["id"] for s in report["skipped"]] == ["git-network"]
    _, out, _ = _run(["--", str(tmp_path / "git"), "push"])
    assert "skipped (program not in a trusted directory):\n    git-network" in out


def test_bad_rules_file_exits_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nprogram = "x"\ndecision = "run"\nmatch = ["y"]\n')
    status, out, err = _run(["--rules", str(bad), "--", "/usr/bin/x"])
    assert (status, out) == (2, "")
    assert f"{bad}: rule 'bad.toml#1' (#1): match example 'y' is not matched" in err


def test_unknown_program_exits_2(rules_file):
    status, _, err = _run(["--rules", rules_file, "--", "no-such-program-eg"])
    assert status == 2 and "not found on PATH" in err
