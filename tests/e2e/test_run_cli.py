"""``execgate run`` as a user meets it: denials that the script survives, ``--json`` results,
``--timeout`` killing everything the script started, the sandbox note, bad rules files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from run_support import CLI, audit_records, execgate, processes_with_argv, write_rules

pytestmark = pytest.mark.e2e

PRIVILEGE_REASON = "privilege escalation is not allowed; ask the operator to change the environment instead"


@pytest.mark.parametrize("wrapper", ["native", "python"])
def test_denied_command_prints_reason_and_script_carries_on(tmp_path, wrapper):
    log = tmp_path / "audit.jsonl"
    done = execgate("run", "-q", "--sandbox", "none", "--wrapper", wrapper, "--audit-log", str(log),
                    "--cwd", str(tmp_path), "--", 'su -c true; echo "status=$?"; echo after')
    assert done.stdout == "status=1\nafter\n"
    assert done.stderr == f"Execution denied: {PRIVILEGE_REASON}\n"
    assert done.returncode == 0
    denied = [r for r in audit_records(log) if r["decision"] == "deny"]
    assert [(r["argv"], r["rule_id"], r["reason"]) for r in denied] == [(["su", "-c", "true"], "privilege-tools", PRIVILEGE_REASON)]


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_json_result_matches_the_script(tmp_path, sandbox):
    script = 'echo out; echo err >&2; printf "%s" "$(su -c true 2>&1)" >&2; echo; exit 3'
    done = execgate("run", "-q", "--json", "--sandbox", sandbox, "--cwd", str(tmp_path), "--", script)
    result = json.loads(done.stdout)
    assert done.returncode == 3
    assert result["exit_code"] == 3 and result["timed_out"] is False
    assert result["stdout"] == "out\n\n"
    assert result["stderr"] == f"err\nExecution denied: {PRIVILEGE_REASON}"
    assert sorted(result["output"]) == sorted(result["stdout"] + result["stderr"])
    assert result["duration"] >= 0
    assert done.stderr == ""
    # The same script outside execgate (su replaced by the denial it gets) gives the same bytes.
    plain = subprocess.run(["bash", "-c", script.replace("su -c true", f"echo 'Execution denied: {PRIVILEGE_REASON}'")],
                           capture_output=True, text=True, timeout=30, check=False)
    assert (plain.returncode, plain.stdout, plain.stderr) == (3, result["stdout"], result["stderr"])


def _sleeps_and_rules(tmp_path, inside_s: str, outside_s: str):
    """Two unique `sleep` arguments, and a rules file escalating (unsandboxed) the second one."""
    token = f"{os.getpid()}{time.monotonic_ns() % 100000}"
    inside, outside = f"{inside_s}.{token}", f"{outside_s}.{token}"
    rules = write_rules(tmp_path / "rules.toml", f"""
