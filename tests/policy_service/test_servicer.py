"""EscalationPolicy over a real grpc.aio server on a Unix socket: round trips, bad input,
health, reflection, env cleaning, sandboxed command lines, audit log."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from execgate.policy_service.envclean import SAFE_PATH
from execgate.v1 import policy_pb2 as pb
from execgate.v1 import policy_pb2_grpc
from execgate.server import policy_codec as codec
from identity_support import system_facts

from policy_fixtures import rules_file, release_grpc_objects, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.anyio

SESSION = pb.SessionContext(session_id="s-1", labels={"agent": "a1"})


def target(program: str, *args: str, workdir: str = "/tmp") -> pb.ExecTarget:
    """The target as an escalation server sends it: with the identity facts of a system file."""
    return codec.target_to_pb(program, [os.path.basename(program), *args], workdir, system_facts(program))


async def determine(address: str, tgt: pb.ExecTarget, session=SESSION) -> pb.Decision:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = policy_pb2_grpc.EscalationPolicyStub(channel)
        response = await stub.DetermineAction(pb.DetermineActionRequest(session=session, target=tgt), timeout=5)
        return response.decision


async def test_determine_action_round_trip(service, short_tmp: Path) -> None:
    async with service() as server:
        address = server.addresses[0]
        run = await determine(address, target("/usr/bin/echo", "hi"))
        esc = await determine(address, target("/usr/bin/env"))
        deny = await determine(address, target("/usr/bin/rm", "-rf", "/"))
        mode = stat.S_IMODE(os.stat(short_tmp / "p.sock").st_mode)
    assert mode == 0o600
    assert run.WhichOneof("action") == "run" and run.rule_id == "echo-run"
    assert esc.WhichOneof("action") == "escalate" and esc.rule_id == "env-escalate"
    assert esc.escalate.execution.WhichOneof("kind") == "unsandboxed"
    assert deny.WhichOneof("action") == "deny" and deny.deny.reason == "no deleting"
    assert len({run.decision_id, esc.decision_id, deny.decision_id}) == 3 and all(
        d.decision_id for d in (run, esc, deny)
    )


@pytest.mark.parametrize(
    "tgt, words",
    [
        (pb.ExecTarget(program="/usr/bin/echo", argv=[], workdir="/tmp"), "argv is empty"),
        (pb.ExecTarget(program="echo", argv=["echo"], workdir="/tmp"), "not an absolute path"),
        (pb.ExecTarget(program="/usr/bin/echo", argv=["echo"], workdir="rel"), "workdir"),
    ],
)
async def test_bad_input_is_invalid_argument(service, tgt: pb.ExecTarget, words: str) -> None:
    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        stub = policy_pb2_grpc.EscalationPolicyStub(channel)
        for call in (
            stub.DetermineAction(pb.DetermineActionRequest(session=SESSION, target=tgt), timeout=5),
            stub.PrepareEscalatedExec(
                pb.PrepareEscalatedExecRequest(
                    session=SESSION, target=tgt, execution=pb.Execution(unsandboxed=pb.Unsandboxed())
                ),
                timeout=5,
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert words in info.value.details()
        # An execution with no kind set and a missing session are bad input too.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.PrepareEscalatedExec(
                pb.PrepareEscalatedExecRequest(session=SESSION, target=target("/usr/bin/env"), execution=pb.Execution()),
                timeout=5,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.DetermineAction(pb.DetermineActionRequest(target=target("/usr/bin/echo")), timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_health_and_reflection(service) -> None:
    async with service() as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "execgate.v1.EscalationPolicy", "execgate.v1.Approvals"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        listed = set()
        async for reply in refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])):
            listed |= {s.name for s in reply.list_services_response.service}
    assert {"execgate.v1.EscalationPolicy", "execgate.v1.Approvals", "grpc.health.v1.Health"} <= listed


INJECTED = {
    "LD_PRELOAD": "/x/evil.so",
    "LD_LIBRARY_PATH": "/x",
    "LD_AUDIT": "/x/a.so",
    "BASH_ENV": "/x/rc",
    "ENV": "/x/rc",
    "CODEX_ESCALATE_SOCKET": "5",
    "EXEC_WRAPPER": "/x/wrapper",
    "EXECGATE_SOCKET_DIR": "/x",
    "BASH_FUNC_ls%%": "() { evil; }",
    "GIT_CONFIG_PARAMETERS": "'protocol.ext.allow'='always'",
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "core.sshCommand",
    "GIT_CONFIG_VALUE_0": "touch /tmp/pwned",
    "GIT_SSH_COMMAND": "touch /tmp/pwned",
    "HOME": "/home/agent",
    "EXECGATE_KEEP_ME": "yes",
    # Not in any denylist, yet each runs the caller's code in an escalated command (issue #9).
    "APT_CONFIG": "/x/apt.conf",
    "XDG_CONFIG_HOME": "/x/config",
    "GIT_DIR": "/x/repo",
    "PATH": "/x/bin:/usr/bin",
    "TMPDIR": "/x/tmp",
    # Plain terminal and locale settings pass; ones naming a file do not.
    "TERM": "xterm-256color",
    "LANG": "C.UTF-8",
    "TZ": "Europe/Paris",
    "LC_ALL": "/x/locale",
    "LC_TIME": "../x",
}


async def prepare(address: str, tgt: pb.ExecTarget, execution: pb.Execution, session=SESSION) -> pb.PreparedExec:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = policy_pb2_grpc.EscalationPolicyStub(channel)
        request = pb.PrepareEscalatedExecRequest(session=session, target=tgt, env=INJECTED, execution=execution)
        return (await stub.PrepareEscalatedExec(request, timeout=5)).prepared


async def test_prepared_env_is_cleaned(service) -> None:
    unsandboxed = pb.Execution(unsandboxed=pb.Unsandboxed())
    async with service() as server:
        plain = await prepare(server.addresses[0], target("/usr/bin/echo", "x"), unsandboxed)
        allowed = await prepare(server.addresses[0], target("/usr/bin/env", "-0"), unsandboxed)
    blocked = {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV", "CODEX_ESCALATE_SOCKET",
               "EXEC_WRAPPER", "EXECGATE_SOCKET_DIR", "EXECGATE_KEEP_ME", "BASH_FUNC_ls%%",
               "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0", "GIT_SSH_COMMAND"}
    # An allowlist: plain terminal/locale variables pass, PATH is the fixed safe default, the rest
    # (HOME, APT_CONFIG, XDG_CONFIG_HOME, GIT_DIR, TMPDIR, locale paths, …) is dropped.
    base = {"TERM": "xterm-256color", "LANG": "C.UTF-8", "TZ": "Europe/Paris", "PATH": SAFE_PATH}
    assert dict(plain.env) == base
    assert not blocked & set(plain.env)
    # The env-escalate rule's allow_env lets LD_LIBRARY_PATH and EXECGATE_KEEP_* through, nothing else.
    assert dict(allowed.env) == {**base, "LD_LIBRARY_PATH": "/x", "EXECGATE_KEEP_ME": "yes"}
    assert list(plain.command) == ["/usr/bin/echo", "x"] and plain.arg0 == "echo" and plain.cwd == "/tmp"


async def test_prepared_sandbox_command_lines(service) -> None:
    profile = pb.Permissions(network=False, writable_roots=["/tmp/w"], readable_roots=["/opt/r"])
    session = pb.SessionContext(session_id="s-2", sandbox=pb.Permissions(network=True, writable_roots=["/tmp/s"]))
    async with service() as server:
        address = server.addresses[0]
        perm = await prepare(address, target("/usr/bin/env", "-0", workdir="/tmp/s/sub"), pb.Execution(permissions=profile), session)
        dflt = await prepare(address, target("/usr/bin/env", workdir="/tmp/s"), pb.Execution(session_default=pb.SessionDefault()), session)
        bare = await prepare(address, target("/usr/bin/env"), pb.Execution(session_default=pb.SessionDefault()))
    cmd = list(perm.command)
    # bwrap by the absolute path found at service start, never by a caller's PATH.
    assert os.path.isabs(cmd[0]) and os.path.basename(cmd[0]) == "bwrap" and cmd[-3:] == ["--", "/usr/bin/env", "-0"]
    i = cmd.index("--ro-bind")
    assert cmd[i:i + 3] == ["--ro-bind", "/", "/"] and "--unshare-net" in cmd and "--die-with-parent" in cmd
    # No capabilities, root included; a new terminal session.
    assert {"--unshare-user", "--new-session", "--disable-userns"} <= set(cmd) and cmd[cmd.index("--cap-drop") + 1] == "ALL"
    assert "/tmp/w" in cmd[cmd.index("--bind-try") + 1:] and cmd[cmd.index("--chdir") + 1] == "/tmp/s/sub"
    assert not perm.HasField("arg0") and "LD_PRELOAD" not in perm.env
    # A granted profile adds to what the session has: its own roots and the session's roots; the
    # caller's working dir is a claim, not a grant, in a sandboxed session: never bound by itself.
    assert [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--bind-try"] == ["/tmp/w", "/tmp/s"]
    assert "/tmp/s/sub" not in cmd[:cmd.index("--chdir")]
    dcmd = list(dflt.command)
    assert dcmd[0] == cmd[0] and "--unshare-net" not in dcmd and "/tmp/s" in dcmd
    # A session with no sandbox of its own: session_default is the plain program.
    assert list(bare.command) == ["/usr/bin/env"] and bare.arg0 == "env"


async def test_audit_log_one_line_per_decision(service, short_tmp: Path) -> None:
    log_path = short_tmp / "audit.jsonl"
    async with service(audit_log=log_path) as server:
        decisions = [
            await determine(server.addresses[0], target("/usr/bin/echo", "a b"), session=SESSION),
            await determine(server.addresses[0], target("/usr/bin/rm", "x", workdir="/var")),
        ]
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(lines) == 2
    fields = {"time", "decision_id", "session_id", "labels", "program", "argv", "workdir", "decision",
              "rule_id", "reason", "approver", "latency_ms"}
    assert all(fields <= set(line) for line in lines)
    first, second = lines
    assert first["decision_id"] == decisions[0].decision_id and first["decision"] == "run"
    assert first["session_id"] == "s-1" and first["labels"] == {"agent": "a1"}
    assert first["program"] == "/usr/bin/echo" and first["argv"] == ["echo", "a b"] and first["workdir"] == "/tmp"
    assert first["rule_id"] == "echo-run" and first["reason"] == "echo is harmless" and first["approver"] == ""
    assert isinstance(first["latency_ms"], float) and 0 <= first["latency_ms"] < 5000
    assert first["time"].endswith("Z")
    assert second["decision"] == "deny" and second["reason"] == "no deleting" and second["workdir"] == "/var"
    assert stat.S_IMODE(os.stat(log_path).st_mode) == 0o600


async def test_granted_profile_writes_the_working_dir_only_where_the_session_could(service) -> None:
    profile = pb.Permissions(network=True)
    sandboxed = pb.SessionContext(session_id="s-3", sandbox=pb.Permissions(writable_roots=["/srv/ws"]))
    async with service() as server:
        address = server.addresses[0]
        elsewhere = await prepare(address, target("/usr/bin/env", workdir="/etc"), pb.Execution(permissions=profile), sandboxed)

    cmd = list(elsewhere.command)
    binds = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--bind-try"]
    assert binds == ["/srv/ws"]  # `cd /etc; git clone …` cannot make /etc writable


async def test_a_session_without_a_sandbox_gets_no_less_than_its_shell(service) -> None:
    """Issue #12 item 8: with no sandbox, a permissions profile is the plain program, as the
    shell would run it (a private /tmp hid ../a from git pull, a read-only HOME broke npm)."""
    unconfined = pb.SessionContext(session_id="s-4")
    async with service() as server:
        address = server.addresses[0]
        got = {
            name: await prepare(address, target("/usr/bin/env", "-0", workdir=workdir), execution, unconfined)
            for name, workdir, execution in (
                ("network", "/srv/proj", pb.Execution(permissions=pb.Permissions(network=True))),
                ("offline", "/", pb.Execution(permissions=pb.Permissions(writable_roots=["/var/cache/x"]))),
                ("session", "/srv/proj", pb.Execution(session_default=pb.SessionDefault())),
            )
        }
    for name, prepared in got.items():
        assert list(prepared.command) == ["/usr/bin/env", "-0"] and prepared.arg0 == "env", name
        # The environment is still the rule's allowlist, not the caller's.
        assert "LD_PRELOAD" not in prepared.env and prepared.env["PATH"] == SAFE_PATH, name


SET_ENV_RULES = '''
[[rule]]
id = "git-net"
program = "git"
prefix = [["ls-remote", "pull"]]
decision = "escalate"
execution = { network = true }
allow_env = ["GIT_TERMINAL_PROMPT"]
set_env = { GIT_SSH_COMMAND = "ssh -o BatchMode=yes", GIT_NEW = "1" }

[[rule]]
id = "git-ask"
program = "git"
prefix = ["push"]
decision = "prompt"
allow_env = ["GIT_TERMINAL_PROMPT"]
set_env = { GIT_SSH_COMMAND = "ssh -o BatchMode=yes" }
'''


async def test_set_env_reaches_the_command_and_withheld_variables_are_noted(service, short_tmp: Path) -> None:
    from execgate.policy_service import rules as rules_api

    path = short_tmp / "set-env.toml"
    path.write_text(SET_ENV_RULES)
    store = rules_api.RulesStore([path])
    caller = {"GIT_SSH_COMMAND": "echo FAKE; false", "GIT_SSH": "/bin/false", "GIT_TERMINAL_PROMPT": "0",
              "LD_PRELOAD": "/x.so", "PWD": "/tmp"}
    tgt = target("/usr/bin/git", "ls-remote", "ssh://h/x")
    async with service(rules=store) as server, grpc.aio.insecure_channel(server.addresses[0]) as channel:
        stub = policy_pb2_grpc.EscalationPolicyStub(channel)
        decided = (await stub.DetermineAction(pb.DetermineActionRequest(session=SESSION, target=tgt, env=caller),
                                              timeout=5)).decision
        prepared = (await stub.PrepareEscalatedExec(pb.PrepareEscalatedExecRequest(
            session=SESSION, target=tgt, env=caller, execution=decided.escalate.execution), timeout=5)).prepared
        quiet = (await stub.DetermineAction(pb.DetermineActionRequest(
            session=SESSION, target=tgt, env={"GIT_TERMINAL_PROMPT": "0", "LD_PRELOAD": "/x.so"}), timeout=5)).decision
        broker = server.decisions.approvals
        async with broker.subscribe() as queue:  # an approver, connected before the prompt
            pending = asyncio.ensure_future(stub.DetermineAction(pb.DetermineActionRequest(
                session=SESSION, target=target("/usr/bin/git", "push"), env=caller), timeout=5))
            request = await asyncio.wait_for(queue.get(), 5)
            await broker.resolve(request.request_id, "once", approver="t")
            approved = (await pending).decision
    # The rule's values win over the caller's; the caller's GIT_SSH* never pass; nothing else does.
    assert dict(prepared.env) == {"GIT_SSH_COMMAND": "ssh -o BatchMode=yes", "GIT_NEW": "1",
                                  "GIT_TERMINAL_PROMPT": "0", "PATH": SAFE_PATH}
    # One note names what the caller set and did not get, and what the rule set instead.
    assert decided.WhichOneof("action") == "escalate"
    assert "without your GIT_SSH, GIT_SSH_COMMAND" in decided.note
    assert "GIT_SSH_COMMAND='ssh -o BatchMode=yes' is the rule's own" in decided.note
    assert 'allow_env = ["GIT_SSH"]' in decided.note and "LD_PRELOAD" not in decided.note
    assert quiet.WhichOneof("action") == "escalate" and quiet.note == ""  # nothing withheld: no note
    # A prompt shows the approver the environment with the rule's values; approved, it notes too.
    assert dict(request.env)["GIT_SSH_COMMAND"] == "ssh -o BatchMode=yes"
    assert approved.WhichOneof("action") == "escalate" and "without your GIT_SSH, GIT_SSH_COMMAND" in approved.note
