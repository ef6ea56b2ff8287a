"""Rules on what the server learnt of the file (issue #9 class 12): ``children_unseen`` and
``file_kind``, examples that state facts, unknown kept apart from false, ``policy check``, the
wire form and the audit line."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shutil
import subprocess

import pytest

from execgate.policy_service import check
from execgate.policy_service.approvals import ApprovalBroker
from execgate.policy_service.audit import AuditLog
from execgate.policy_service.decisions import DecisionService
from execgate.policy_service.rules_engine import RuleSet
from execgate.policy_service.rules_model import RulesError
from execgate.server import policy_codec as codec
from execgate.server.fileinfo import FileInfo
from execgate.server.policy import ExecFacts, SessionContext

RULES = """
default = "run"

[[rule]]
id = "unseen-prompt"
children_unseen = true
decision = "prompt"
justification = "what this program execs would not be seen"
match = [{ command = "./tool", children_unseen = true }]
not_match = ["./tool", { command = "./tool", children_unseen = false }]

[[rule]]
id = "setuid-deny"
file_kind = ["setuid", "setgid"]
decision = "deny"
justification = "no set-ID programs"
match = [{ command = "/usr/bin/passwd", file_kind = ["elf64", "dynamic", "setuid"] }]
not_match = [{ command = "/usr/bin/ls", file_kind = ["elf64", "dynamic"] }]

