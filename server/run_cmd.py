"""``execgate run``: run a script under a shell in a new session, every exec gated (docs/DESIGN.md §3, §7).

The pieces, in order: choose the wrapper (native or Python) and the interception (preload shim or
an ``EXEC_WRAPPER``-honouring shell); choose the sandbox (bubblewrap or none); reach a policy
service — a running one (``--policy``) or an embedded one on a private Unix socket, through the
same gRPC path; then :meth:`EscalateServer.exec` with the output streamed live through a
back-pressured writer that holds none of it (or, with ``--json``, captured up to ``--max-capture``
bytes per stream and printed as JSON; :mod:`execgate.server.output`). ``execgate run`` exits with
the script's status.

Prompts and the embedded service (docs/DESIGN.md §8): the embedded decision endpoint needs a
per-run token held only in this process's memory, and the process makes itself non-dumpable
(``PR_SET_DUMPABLE`` 0, prctl(2)) so that a process of the same user without ``CAP_SYS_PTRACE``
cannot read that memory through ``/proc/PID/mem``. The approvals endpoint is opened only with
``--approver-wait``, which prints the ``execgate approve`` command (socket and 0600 token file in
the service's private directory under ``/tmp``, which no bwrap sandbox sees). With no sandbox
(``--sandbox none``, or ``auto`` without bubblewrap) the shell has the user's full power and could
reach any approver of this process: the embedded service then denies every prompt, naming the
fix, and ``--approver-wait`` is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

#: Status of `execgate run` itself when it cannot start (bad option, bad rules, no sandbox).
SETUP_FAILED = 2


class RunSetupError(Exception):
    """Raised when ``execgate run`` cannot set up what its options ask for; the message says why."""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run",
        help="run a script under a shell with every exec gated",
        description=(
            "Run SCRIPT under a shell in a new execgate session. Every exec the shell and its "
            "children make is decided by the policy service: Run (in the sandbox), Escalate "
            "(outside it, wired to the caller's stdio) or Deny. Exits with the script's status."
        ),
        epilog=("examples:\n  execgate run -- 'git status && git push'     # one word: a shell script\n"
                "  execgate run -- python3 -c 'print(\"hi there\")'  # several words: a command, quoted exactly"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("script", metavar="SCRIPT", nargs="+",
                        help="one word: a shell script (e.g. 'make && make test'); several words: a "
                             "command and its arguments, run exactly as given (like sudo or env)")
    pol = parser.add_mutually_exclusive_group()
    pol.add_argument("--rules", metavar="FILE", action="append", default=[],
                     help="rules for the embedded policy service, layered on top of the shipped default "
                          "rules (repeatable; 'default' names the shipped file)")
    parser.add_argument("--no-default-rules", action="store_true",
                        help="do not load the shipped default rules under --rules")
    pol.add_argument("--policy", metavar="ADDRESS", help="a running policy service (unix:///path or host:port)")
    parser.add_argument("--token-file", metavar="FILE", help="bearer token for --policy")
    parser.add_argument("--tls", action="store_true", help="reach --policy over TLS (implied by the --tls-* options)")
    parser.add_argument("--tls-ca", metavar="PEM", help="CA that signed the policy service's certificate (default: system roots)")
    parser.add_argument("--tls-cert", metavar="PEM", help="client certificate for --policy")
    parser.add_argument("--tls-key", metavar="PEM", help="client private key for --policy")
    parser.add_argument("--shell", default="bash", help="shell to run SCRIPT with (default: bash)")
    parser.add_argument("--login", action="store_true", help="run the shell as a login shell (-lc)")
    parser.add_argument("--intercept", choices=("preload", "exec-wrapper"), default="preload",
                        help="preload: LD_PRELOAD shim for stock shells (default); exec-wrapper: the shell honours EXEC_WRAPPER")
    parser.add_argument("--wrapper", choices=("native", "python"), default="native",
                        help="execve wrapper run once per exec (default: native)")
    parser.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto",
                        help="auto: bwrap when it works here (default); bwrap: require it; none: unconfined")
    parser.add_argument("--home", metavar="private|real|DIR", default=None,
                        help="the session's HOME. private (the default with a sandbox): a fresh writable directory "
                             "(HOME, XDG_*_HOME, pip/npm/cargo/Go caches point into it; .gitconfig gets only your "
                             "user.name and user.email; removed at exit) and your real HOME is hidden; "
                             "real (the default without a sandbox): your real HOME, WRITABLE in the sandbox: the "
                             "session gets your dotfiles and credentials; DIR: like private, in DIR, kept")
    parser.add_argument("--seccomp", choices=("auto", "on", "off"), default="auto",
                        help="seccomp backstop: every exec of the session reaches the gate, whatever made it "
                             "(static and Go programs, raw system calls); auto: on where the kernel allows it (default)")
    parser.add_argument("--timeout", metavar="SECONDS", type=_seconds, default=None,
                        help="kill the script and everything it started after SECONDS (status 124)")
    parser.add_argument("--cwd", metavar="DIR", default=None, help="working directory (default: the current one)")
    parser.add_argument("--label", metavar="KEY=VALUE", action="append", default=[],
                        help="session label sent to the policy with every request (repeatable)")
    parser.add_argument("--audit-log", metavar="FILE", help="audit log (JSON lines) of the embedded policy service")
    parser.add_argument("--approver-wait", metavar="SECONDS", type=_seconds, default=None,
                        help="open the embedded service's approvals endpoint (its `execgate approve` command is "
                             "printed on stderr) and let each prompt wait SECONDS for an approver to connect; "
                             "needs a sandbox")
    parser.add_argument("--approval-timeout", metavar="SECONDS", type=_seconds, default=60.0,
                        help="seconds a prompt of the embedded service waits for an answer (default 60)")
    parser.add_argument("--json", action="store_true",
                        help="print the result (exit_code, stdout, stderr, output, duration, timed_out, truncated) "
                             "as JSON instead of streaming")
    parser.add_argument("--max-capture", metavar="BYTES", type=_byte_count, default=None,
                        help="with --json: bytes kept of each of stdout, stderr and output (default 16777216, "
                             "16 MiB); the rest is read and dropped, counted in `truncated`")
    parser.add_argument("-q", "--quiet", action="store_true", help="do not print the chosen sandbox on stderr")
    from execgate.server import telemetry

    telemetry.add_options(parser, service_name="execgate-run")
    parser.set_defaults(func=main)


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _byte_count(text: str) -> int:
    """argparse type: a whole number of bytes >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of bytes: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 bytes, got {text!r}")
    return value