[[rule]]
id = "sleep-out"
program = "sleep"
prefix = ["{outside}"]
decision = "escalate"
execution = "unsandboxed"
""")
    return inside, outside, rules


def test_timeout_kills_sandboxed_and_escalated_children(tmp_path):
    inside, outside, rules = _sleeps_and_rules(tmp_path, "300", "301")
    log = tmp_path / "audit.jsonl"
    proc = subprocess.Popen(
        [*CLI, "run", "--sandbox", "bwrap", "--rules", str(rules), "--audit-log", str(log), "--timeout", "2",
         "--cwd", str(tmp_path), "--", f"sleep {inside} & sleep {outside}; echo never"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update(a for a in (inside, outside) if processes_with_argv(["sleep", a]))
            time.sleep(0.05)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert seen == {inside, outside}, "both sleeps ran"
    assert proc.returncode == 124
    assert out == ""
    assert "timed out after 2 s" in err
    assert processes_with_argv(["sleep", inside]) == []
    assert processes_with_argv(["sleep", outside]) == []
    decisions = {r["argv"][1]: r["decision"] for r in audit_records(log) if r["argv"][0] == "sleep"}
    assert decisions == {inside: "run", outside: "escalate"}


def test_sandbox_auto_says_what_it_chose(tmp_path):
    done = execgate("run", "--sandbox", "auto", "--cwd", str(tmp_path), "--", "echo ok")
    assert done.returncode == 0 and done.stdout == "ok\n"
    notes = [line for line in done.stderr.splitlines() if line.startswith("execgate: sandbox: ")]
    assert len(notes) == 1
    assert notes[0].startswith(("execgate: sandbox: bwrap (auto:", "execgate: sandbox: none ("))
    quiet = execgate("run", "-q", "--sandbox", "auto", "--cwd", str(tmp_path), "--", "echo ok")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "ok\n", "")


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ('program = "git"\nprefix = ["push"]\ndecision = "deny"\nmatch = ["git status"]',
         "match example 'git status' is not matched"),
        ('program = "git"\ndecision = "maybe"', "decision must be one of"),
    ],
    ids=["failing-example", "bad-decision"],
)
def test_bad_rules_file_exits_2_naming_file_and_rule(tmp_path, body, complaint):
    rules = write_rules(tmp_path / "broken.toml", f'[[rule]]\nid = "good"\nprogram = "ls"\ndecision = "run"\n\n[[rule]]\nid = "the-bad-one"\n{body}\n')
    marker = tmp_path / "ran"
    done = execgate("run", "-q", "--sandbox", "none", "--rules", str(rules), "--cwd", str(tmp_path), "--", f"touch {marker}")
    assert done.returncode == 2
    assert done.stdout == ""
    assert str(rules) in done.stderr and "'the-bad-one' (#2)" in done.stderr and complaint in done.stderr
    assert not marker.exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_signal_to_execgate_run_kills_sandboxed_and_escalated_children(tmp_path, signum):
    inside, outside, rules = _sleeps_and_rules(tmp_path, "302", "303")
    proc = subprocess.Popen(
        [*CLI, "run", "-q", "--sandbox", "none", "--rules", str(rules), "--cwd", str(tmp_path), "--",
         f"sleep {inside} & sleep {outside}; echo never"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            processes_with_argv(["sleep", inside]) and processes_with_argv(["sleep", outside])
        ):
            time.sleep(0.05)
        assert processes_with_argv(["sleep", inside]) and processes_with_argv(["sleep", outside]), "both sleeps ran"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signum
    assert out == ""
    assert f"execgate: {signal.Signals(signum).name}; killed everything the script started" in err
    assert processes_with_argv(["sleep", inside]) == []
    assert processes_with_argv(["sleep", outside]) == []


FAKE_PATCHED_SHELL = """#!{python}
# A minimal shell that honours EXEC_WRAPPER as Codex's patched bash does: each ';'-separated
# command runs as `EXEC_WRAPPER FILE ARGV0 ARGV1 ...`; prints each status.
import os, shlex, shutil, subprocess, sys
script = sys.argv[sys.argv.index("-c") + 1] if "-c" in sys.argv else sys.argv[sys.argv.index("-lc") + 1]
for command in script.split(";"):
    argv = shlex.split(command)
    wrapper = os.environ.get("EXEC_WRAPPER")
    run = [wrapper, shutil.which(argv[0]) or argv[0], *argv] if wrapper else argv
    status = subprocess.run(run, pass_fds=[int(os.environ.get("CODEX_ESCALATE_SOCKET", "0"))]).returncode
    print(f"status={{status}}", flush=True)
