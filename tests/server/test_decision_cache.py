"""The decision cache (docs/DESIGN.md §9) end to end on the server side: a real policy service
(``running_service``, real rules files, its audit log), a real :class:`EscalateServer` whose
policy is :class:`GrpcPolicy`, real sessions, and the native wrapper run as a process (its target
fd, so the server learns the file's identity and facts as in production).

Service calls are counted on the service side (``execgate_decisions_total``, one per
DetermineAction answered); every exec must still have one audit line, cache hits marked
``cached``. The attacks a hostile session could try on the cache (a file swapped at the same
path, a symlink pointed elsewhere, a file rewritten in place, argv[0] aliases, argv under the
program scope, another session) each have a test; ``tests/e2e/test_attack_decision_cache.py``
repeats the main ones through ``execgate run`` in bwrap.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import AsyncIterator, NamedTuple

import grpc
import pytest

from identity_support import system_facts

from execgate.policy_service.decisions import CachedRecord, DecisionService
from execgate.policy_service.server import load_rules, running_service
from execgate.server import protocol as p
from execgate.server.decision_cache import CachedAudit, DecisionCache, Hit
from execgate.server.escalate_server import EscalateServer
from execgate.server.grpc_policy import GrpcPolicy
from execgate.server.policy import CacheHint, Decision, SessionContext
from execgate.server.session import Session
from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc
from execgate.wrapper.artifacts import native_wrapper_path

pytestmark = pytest.mark.anyio

RULES = """
[[rule]]
id = "forbidden-deny"
program = "forbidden"
decision = "deny"
justification = "forbidden by rule"

[[rule]]
id = "tool2-bad"
program = "tool2"
prefix = ["bad"]
decision = "deny"
justification = "tool2 bad is denied"

[[rule]]
id = "asker-prompt"
program = "asker"
decision = "prompt"
justification = "ask first"