def main(args: argparse.Namespace) -> int:
    # execgate's own messages share the script's stderr: say whose they are.
    logging.basicConfig(format="execgate: %(levelname)s: %(message)s", level=logging.WARNING)
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(run(args))
    except RunSetupError as exc:
        print(f"execgate run: {exc}", file=sys.stderr)
        return SETUP_FAILED
    except KeyboardInterrupt:
        return 130


def script_text(words: list[str]) -> str:
    """The shell text for ``execgate run -- WORDS…``: one word is a script, given as is; several
    words are one command and its arguments, each quoted exactly (the convention of ``sudo``,
    ``env`` and ``bwrap``): ``["python3", "-c", 'print("hi there")']`` runs that argv."""
    import shlex

    return words[0] if len(words) == 1 else shlex.join(words)


def rules_line(args: argparse.Namespace) -> str:
    """What ``execgate run`` says about the rules in force (``rules: default (…) + mine.toml``).

    Raises:
        RunSetupError: ``--no-default-rules`` without ``--rules``, or with ``--policy``.
    """
    if args.policy:
        if args.no_default_rules:
            raise RunSetupError("--no-default-rules is for the embedded policy service; a running one (--policy) has its own rules")
        return f"rules: those of the policy service at {args.policy}"
    from execgate.policy_service.rules import RulesError, describe_paths, layered_paths

    try:
        return "rules: " + describe_paths(layered_paths(args.rules, defaults=not args.no_default_rules))
    except RulesError as exc:
        raise RunSetupError(str(exc)) from exc


def parse_labels(items: list[str]) -> dict[str, str]:
    """``["k=v", …]`` → ``{"k": "v"}``. Raises RunSetupError on an item without ``=``."""
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RunSetupError(f"--label wants KEY=VALUE, got {item!r}")
        labels[key] = value
    return labels