"""


@pytest.mark.parametrize("wrapper", ["native", "python"])
def test_exec_wrapper_interception_with_a_shell_that_honours_it(tmp_path, wrapper):
    shell = tmp_path / "patched-sh"
    shell.write_text(FAKE_PATCHED_SHELL.format(python=sys.executable))
    shell.chmod(0o755)
    log = tmp_path / "audit.jsonl"
    done = execgate("run", "-q", "--sandbox", "none", "--intercept", "exec-wrapper", "--wrapper", wrapper,
                    "--shell", str(shell), "--audit-log", str(log), "--cwd", str(tmp_path), "--",
                    "echo gated; su -c true")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "gated\nstatus=0\nstatus=1\n"
    assert done.stderr == f"Execution denied: {PRIVILEGE_REASON}\n"
    assert [(r["argv"], r["decision"]) for r in audit_records(log)] == [
        (["echo", "gated"], "run"), (["su", "-c", "true"], "deny")]


def test_exec_wrapper_interception_refuses_a_stock_shell(tmp_path):
    done = execgate("run", "-q", "--intercept", "exec-wrapper", "--shell", "bash", "--cwd", str(tmp_path), "--",
                    "touch ran")
    assert done.returncode == 2
    assert "does not honour EXEC_WRAPPER" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_bad_options_are_one_line_errors(tmp_path):
    for args, message in [
        (["--timeout", "nan"], "must be a finite number of seconds > 0"),
        (["--timeout", "-1"], "must be a finite number of seconds > 0"),
        (["--token-file", str(tmp_path / "absent"), "--policy", "unix:///nowhere"], "No such file or directory"),
        (["--cwd", str(tmp_path / "absent")], "not a directory"),
        (["--label", "novalue"], "--label wants KEY=VALUE"),
        (["--tls"], "--tls* options need --policy HOST:PORT"),
        (["--policy", "unix:///nowhere", "--tls-ca", str(tmp_path / "ca.pem")], "TLS is for TCP addresses"),
        (["--policy", "127.0.0.1:1", "--tls-ca", str(tmp_path / "absent.pem")], "No such file or directory"),
        # A policy address is checked at start, not at the first exec (a new user's trial, 2026-12-02).
        (["--policy", "/run/p.sock"], "give unix:///path or host:port (a socket path is written unix:///run/p.sock)"),
        (["--policy", "bogus://x"], "--policy bogus://x: give unix:///path or host:port"),
        (["--policy", "127.0.0.1:notaport"], "give unix:///path or host:port"),
    ]:
        done = execgate("run", "-q", *args, "--", "touch ran", cwd=tmp_path)
        assert done.returncode == 2, args
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert not (tmp_path / "ran").exists()


def test_an_oversized_environment_is_e2big_as_without_execgate(tmp_path):
    script = "export BIG=$(head -c 200000 /dev/zero | tr '\\0' x); /bin/true; echo st=$?"
    plain = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    gated = execgate("run", "-q", "--sandbox", "none", "--cwd", str(tmp_path), "--", script)
    assert plain.stdout == "st=126\n" and "Argument list too long" in plain.stderr
    assert gated.stdout == "st=126\n"
    assert "Argument list too long" in gated.stderr, gated.stderr


def test_the_callers_ld_preload_is_kept_after_the_shim(tmp_path):
    from execgate.wrapper.artifacts import preload_ld_value

    env = {**os.environ, "LD_PRELOAD": "libm.so.6"}
    done = execgate("run", "-q", "--sandbox", "none", "--cwd", str(tmp_path), "--", "/usr/bin/printenv LD_PRELOAD",
                    env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{preload_ld_value()}:libm.so.6\n"


def test_embedded_service_decides_in_process_without_grpc(tmp_path):
    """Issue #11 (cold start): without --policy, --metrics, tracing or --approver-wait the embedded
    service decides in execgate's own process: grpc, protobuf, prometheus_client and OpenTelemetry
    are never imported, and every exec is still decided and audited (one line for /bin/true). The
    cyclic garbage collector, off through the set-up, is on again."""
    log = tmp_path / "audit.jsonl"
    heavy = ("grpc", "google.protobuf", "prometheus_client", "opentelemetry")
    probe = ("import gc, sys; from execgate.server import cli; "
             f"status = cli.main(['run', '-q', '--sandbox', 'none', '--audit-log', {str(log)!r}, "
             f"'--cwd', {str(tmp_path)!r}, '--', '/bin/true']); "
             f"print(status, [m for m in {heavy!r} if m in sys.modules], gc.isenabled())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env,
                          check=False)
    assert done.stdout.split("\n")[-2] == "0 [] True", done.stdout + done.stderr
    records = audit_records(log)
    assert [(r["program"], r["decision"], r["error"]) for r in records] == [("/bin/true", "run", False)]