"""

#: An escalation rule naming its program by absolute path (so that it needs no trusted file).
ESCALATE = """
[[rule]]
id = "lifter-escalate"
program = "{path}"
decision = "escalate"
execution = "unsandboxed"
justification = "runs outside"
"""

NO_STATIC = """
[[rule]]
id = "no-static"
file_kind = ["static"]
decision = "deny"
justification = "no static programs"
match = [{ command = "./x", file_kind = ["static"] }]
"""


@pytest.fixture(autouse=True)
def _release_grpc_objects():
    yield
    gc.collect()


class Outcome(NamedTuple):
    status: int
    stdout: str
    stderr: str


class Rig(NamedTuple):
    policy: GrpcPolicy
    server: object  # the PolicyServer
    audit: Path
    rules: object  # the RulesStore
    rules_file: Path
    escalate: EscalateServer
    work: Path

    def service_calls(self, outcome: str | None = None) -> int:
        """DetermineAction answers the service gave (by outcome), read from its own metrics."""
        total = 0.0
        for metric in self.server.metrics.registry.collect():  # type: ignore[attr-defined]
            for sample in metric.samples:
                if sample.name == "execgate_decisions_total" and outcome in (None, sample.labels["outcome"]):
                    total += sample.value
        return int(total)

    def lines(self, program: str | None = None) -> list[dict]:
        records = [json.loads(line) for line in self.audit.read_text().splitlines()] if self.audit.exists() else []
        return [r for r in records if program is None or r["program"] == program]

    def copy(self, source: str, name: str) -> Path:
        path = self.work / name
        shutil.copy(source, path)
        path.chmod(0o755)
        return path


@contextlib.asynccontextmanager
async def rig(short_tmp: Path, *, ttl_s: float = 60.0, rules: str = RULES, audit_interval_s: float = 0.5,
              defaults: bool = False) -> AsyncIterator[Rig]:
    """A policy service (rules file, audit log, cache TTL), an escalation server asking it."""
    rules_file = short_tmp / "rules.toml"
    work = short_tmp / "w"
    work.mkdir()
    rules_file.write_text(rules + ESCALATE.format(path=work / "lifter"))
    store = load_rules([rules_file], defaults=defaults)
    audit = short_tmp / "audit.jsonl"
    address = f"unix://{short_tmp / 'p.sock'}"
    async with running_service(store, address=address, audit_log=str(audit), cache_ttl_s=ttl_s, grace_s=0,
                               rules_poll_s=3600) as server:
        policy = GrpcPolicy(address, timeout_s=5.0, audit_interval_s=audit_interval_s)
        escalate = EscalateServer("/bin/sh", str(native_wrapper_path()), policy, socket_dir=str(short_tmp))
        try:
            yield Rig(policy, server, audit, store, rules_file, escalate, work)
        finally:
            await policy.aclose()
            await asyncio.sleep(0.2)


async def run(session: Session, program: str | Path, *args: str, argv0: str | None = None,
              cwd: Path | None = None) -> Outcome:
    """Exec ``program`` (argv ``argv0 args…``) through the session's native wrapper."""
    env = {**os.environ, **session.env_overlay}
    wrapper = session.env_overlay[p.EXEC_WRAPPER_ENV_VAR]
    proc = await asyncio.create_subprocess_exec(
        wrapper, str(program), argv0 if argv0 is not None else os.path.basename(str(program)), *args,
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=(session.client_fd,), cwd=str(cwd) if cwd is not None else None,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return Outcome(proc.returncode, out.decode(), err.decode())


async def test_cached_run_needs_no_call_and_is_still_audited(short_tmp: Path) -> None:
    async with rig(short_tmp) as r:
        tool = r.copy("/bin/true", "tool")
        async with r.escalate.start_session() as session:
            for _ in range(5):
                assert (await run(session, tool)).status == 0
            assert r.service_calls() == 1
            assert r.policy.stats["cache_hit"] == 4
        lines = r.lines(str(tool))  # the session's close flushed its hits
    assert len(lines) == 5
    first, hits = lines[0], lines[1:]
    assert first["cached"] is False and "cached_from" not in first
    assert all(h["cached"] is True and h["cached_from"] == first["decision_id"] for h in hits)
    assert all(h["cache_verified"] is True and h["decision"] == "run" for h in hits)
    assert len({line["decision_id"] for line in lines}) == 5
    assert all(h["session_id"] == first["session_id"] and h["file_kind"] == first["file_kind"] for h in hits)
    metrics = r.policy.metrics.registry
    assert metrics.get_sample_value("execgate_policy_cache_lookups_total", {"result": "hit"}) == 4
    assert metrics.get_sample_value("execgate_policy_cache_lookups_total", {"result": "miss"}) == 1


async def test_denied_program_stays_denied_from_the_cache(short_tmp: Path) -> None:
    async with rig(short_tmp) as r:
        forbidden = r.copy("/bin/true", "forbidden")
        async with r.escalate.start_session() as session:
            outcomes = [await run(session, forbidden) for _ in range(3)]
        assert r.service_calls() == 1
        lines = r.lines(str(forbidden))
    assert all(o.status == 1 and o.stderr == "Execution denied: forbidden by rule\n" for o in outcomes), outcomes
    assert [line["decision"] for line in lines] == ["deny"] * 3
    assert [line["cached"] for line in lines] == [False, True, True]


async def test_file_replaced_at_the_same_path_misses(short_tmp: Path) -> None:
    """Another inode at the same path is another key, even when the answer would be the same."""
    async with rig(short_tmp) as r:
        tool = r.copy("/bin/true", "tool")
        async with r.escalate.start_session() as session:
            await run(session, tool)
            await run(session, tool)
            before = tool.stat().st_ino
            r.copy("/bin/true", "tool.new").rename(tool)  # made before the old one goes: another inode
            assert tool.stat().st_ino != before
            assert (await run(session, tool)).status == 0
            assert r.service_calls() == 2


async def test_symlink_pointed_elsewhere_misses(short_tmp: Path) -> None:
    """A symlink swapped from an allowed file to a denied one cannot borrow the cached Run."""
    async with rig(short_tmp) as r:
        ok = r.copy("/bin/true", "ok")
        forbidden = r.copy("/bin/true", "forbidden")
        link = r.work / "link"
        link.symlink_to(ok)
        async with r.escalate.start_session() as session:
            assert (await run(session, link)).status == 0
            assert (await run(session, link)).status == 0
            assert r.service_calls() == 1
            link.unlink()
            link.symlink_to(forbidden)
            swapped = await run(session, link)
    assert swapped.status == 1 and "forbidden by rule" in swapped.stderr, swapped


async def test_same_inode_rewritten_misses(short_tmp: Path) -> None:
    """A file rewritten in place (same device and inode) into a static program: its file facts
    changed, so the cached Run of the dynamic one does not apply."""
    busybox = shutil.which("busybox")
    if busybox is None or "statically linked" not in subprocess.run(["file", "-L", busybox], capture_output=True,
                                                                      text=True).stdout:
        pytest.skip("needs a static busybox")
    async with rig(short_tmp, rules=NO_STATIC) as r:
        tool = r.copy("/bin/true", "tool")
        inode = tool.stat().st_ino
        async with r.escalate.start_session() as session:
            assert (await run(session, tool)).status == 0
            assert (await run(session, tool)).status == 0
            assert r.service_calls() == 1
            shutil.copyfile(busybox, tool)  # truncate and write: the same inode
            assert tool.stat().st_ino == inode
            rewritten = await run(session, tool, argv0="true")
    assert rewritten.status == 1 and "no static programs" in rewritten.stderr, rewritten


async def test_argv0_is_part_of_the_program_scope(short_tmp: Path) -> None:
    """A deny rule also matches by argv[0]'s basename (exec -a): a cached Run of the same file
    under another argv[0] must not answer it."""
    async with rig(short_tmp) as r:
        tool = r.copy("/bin/true", "tool")
        async with r.escalate.start_session() as session:
            assert (await run(session, tool)).status == 0
            assert (await run(session, tool, "any", "args")).status == 0  # program scope: a hit
            assert r.service_calls() == 1
            aliased = await run(session, tool, argv0="forbidden")
    assert aliased.status == 1 and "forbidden by rule" in aliased.stderr, aliased


async def test_exact_scope_for_a_program_a_rule_names(short_tmp: Path) -> None:
    async with rig(short_tmp) as r:
        tool2 = r.copy("/bin/true", "tool2")
        other = r.work / "sub"
        other.mkdir()
        async with r.escalate.start_session() as session:
            assert (await run(session, tool2, "ok")).status == 0
            assert (await run(session, tool2, "ok")).status == 0
            assert r.service_calls() == 1
            bad = await run(session, tool2, "bad")
            assert bad.status == 1 and "tool2 bad is denied" in bad.stderr, bad
            assert (await run(session, tool2, "ok", "more")).status == 0  # another argv: asked
            assert (await run(session, tool2, "ok", cwd=other)).status == 0  # another workdir: asked
            assert r.service_calls() == 4
            again = await run(session, tool2, "bad")  # the deny is cached for exactly that argv
            assert again.status == 1 and r.service_calls() == 4


async def test_prompt_and_escalation_are_never_cached(short_tmp: Path) -> None:
    async with rig(short_tmp) as r:
        asker = r.copy("/bin/true", "asker")
        lifter = r.copy("/bin/true", "lifter")
        async with r.escalate.start_session() as session:
            for _ in range(2):
                asked = await run(session, asker)
                assert asked.status == 1 and "Execution denied" in asked.stderr  # no approver connected
                assert (await run(session, lifter)).status == 0
        assert r.service_calls() == 4
        assert not any(line["cached"] for line in r.lines())


async def test_entries_expire_after_the_ttl(short_tmp: Path) -> None:
    async with rig(short_tmp, ttl_s=0.3) as r:
        tool = r.copy("/bin/true", "tool")
        async with r.escalate.start_session() as session:
            await run(session, tool)
            await run(session, tool)
            assert r.service_calls() == 1
            await asyncio.sleep(0.5)
            await run(session, tool)
            assert r.service_calls() == 2


async def test_no_ttl_means_no_cache(short_tmp: Path) -> None:
    async with rig(short_tmp, ttl_s=0) as r:
        tool = r.copy("/bin/true", "tool")
        async with r.escalate.start_session() as session:
            for _ in range(3):
                await run(session, tool)
        assert r.service_calls() == 3


async def test_rules_reload_invalidates_at_the_next_answer(short_tmp: Path) -> None:
    async with rig(short_tmp, audit_interval_s=3600) as r:
        tool = r.copy("/bin/true", "tool")
        other = r.copy("/bin/true", "other")
        async with r.escalate.start_session() as session:
            await run(session, tool)
            await run(session, tool)
            assert r.service_calls() == 1
            r.rules_file.write_text(r.rules_file.read_text() + '\n[[rule]]\nid = "tool-now-denied"\nprogram = "tool"\n'
                                    'decision = "deny"\njustification = "tool denied after reload"\n')
            assert r.rules.reload()  # type: ignore[attr-defined]
            await run(session, other)  # any answer carries the new fingerprint: the cache is emptied
            denied = await run(session, tool)
    assert denied.status == 1 and "tool denied after reload" in denied.stderr, denied


async def test_rules_reload_invalidates_at_the_next_audit_flush(short_tmp: Path) -> None:
    """With every exec a hit (no answer to carry the news), the flush of the hits does."""
    async with rig(short_tmp, audit_interval_s=3600) as r:
        tool = r.copy("/bin/true", "tool")
        async with r.escalate.start_session() as session:
            await run(session, tool)
            await run(session, tool)  # a hit, waiting to be audited
            r.rules_file.write_text(r.rules_file.read_text() + '\n[[rule]]\nid = "tool-now-denied"\nprogram = "tool"\n'
                                    'decision = "deny"\njustification = "tool denied after reload"\n')
            assert r.rules.reload()  # type: ignore[attr-defined]
            await r.policy.cached_audit.flush()
            denied = await run(session, tool)
    assert denied.status == 1 and "tool denied after reload" in denied.stderr, denied


async def test_sessions_never_share_entries(short_tmp: Path) -> None:
    """What one session's execs put in the cache never answers another session, nor a session
    reusing its id with other labels."""
    async with rig(short_tmp) as r:
        tool = r.copy("/bin/true", "tool")
        async with r.escalate.start_session() as one, r.escalate.start_session() as two:
            await run(one, tool)
            await run(one, tool)
            assert r.service_calls() == 1
            await run(two, tool)
            assert r.service_calls() == 2
        async with r.escalate.start_session("reused", {"role": "a"}) as a:
            await run(a, tool)
            await run(a, tool)
            assert r.service_calls() == 3
        async with r.escalate.start_session("reused", {"role": "b"}) as b:
            await run(b, tool)
            assert r.service_calls() == 4


async def test_session_close_flushes_and_forgets(short_tmp: Path) -> None:
    async with rig(short_tmp, audit_interval_s=3600) as r:
        tool = r.copy("/bin/true", "tool")
        async with r.escalate.start_session() as session:
            await run(session, tool)
            await run(session, tool)
            assert len(r.lines(str(tool))) == 1  # the hit waits
        assert [line["cached"] for line in r.lines(str(tool))] == [False, True]
        assert r.policy.cache is not None and len(r.policy.cache) == 0


async def test_forged_cached_lines_are_marked_unverified(short_tmp: Path) -> None:
    """A holder of the decision token can call RecordCachedDecisions itself: the lines it writes
    are marked cached and, citing no answer this service gave for that key, not verified."""
    async with rig(short_tmp) as r:
        address = r.server.addresses[0]  # type: ignore[attr-defined]
        decision = Decision.run(decision_id=uuid.uuid4().hex, reason="made up")
        from execgate.server import policy_codec as codec

        entry = pb.CachedDecision(
            session=codec.session_to_pb(SessionContext("victim")),
            target=codec.target_to_pb("/usr/bin/rm", ["rm", "-rf", "/"], "/"),
            decision=codec.decision_to_pb(decision), cached_from=uuid.uuid4().hex, time_unix_ms=0,
        )
        async with grpc.aio.insecure_channel(address) as channel:
            stub = policy_pb2_grpc.EscalationPolicyStub(channel)
            answer = await stub.RecordCachedDecisions(pb.RecordCachedDecisionsRequest(decisions=[entry]))
            assert answer.recorded == 1 and answer.rules_fingerprint
            bad = pb.CachedDecision()
            bad.CopyFrom(entry)
            bad.decision.escalate.execution.unsandboxed.SetInParent()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.RecordCachedDecisions(pb.RecordCachedDecisionsRequest(decisions=[bad]))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        (line,) = r.lines("/usr/bin/rm")
    assert line["cached"] is True and line["cache_verified"] is False


async def test_answers_announced_as_prompts_or_given_by_an_approver_are_not_cached(short_tmp: Path) -> None:
    """The client checks too: a service that marks a prompt's or an approver's answer cacheable
    is not believed."""

    class Lying(policy_pb2_grpc.EscalationPolicyServicer):
        calls = 0

        async def DetermineAction(self, request, context):  # noqa: N802
            Lying.calls += 1
            hint = pb.CacheHint(scope=pb.CacheHint.SCOPE_PROGRAM, ttl_ms=60_000)
            decision = pb.Decision(decision_id=uuid.uuid4().hex, run=pb.Run())
            if request.target.argv[0] == "prompted":
                await context.send_initial_metadata((("execgate-prompt", "1"),))
            else:
                decision.approver = "someone"
            return pb.DetermineActionResponse(decision=decision, cache=hint, rules_fingerprint="f")

    server = grpc.aio.server()
    policy_pb2_grpc.add_EscalationPolicyServicer_to_server(Lying(), server)
    address = f"unix://{short_tmp / 'lying.sock'}"
    server.add_insecure_port(address)
    await server.start()
    policy = GrpcPolicy(address, timeout_s=5.0)
    try:
        session = SessionContext("s")
        for argv0 in ("prompted", "approved"):
            for _ in range(2):
                assert (await policy.determine_action("/bin/x", [argv0], "/", session)).action == "run"
        assert Lying.calls == 4 and policy.stats["cache_hit"] == 0
    finally:
        await policy.aclose()
        await server.stop(0)


async def test_lost_audit_lines_are_counted_not_fatal() -> None:
    failures = []

    async def send(hits):
        failures.append(len(hits))
        raise RuntimeError("service gone")

    audit = CachedAudit(send, interval_s=3600, attempts=2)
    hit = Hit(SessionContext("s"), "/bin/x", ("x",), "/", None, Decision.run(decision_id="a" * 32), "b" * 32, 0, 0.1)
    for _ in range(3):
        audit.add(hit)
    await audit.flush()
    assert audit.lost == 0 and audit.waiting == 3  # kept for one more attempt
    await audit.flush()
    assert audit.lost == 3 and audit.waiting == 0 and failures == [3, 3]
    await audit.aclose()


def test_cache_bounds_per_session() -> None:
    now = [0.0]
    cache = DecisionCache(max_entries=3, max_bytes=10_000, max_entry_bytes=2_000, clock=lambda: now[0])
    cache.observe("f")
    hint = CacheHint("exact", 10.0, "f")
    session = SessionContext("s")
    run = Decision.run(decision_id="d")
    for n in range(5):
        assert cache.put(session, "/bin/x", ("x", str(n)), "/", None, run, hint)
    assert len(cache) == 3 and cache.get(session, "/bin/x", ("x", "0"), "/", None) is None
    assert not cache.put(session, "/bin/x", ("x", "y" * 5000), "/", None, run, hint)  # too large to keep
    assert not cache.put(session, "/bin/x", ("x",), "/", None, Decision.deny("e", error=True), hint)
    assert not cache.put(session, "/bin/x", ("x",), "/", None, Decision.escalate(), hint)
    assert not cache.put(session, "/bin/x", ("x",), "/", None, run, CacheHint("exact", 10.0, "old"))
    now[0] = 11.0
    assert cache.get(session, "/bin/x", ("x", "4"), "/", None) is None  # expired
    cache.observe("g")
    assert len(cache) == 0


async def test_fail_closed_and_prompt_decisions_carry_no_hint(short_tmp: Path) -> None:
    class Down:
        approvals = None

        def unavailable(self):
            return "shared state: Redis at x: cannot be reached; failing closed"

    rules_file = short_tmp / "r.toml"
    rules_file.write_text(RULES + ESCALATE.format(path="/x/lifter"))
    service = DecisionService(load_rules([rules_file], defaults=False), state=Down(), cache_ttl_s=60)  # type: ignore[arg-type]
    decided = await service.decide(SessionContext("s"), "/bin/true", ["true"], "/")
    assert decided.decision.error and decided.cache is None
    service = DecisionService(load_rules([rules_file], defaults=False), cache_ttl_s=60)
    assert (await service.decide(SessionContext("s"), "/bin/true", ["true"], "/")).cache == CacheHint("program", 60)
    assert (await service.decide(SessionContext("s"), "/x/tool2", ["tool2", "ok"], "/")).cache.scope == "exact"
    # (an absolute-path rule applies only with the facts that the path is the file that runs)
    lifted = await service.decide(SessionContext("s"), "/x/lifter", ["lifter"], "/", facts=system_facts("/x/lifter"))
    assert lifted.decision.action == "escalate" and lifted.cache is None
    assert (await service.decide(SessionContext("s"), "/x/asker", ["asker"], "/", budget_s=0.5)).cache is None
    # A Deny for a working directory only the sandbox has depends on the workdir: never cached
    # (it is an escalation's; covered by the lifter case above, which is never cacheable).
    record = CachedRecord(SessionContext("s"), "/bin/true", ["true"], "/", None, Decision.run(decision_id="c" * 32),
                          "nope", 0, 0.0)
    assert await service.record_cached([record]) == 1


async def test_a_hung_service_stops_cached_answers_within_the_contact_window(short_tmp: Path) -> None:
    """A frozen policy service (SIGSTOP) keeps its connection READY: hits are still made only
    within 3 audit intervals of the last call that succeeded; past it every exec is decided again,
    and so denied (found by review: cached Runs went on for the 5 s of the audit call's deadline)."""
    rules = short_tmp / "serve.toml"
    rules.write_text(RULES)
    address = f"unix://{short_tmp / 'serve.sock'}"
    service = subprocess.Popen([sys.executable, "-m", "execgate.server.cli", "policy", "serve", "--listen", address,
                                "--rules", str(rules), "--no-default-rules", "--cache-ttl", "60"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    policy = GrpcPolicy(address, timeout_s=1.0, audit_interval_s=0.2)
    try:
        assert service.stderr is not None
        while "listening on" not in (line := service.stderr.readline()):
            assert line, "policy serve exited before listening"
        escalate = EscalateServer("/bin/sh", str(native_wrapper_path()), policy, socket_dir=str(short_tmp))
        tool = short_tmp / "tool"
        shutil.copy("/bin/true", tool)
        async with escalate.start_session() as session:
            assert [(await run(session, tool)).status for _ in range(3)] == [0, 0, 0]
            assert policy.stats["cache_hit"] == 2  # cached while the service answers
            service.send_signal(signal.SIGSTOP)
            await asyncio.sleep(3 * 0.2 + 0.5)  # past the contact window (and a flush that hangs)
            hung = await run(session, tool)
            service.send_signal(signal.SIGCONT)
        assert hung.status == 1 and hung.stderr.startswith("Execution denied: policy service error"), hung
        assert policy.stats["cache_hit"] == 2
    finally:
        service.send_signal(signal.SIGCONT)
        await policy.aclose()
        service.kill()
        service.wait()
        if service.stderr is not None:
            service.stderr.close()