def token_from_file(path: str | None) -> str | None:
    """``--token-file``'s token (see :func:`execgate.policy_service.transport.read_token`).

    Raises:
        RunSetupError: the file cannot be read or is empty.
    """
    from execgate.policy_service.transport import read_token

    try:
        return read_token(path)
    except OSError as exc:
        raise RunSetupError(f"--token-file {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise RunSetupError(f"--token-file: {exc}") from exc


def wrapper_path(kind: str) -> Path:
    """The execve wrapper executable for ``--wrapper native|python``. Raises RunSetupError."""
    if kind == "native":
        from execgate.wrapper.artifacts import NativeArtifactMissing, native_wrapper_path

        try:
            return native_wrapper_path()
        except NativeArtifactMissing as exc:
            raise RunSetupError(str(exc)) from exc
    beside = Path(sys.executable).parent / "execgate-wrapper"
    found = beside if beside.exists() else shutil.which("execgate-wrapper")
    if not found:
        raise RunSetupError("the Python wrapper `execgate-wrapper` is not installed next to this interpreter")
    return Path(found).absolute()


def shell_honours_exec_wrapper(shell: str) -> bool:
    """True if ``shell`` runs ``EXEC_WRAPPER FILE ARGV…`` instead of exec'ing FILE itself (Codex's
    patched bash and zsh do; stock shells do not, and would run everything unchecked)."""
    import subprocess

    env = {"PATH": os.environ.get("PATH", os.defpath), "EXEC_WRAPPER": "/bin/echo"}
    try:
        done = subprocess.run([shell, "-c", "/bin/true execgate-probe"], env=env, capture_output=True,
                              timeout=10, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"execgate-probe" in done.stdout


def interception_env(kind: str, wrapper: Path, shell: str) -> tuple[list[str], object]:
    """Paths the sandbox must keep visible, and the server's ``extra_env`` hook.

    Raises:
        RunSetupError: ``exec-wrapper`` with a shell that does not honour ``EXEC_WRAPPER``.
    """
    if kind == "exec-wrapper":
        if not shell_honours_exec_wrapper(shell):
            raise RunSetupError(
                f"--intercept exec-wrapper: {shell} does not honour EXEC_WRAPPER (a stock shell would "
                "run every command unchecked); use --intercept preload, or a patched shell"
            )
        return [str(wrapper.parent)], None
    from execgate.wrapper.artifacts import NativeArtifactMissing, preload_library_path
    from execgate.wrapper.interception import preload_extra_env

    try:
        shim = preload_library_path()
        extra_env = preload_extra_env(wrapper, base_ld_preload=os.environ.get("LD_PRELOAD") or None)
    except NativeArtifactMissing as exc:
        raise RunSetupError(str(exc)) from exc
    return [str(wrapper.parent), str(shim.parent)], extra_env


#: Why the embedded service denies prompts when the shell is not sandboxed.
NO_SANDBOX_PROMPTS = (
    "prompt denied: without a sandbox (--sandbox none) the shell has your full power and could answer "
    "its own prompt; use --sandbox bwrap, or --policy with a policy service whose approver the session "
    "cannot reach"
)


@dataclass(frozen=True)
class PolicyEndpoint:
    """The decision endpoint ``execgate run`` talks to, and the token for it (None: none)."""

    address: str
    token: str | None


def make_undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``: same-user processes without CAP_SYS_PTRACE can no longer
    ptrace this process or open its ``/proc/PID/mem``, ``environ`` or ``fd`` (proc(5),
    ptrace(2) "Ptrace access mode checking"). Reset by execve(2) in children. Best effort: a
    failure is logged, since the token is still in no file."""
    import ctypes

    pr_set_dumpable = 4  # <linux/prctl.h>
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        logging.getLogger(__name__).warning("prctl(PR_SET_DUMPABLE, 0) failed: errno %d", ctypes.get_errno())


@contextlib.asynccontextmanager
async def policy_address(args: argparse.Namespace, sandboxed: bool = True,
                         metrics: object = None) -> AsyncIterator[PolicyEndpoint]:
    """The policy service's endpoint: ``--policy``, or an embedded service for this run.

    Args:
        sandboxed: False when the shell runs without a sandbox: the embedded service then denies
            every prompt (:data:`NO_SANDBOX_PROMPTS`).
        metrics: the embedded service's :class:`~execgate.policy_service.metrics.PolicyMetrics`.

    Raises:
        RunSetupError: an option that does not fit, or the embedded service cannot start.
    """
    if args.policy:
        if args.audit_log or args.approver_wait is not None:
            raise RunSetupError("--audit-log and --approver-wait are for the embedded policy service; "
                                "a running one (--policy) has its own")
        if not sandboxed and not args.quiet:
            print("execgate: no sandbox: the shell can do anything your account can; prompts are safe only if "
                  "the policy service's approver and its credential are out of your account's reach",
                  file=sys.stderr, flush=True)
        yield PolicyEndpoint(args.policy, None)
        return
    if args.approver_wait is not None and not sandboxed:
        raise RunSetupError("--approver-wait: without a sandbox the shell could reach the approver and answer "
                            "its own prompts; use --sandbox bwrap, or --policy with a remote policy service")
    from execgate.policy_service.rules import RulesError
    from execgate.policy_service.server import serve_embedded

    make_undumpable()
    try:
        embedded = serve_embedded(
            args.rules, audit_log=args.audit_log, default_rules=not args.no_default_rules,
            approvals=args.approver_wait is not None,
            approver_wait_s=args.approver_wait or 0.0, approval_timeout_s=args.approval_timeout,
            no_approver_reason=None if sandboxed else NO_SANDBOX_PROMPTS, metrics=metrics,  # type: ignore[arg-type]
        )
        service = await embedded.__aenter__()
    except (RulesError, OSError) as exc:
        raise RunSetupError(f"cannot start the embedded policy service: {exc}") from exc
    try:
        if not sandboxed and not args.quiet:
            print("execgate: no sandbox: prompt rules are denied (the shell could answer its own prompts)",
                  file=sys.stderr, flush=True)
        if service.approvals_address is not None:
            print(f"execgate: approvals: execgate approve --policy {service.approvals_address} "
                  f"--token-file {service.approvals_token_file}", file=sys.stderr, flush=True)
        yield PolicyEndpoint(service.address, service.token)
    finally:
        await embedded.__aexit__(None, None, None)


def _note(text: str) -> None:
    """A session's note for the user, on stderr (where the script's own stderr goes too)."""
    print(f"execgate: note: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class _Plan:
    """What ``execgate run`` resolved from its options before starting anything."""

    shell: str
    wrapper: Path
    sandbox: object  # execgate.server.sandbox.ShellSandbox
    extra_env: object
    seccomp: tuple[str | None, str]  # (launcher path or None, note)
    home: object  # execgate.server.home.SessionHome
    workdir: str
    labels: dict[str, str]
    token: str | None
    tls: object  # grpc.ChannelCredentials or None
    metrics_listen: tuple[str, int] | None = None
    tracing: object = None  # execgate.server.telemetry.Tracing or None


def _plan(args: argparse.Namespace) -> _Plan:
    """Resolve the options. Raises RunSetupError with a one-line reason."""
    from execgate.server.home import HomeError, prepare_home, with_home
    from execgate.server.sandbox import SandboxError, choose_sandbox, unsafe_workdir

    if args.max_capture is not None and not args.json:
        raise RunSetupError("--max-capture is for --json (streamed output is never held)")
    if args.policy is not None and not args.policy.strip():
        raise RunSetupError("--policy: empty address (give unix:///path or host:port, or leave --policy out for the embedded service)")
    workdir = os.path.abspath(args.cwd or os.getcwd())
    if not os.path.isdir(workdir):
        raise RunSetupError(f"--cwd {workdir}: not a directory")
    # A sandboxed session's working directory becomes a writable root: never a system directory.
    if args.sandbox != "none" and (why := unsafe_workdir(workdir, os.environ.get("HOME"))) is not None:
        raise RunSetupError(f"--cwd: {why}")
    shell = shutil.which(args.shell)
    if shell is None:
        raise RunSetupError(f"--shell {args.shell}: not found")
    labels = parse_labels(args.label)
    token = token_from_file(args.token_file)
    wrapper = wrapper_path(args.wrapper)
    visible, extra_env = interception_env(args.intercept, wrapper, shell)
    seccomp = choose_seccomp(args.seccomp)
    if seccomp[0] is not None:
        visible.append(str(Path(seccomp[0]).parent))
    try:
        sandbox = choose_sandbox(args.sandbox, workdir=workdir, readable=[sys.prefix, sys.base_prefix, *visible],
                                 hidden=policy_credentials(args))
    except SandboxError as exc:
        raise RunSetupError(f"--sandbox bwrap: {exc}") from exc
    tls = tls_credentials(args)
    try:
        home = prepare_home(args.home, sandboxed=sandbox.mode == "bwrap", real_home=os.environ.get("HOME"))
    except HomeError as exc:
        raise RunSetupError(str(exc)) from exc
    from execgate.server import telemetry

    try:
        metrics_listen, tracing = telemetry.options(args, service_name="execgate-run")
    except telemetry.TelemetryError as exc:
        raise RunSetupError(str(exc)) from exc
    return _Plan(shell, wrapper, with_home(sandbox, home), extra_env, seccomp, home, workdir, labels, token, tls,
                 metrics_listen, tracing)


def policy_credentials(args: argparse.Namespace) -> list[str]:
    """Files of a remote policy service that the session must not reach: its Unix socket and the
    token and TLS key files ``execgate run`` uses (the decision endpoint is the server's, not the
    session's; docs/DESIGN.md §8). They are covered inside the sandbox (:class:`ShellSandbox`)."""
    from execgate.policy_service.transport import unix_path

    files = [args.token_file, args.tls_key] if args.policy else []
    if args.policy:
        files.append(unix_path(args.policy))
    return [os.path.abspath(f) for f in files if f]


def choose_seccomp(mode: str) -> tuple[str | None, str]:
    """Resolve ``--seccomp auto|on|off``: the launcher to use (None: no backstop) and a note
    ("seccomp backstop: on" / "off (why)") for the user.

    Raises:
        RunSetupError: ``on`` and the backstop cannot work here.
    """
    import subprocess

    from execgate.wrapper.artifacts import NativeArtifactMissing, seccomp_launcher_path

    if mode == "off":
        return None, "seccomp backstop: off (--seccomp off)"
    try:
        launcher = str(seccomp_launcher_path())
        done = subprocess.run([launcher, "--probe"], capture_output=True, text=True, timeout=10, check=False)
        reason = None if done.returncode == 0 else (done.stderr.strip() or f"probe status {done.returncode}")
    except (NativeArtifactMissing, OSError, subprocess.TimeoutExpired) as exc:
        launcher, reason = "", str(exc)
    if reason is None:
        return launcher, "seccomp backstop: on"
    if mode == "on":
        raise RunSetupError(f"--seccomp on: {reason}")
    return None, f"seccomp backstop: off ({reason})"



def tls_credentials(args: argparse.Namespace) -> object:
    """gRPC channel credentials for ``--policy`` from the --tls* options, or None for plaintext.

    Raises:
        RunSetupError: TLS without a TCP ``--policy``, or a PEM file that cannot be read.
    """
    if not args.policy and (args.tls or args.tls_ca or args.tls_cert or args.tls_key):
        raise RunSetupError("--tls* options need --policy HOST:PORT")
    from execgate.policy_service.transport import AddressError, client_credentials

    try:
        return client_credentials(args.policy or "", args)
    except (AddressError, OSError) as exc:
        raise RunSetupError(f"--tls: {exc}") from exc


async def run(args: argparse.Namespace) -> int:
    """Run ``args.script`` as ``execgate run`` does; returns the exit status to use. A private
    HOME (``--home``) is removed afterwards, whatever happened."""
    plan = _plan(args)
    try:
        return await _run_planned(args, plan)
    finally:
        plan.home.cleanup()  # type: ignore[attr-defined]


async def _run_planned(args: argparse.Namespace, plan: _Plan) -> int:
    from execgate.server.sandbox import SandboxError

    rules = rules_line(args)
    if not args.quiet:
        print(f"execgate: {plan.sandbox.note}", file=sys.stderr, flush=True)  # type: ignore[attr-defined]
        print(f"execgate: {plan.home.note}", file=sys.stderr, flush=True)  # type: ignore[attr-defined]
        print(f"execgate: {rules}", file=sys.stderr, flush=True)
        print(f"execgate: {plan.seccomp[1]}", file=sys.stderr, flush=True)
    received = _cancel_on_signals()
    try:
        return await _run_session(args, plan)
    except SandboxError as exc:  # e.g. a TMPDIR (socket directory) inside the working directory
        raise RunSetupError(f"sandbox: {exc}") from exc
    except asyncio.CancelledError:
        if not received:
            raise
        name = signal.Signals(received[0]).name
        print(f"execgate: {name}; killed everything the script started", file=sys.stderr)
        return 128 + received[0]


def _cancel_on_signals() -> list[int]:
    """SIGTERM and SIGHUP cancel the run as a timeout does (the shell's and every escalated
    process group are killed); returns the list the caught signal numbers are put in."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if task is not None:
            task.cancel()

    for signum in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, on_signal, signum)
    return received


async def _run_session(args: argparse.Namespace, plan: _Plan) -> int:
    from execgate.server.metrics import RunTelemetry

    try:
        telemetry = await asyncio.to_thread(RunTelemetry, plan.metrics_listen, plan.tracing, embedded=not args.policy)
    except OSError as exc:
        raise RunSetupError(f"--metrics {args.metrics}: {exc.strerror or exc}") from exc
    if telemetry.endpoint is not None:
        print(f"execgate: metrics: {telemetry.endpoint.url}", file=sys.stderr, flush=True)
    try:
        return await _run_gated(args, plan, telemetry)
    finally:
        await asyncio.to_thread(telemetry.close)


async def _run_gated(args: argparse.Namespace, plan: _Plan, telemetry) -> int:
    from execgate.server.escalate_server import DEFAULT_MAX_CAPTURE, EscalateServer
    from execgate.server.grpc_policy import GrpcPolicy
    from execgate.server.output import StdioWriter, same_file

    sandboxed = getattr(plan.sandbox, "mode", "none") != "none"
    async with policy_address(args, sandboxed, telemetry.service) as endpoint:
        token = plan.token if args.policy else endpoint.token
        policy = GrpcPolicy(endpoint.address, token=token, tls=plan.tls, metrics=telemetry.client)  # type: ignore[arg-type]
        try:
            server = EscalateServer(plan.shell, str(plan.wrapper), policy, launcher=plan.sandbox,  # type: ignore[arg-type]
                                    extra_env=plan.extra_env,  # type: ignore[arg-type]
                                    seccomp_launcher=plan.seccomp[0], on_note=_note)
            # Streaming holds nothing (max_capture 0): chunks go straight to our stdout/stderr,
            # through one pipe when those are one terminal or file (`2>&1`), to keep their order.
            cap = (DEFAULT_MAX_CAPTURE if args.max_capture is None else args.max_capture) if args.json else 0
            result = await server.exec(
                script_text(args.script), plan.workdir, timeout_s=args.timeout, login=args.login,
                env={**os.environ, **plan.home.env},  # type: ignore[attr-defined]
                on_output=None if args.json else StdioWriter(), labels=plan.labels, max_capture=cap,
                stderr_to_stdout=not args.json and same_file(1, 2),
            )
        finally:
            await policy.aclose()
    if args.json:
        print_json_result(result, cap)
    elif result.timed_out:
        print(f"execgate: timed out after {args.timeout:g} s; killed everything the script started", file=sys.stderr)
    return result.exit_code


def print_json_result(result: object, cap: int) -> None:
    """``--json``: the result on stdout, written piecewise (no second copy of the output in one
    string), and a one-line note on stderr if a stream was cut at ``cap`` bytes."""
    import json

    json.dump(result.to_dict(), sys.stdout)  # type: ignore[attr-defined]
    sys.stdout.write("\n")
    sys.stdout.flush()
    truncated = result.truncated  # type: ignore[attr-defined]
    if truncated:
        counts = ", ".join(f"{name} {n}" for name, n in truncated.items())
        print(f"execgate: --json: output truncated at {cap} bytes per stream; bytes dropped: {counts} "
              "(see --max-capture)", file=sys.stderr, flush=True)
