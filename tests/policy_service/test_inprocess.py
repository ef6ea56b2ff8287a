"""The embedded policy service deciding in process (``execgate run`` without ``--policy``):
the same rules, audit lines and text as through gRPC, and fail closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from execgate.policy_service.decisions import DecisionService
from execgate.policy_service.inprocess import InProcessPolicy, embedded_policy
from execgate.server.policy import Decision, Execution, PolicyError, SessionContext
from identity_support import system_facts

from policy_fixtures import rules_file  # noqa: F401 - fixture

pytestmark = pytest.mark.anyio

SESSION = SessionContext(session_id="s-1", labels={"agent": "a1"})


async def test_decides_by_the_rules_and_audits_each_decision(rules_file: Path, tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    async with embedded_policy([rules_file], audit_log=log, default_rules=False) as embedded:
        policy = embedded.policy
        run = await policy.determine_action("/usr/bin/echo", ["echo", "hi"], "/tmp", SESSION,
                                            facts=system_facts("/usr/bin/echo"))
        esc = await policy.determine_action("/usr/bin/env", ["env"], "/tmp", SESSION, env={"A": "1"},
                                            facts=system_facts("/usr/bin/env"))
        deny = await policy.determine_action("/usr/bin/rm", ["rm", "-rf", "/"], "/tmp", SESSION,
                                             facts=system_facts("/usr/bin/rm"))
    assert (run.action, run.rule_id) == ("run", "echo-run")
    assert (esc.action, esc.rule_id, esc.execution) == ("escalate", "env-escalate", Execution("unsandboxed"))
    assert (deny.action, deny.reason, deny.error) == ("deny", "no deleting", False)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["program"], r["decision"], r["cached"]) for r in records] == [
        ("/usr/bin/echo", "run", False), ("/usr/bin/env", "escalate", False), ("/usr/bin/rm", "deny", False)]
    assert [r["decision_id"] for r in records] == [d.decision_id for d in (run, esc, deny)]


async def test_non_utf8_text_is_seen_as_the_grpc_service_sees_it(rules_file: Path, tmp_path: Path) -> None:
    """Non-UTF-8 bytes reach the rules and the audit log as ``\\xNN`` (what a proto string
    carries), and the prepared command gets the caller's exact bytes back."""
    log = tmp_path / "audit.jsonl"
    raw = b"caf\xe9".decode("utf-8", "surrogateescape")
    async with embedded_policy([rules_file], audit_log=log, default_rules=False) as embedded:
        facts = system_facts("/usr/bin/env")
        decision = await embedded.policy.determine_action("/usr/bin/env", ["env", raw], "/tmp", SESSION,
                                                          env={"X": raw}, facts=facts)
        prepared = await embedded.policy.prepare_escalated_exec("/usr/bin/env", ["env", raw], "/tmp", {"LANG": raw},
                                                                decision.execution or Execution(), SESSION,
                                                                facts=facts)
    assert decision.action == "escalate"
    assert json.loads(log.read_text())["argv"] == ["env", "caf\\xe9"]
    assert list(prepared.command) == ["/usr/bin/env", raw] and prepared.env.get("LANG") == raw


async def test_a_failing_rules_engine_is_a_deny_naming_it() -> None:
    class Broken:
        fingerprint = ""

        def evaluate(self, program, argv, facts=None):
            raise RuntimeError("engine bug")

    class Source:
        current = Broken()

    policy = InProcessPolicy(DecisionService(Source()))
    decision = await policy.determine_action("/usr/bin/true", ["true"], "/tmp", SESSION)
    assert isinstance(decision, Decision)
    assert decision.action == "deny" and decision.error
    assert "RuntimeError: engine bug" in (decision.reason or "")
    with pytest.raises(PolicyError, match="engine bug"):
        await policy.prepare_escalated_exec("/usr/bin/true", ["true"], "/tmp", {}, Execution(), SESSION)


@pytest.mark.parametrize("program, argv, workdir, words", [
    ("/usr/bin/true", [], "/tmp", "argv is empty"),
    ("true", ["true"], "/tmp", "not an absolute path"),
    ("/usr/bin/true", ["true"], "rel", "workdir"),
])
async def test_a_target_the_contract_forbids_is_denied(rules_file: Path, program, argv, workdir, words) -> None:
    async with embedded_policy([rules_file], default_rules=False) as embedded:
        decision = await embedded.policy.determine_action(program, argv, workdir, SESSION)
        with pytest.raises(PolicyError, match=words):
            await embedded.policy.prepare_escalated_exec(program, argv, workdir, {}, Execution(), SESSION)
    assert decision.action == "deny" and decision.error and words in (decision.reason or "")


async def test_prompts_are_refused_with_the_reason_given(rules_file: Path) -> None:
    async with embedded_policy([rules_file], default_rules=False, no_approver_reason="nobody to ask") as embedded:
        decision = await embedded.policy.determine_action("/usr/bin/ls", ["ls"], "/tmp", SESSION,
                                                          facts=system_facts("/usr/bin/ls"))
    assert (decision.action, decision.rule_id, decision.reason) == ("deny", "ls-prompt", "nobody to ask")