[[rule]]
id = "unknown-files"
program = "mystery"
children_unseen = "unknown"
decision = "deny"
match = ["mystery"]
not_match = [{ command = "mystery", children_unseen = false }]
"""

STATIC = ExecFacts(FileInfo("elf", 64, 62, "static"), children_unseen=True)
DYNAMIC = ExecFacts(FileInfo("elf", 64, 62, "dynamic", "/lib64/ld-linux-x86-64.so.2"), children_unseen=False)
SETUID = ExecFacts(FileInfo("elf", 64, 62, "dynamic", setuid=True), children_unseen=False)


@pytest.fixture
def rules(tmp_path):
    path = tmp_path / "facts.toml"
    path.write_text(RULES)
    return RuleSet.load([path])


def test_children_unseen_rule_applies_to_any_program(rules):
    ev = rules.evaluate("/tmp/x/tool", ["tool"], STATIC)
    assert (ev.decision, ev.rule.id) == ("prompt", "unseen-prompt")
    assert rules.evaluate("/tmp/x/tool", ["tool"], DYNAMIC).decision == "run"


def test_unknown_is_not_false(rules):
    """A request without facts (an older client) matches neither ``true`` nor ``false`` rules, only
    ``"unknown"``."""
    assert rules.evaluate("/tmp/x/tool", ["tool"], None).decision == "run"
    assert rules.evaluate("/usr/bin/mystery", ["mystery"], None).rule.id == "unknown-files"
    assert rules.evaluate("/usr/bin/mystery", ["mystery"], DYNAMIC).decision == "run"


def test_file_kind_rule(rules):
    assert rules.evaluate("/usr/bin/passwd", ["passwd"], SETUID).rule.id == "setuid-deny"
    assert rules.evaluate("/usr/bin/passwd", ["passwd"], DYNAMIC).decision == "run"


@pytest.mark.parametrize(("text", "message"), [
    ('[[rule]]\nid = "r"\ndecision = "deny"\n', r"missing required key 'program' \(or a file_kind"),
    ('[[rule]]\nid = "r"\nprogram = "*"\ndecision = "deny"\n', r"'\*' is not a program name"),
    ('[[rule]]\nid = "r"\nfile_kind = ["fat"]\ndecision = "deny"\n', r"unknown file_kind 'fat'"),
    ('[[rule]]\nid = "r"\nchildren_unseen = "yes"\ndecision = "deny"\n', r"children_unseen must be true, false"),
    ('[[rule]]\nid = "r"\nchildren_unseen = true\ndecision = "deny"\nmatch = ["./tool"]\n',
     r"match example './tool' is not matched"),
    ('[[rule]]\nid = "r"\nchildren_unseen = true\ndecision = "deny"\n'
     'not_match = [{ command = "./t", children_unseen = true }]\n',
     r"not_match example './t \(file_kind=unknown, children_unseen=true\)' is matched"),
    ('[[rule]]\nid = "r"\nchildren_unseen = true\ndecision = "deny"\nmatch = [{ cmd = "./t" }]\n',
     r"an example table needs 'command'"),
])
def test_bad_fact_rules_are_rejected(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(RulesError, match=message):
        RuleSet.load([path])


def test_permissive_fact_rule_needs_a_trusted_path(tmp_path):
    path = tmp_path / "esc.toml"
    path.write_text('[[rule]]\nid = "esc-static"\nfile_kind = "static"\ndecision = "escalate"\n')
    rules = RuleSet.load([path])
    assert rules.evaluate("/tmp/x/busybox", ["busybox"], STATIC).decision == "run"  # skipped: untrusted
    assert rules.evaluate("/tmp/x/busybox", ["busybox"], STATIC).skipped[0].id == "esc-static"


def test_facts_cross_the_wire_and_unknown_stays_unknown():
    script = FileInfo("script", interpreter="/bin/busybox", interpreter_info=FileInfo("elf", 64, 62, "static"))
    facts = ExecFacts(script, True, None)
    msg = codec.target_to_pb("/w/s", ["s"], "/w", facts)
    assert codec.facts_from_pb(msg) == facts
    bare = codec.target_to_pb("/w/s", ["s"], "/w")
    assert not bare.HasField("file") and not bare.HasField("children_unseen")
    assert codec.facts_from_pb(bare) == ExecFacts()
    assert codec.facts_from_pb(codec.target_to_pb("/w/s", ["s"], "/w", ExecFacts(None, False))).children_unseen is False


def test_audit_line_records_children_unseen_and_kind(rules, tmp_path):
    class Store:
        current = rules

    audit = AuditLog(tmp_path / "audit.jsonl")
    service = DecisionService(Store(), approvals=ApprovalBroker(), audit=audit)

    async def go():
        await service.decide(SessionContext("s"), "/w/tool", ["tool"], "/w", facts=STATIC)
        await service.decide(SessionContext("s"), "/w/tool", ["tool"], "/w", facts=None)

    asyncio.run(go())
    audit.close()
    first, second = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert (first["children_unseen"], first["file_kind"], first["decision"]) == (True, ["elf64", "static"], "deny")
    assert "no approver" in first["reason"]
    assert (second["children_unseen"], second["file_kind"]) == (None, None)


def _check(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    out = io.StringIO()
    return check.run(parser.parse_args(argv), out=out, err=io.StringIO()), out.getvalue()


def test_policy_check_shows_file_facts_and_uses_them(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    (tmp_path / "m.c").write_text("int main(void) { return 0; }\n")
    prog = tmp_path / "m-static"
    subprocess.run(["gcc", "-static", "-o", str(prog), str(tmp_path / "m.c")], check=True)
    rules = tmp_path / "facts.toml"
    rules.write_text(RULES)
    status, out = _check(["--rules", str(rules), "--", str(prog)])
    assert status == 0
    assert "file:     static elf64 x86_64; children unseen (for a session with the preload shim alone)" in out
    assert "decision: prompt (rule unseen-prompt)" in out
    status, out = _check(["--rules", str(rules), "--seccomp", "on", "--json", "--", str(prog)])
    report = json.loads(out)
    assert (report["children_unseen"], report["file_kind"], report["decision"]) == (False, ["elf64", "static"], "run")


def test_approvers_are_shown_the_file_facts():
    from execgate.policy_service.approver import describe
    from execgate.policy_service.web_feed import pending_to_json
    from execgate.v1 import approvals_pb2 as apb

    pending = apb.PendingApproval(request_id="r1", target=codec.target_to_pb("/w/tool", ["tool"], "/w", STATIC))
    assert "   file:    static elf64 x86_64; children unseen" in describe(pending)
    page = pending_to_json(pending)
    assert (page["file"], page["children_unseen"]) == ("static elf64 x86_64; children unseen", True)
    bare = apb.PendingApproval(request_id="r2", target=codec.target_to_pb("/w/tool", ["tool"], "/w"))
    assert "   file:    (nothing learnt of the file)" in describe(bare)
    assert pending_to_json(bare)["children_unseen"] is None
