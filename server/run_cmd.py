"""``execgate run``: run a script under a shell in a new session, every exec gated (docs/DESIGN.md §3, §7).

The pieces, in order: choose the wrapper (native or Python) and the interception (preload shim or
an ``EXEC_WRAPPER``-honouring shell); choose the sandbox (bubblewrap or none) and the containment
(a cgroup per session, else this process as child subreaper: :mod:`.containment`); reach a policy
service — a running one (``--policy``) through the gRPC client, or the embedded one, deciding in
this process (:mod:`execgate.policy_service.inprocess`; on a private Unix socket behind the same
gRPC client only when ``--approver-wait``, ``--metrics``, tracing or ``--cache-ttl`` needs its
gRPC side); then :meth:`EscalateServer.exec` with the output streamed live through a back-pressured
writer that holds none of it (or, with ``--json``, captured up to ``--max-capture``
bytes per stream and printed as JSON; :mod:`execgate.server.output`). ``execgate run`` exits with
the script's status.

Start-up time is paid by every run (BENCHMARKS.md, cold start): gRPC, protobuf, prometheus_client
and OpenTelemetry are imported only on the paths that use them; the seccomp backstop's probe and
the containment's (each waiting on child processes) run in a thread from the start
(:class:`_Probes`) while asyncio and the rest are imported; the cyclic garbage collector is off
until the session's shell is spawned (:func:`collect_from_now`); and the process ends with
``os._exit`` once everything it opened is closed (:func:`execgate.server.cli.main`).

How the policy service is reached, its credentials and prompts without a sandbox:
:mod:`execgate.server.run_policy`. The script's stdin, stdout and stderr — passed through, or a pty
of its own at a terminal, where execgate itself asks the embedded service's prompts:
:mod:`execgate.server.run_stdio`.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

# asyncio is imported where it is used: a cold start imports it while the probes run (_Probes).


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
    parser.add_argument("script", metavar="WORD", nargs="+",
                        help="one word: a shell script (e.g. 'make && make test'); several words: a "
                             "command and its arguments, run exactly as given (like sudo or env)")
    pol = parser.add_mutually_exclusive_group()
    pol.add_argument("--rules", metavar="FILE", action="append", default=[],
                     help="rules for the embedded policy service, layered on top of the shipped default "
                          "rules (repeatable; 'default' names the shipped file)")
    parser.add_argument("--no-default-rules", action="store_true",
                        help="do not load the shipped default rules under --rules")
    pol.add_argument("--policy", metavar="ADDRESS",
                     help="a running policy service (unix:///path or host:port), or several replicas balanced "
                          "round-robin (ipv4:HOST:PORT1,HOST:PORT2 or dns:///NAME:PORT)")
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
                             "real (the default without a sandbox): your real HOME, writable by the session (in a "
                             "sandbox too): it gets your dotfiles and credentials; DIR: like private, in DIR, kept")
    parser.add_argument("--seccomp", choices=("auto", "on", "off"), default="auto",
                        help="seccomp backstop: every exec of the session reaches the gate, whatever made it "
                             "(static and Go programs, raw system calls); auto: on where the kernel allows it (default)")
    parser.add_argument("--containment", choices=("auto", "cgroup", "subreaper"), default="auto",
                        help="how every process of the session dies with it: a cgroup v2 killed with cgroup.kill, "
                             "or this process as child subreaper killing the orphans; auto: cgroup where it works "
                             "here (default)")
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
    parser.add_argument("--cache-ttl", metavar="SECONDS", type=_seconds_or_zero, default=None,
                        help="reach the embedded service over gRPC with the decision cache: seconds a Run or "
                             "Deny of its rules is reused for the same program and file (each reuse is still "
                             "audited); 0: gRPC, no cache. Without it the embedded service decides in process "
                             "and caches nothing")
    parser.add_argument("--json", action="store_true",
                        help="print the result (exit_code, stdout, stderr, output, duration, timed_out, truncated) "
                             "as JSON instead of streaming")
    parser.add_argument("--max-capture", metavar="BYTES", type=_byte_count, default=None,
                        help="with --json: bytes kept of each of stdout, stderr and output (default 16777216, "
                             "16 MiB); the rest is read and dropped, counted in `truncated`")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="do not print the chosen sandbox, HOME, rules, seccomp backstop and containment on stderr")
    from execgate.server import telemetry

    telemetry.add_options(parser, service_name="execgate-run")
    # execgate.server.cli.main: nothing is left open at its end (exit_now); the cyclic garbage
    # collector stays off through the set-up until collect_from_now (gc_later).
    parser.set_defaults(func=main, exit_now=True, gc_later=True)


def _seconds_or_zero(text: str) -> float:
    """argparse type: a finite number of seconds >= 0."""
    return 0.0 if text.strip() in ("0", "0.0") else _seconds(text)


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
    from execgate.server.logfilter import RepeatLimit, VisibleFormatter

    for handler in logging.getLogger().handlers:  # a session could flood it, or draw on it
        handler.addFilter(RepeatLimit())
        handler.setFormatter(VisibleFormatter("execgate: %(levelname)s: %(message)s"))
    probes: _Probes | None = None
    try:
        probes = _Probes(args)  # first: they wait on child processes while the rest is imported
        import asyncio

        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(run(args, probes))
    except RunSetupError as exc:
        print(f"execgate run: {exc}", file=sys.stderr)
        return SETUP_FAILED
    except KeyboardInterrupt:
        return 130
    finally:
        if probes is not None:  # a run that stopped early: a cgroup being made gets its supervisor
            probes.settle()


def collect_from_now() -> None:
    """Turn the cyclic garbage collector back on (:func:`execgate.server.cli.main` keeps it off
    through the set-up) once everything the run keeps is made: what exists now is frozen
    (``gc.freeze``: never walked again, it lives as long as the run) and a session of hours
    collects its own garbage as usual."""
    import gc

    if not gc.isenabled():
        gc.freeze()
        gc.enable()


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


def _note(text: str) -> None:
    """A session's note for the user, on stderr (where the script's own stderr goes too), its
    control characters escaped: it names paths the session chose, and an escape sequence in one
    could repaint the terminal, an approval question on it included (found by review)."""
    from execgate.server.printable import visible
    from execgate.server.run_stdio import line_end

    print(f"execgate: note: {visible(text)}", file=sys.stderr, end=line_end(), flush=True)


@dataclass(frozen=True)
class _Plan:
    """What ``execgate run`` resolved from its options before starting anything."""

    shell: str
    wrapper: Path
    sandbox: object  # execgate.server.sandbox.ShellSandbox
    extra_env: object
    seccomp: tuple[str | None, str]  # (launcher path or None, note)
    home: object  # execgate.server.home.SessionHome
    containment: object  # execgate.server.containment.Containment
    workdir: str
    labels: dict[str, str]
    token: str | None
    tls: object  # grpc.ChannelCredentials or None
    metrics_listen: tuple[str, int] | None = None
    tracing: object = None  # execgate.server.telemetry.Tracing or None
    tmp: object = None  # execgate.server.home.SessionTmp: the private /tmp's host directory

    def cleanup(self) -> None:
        """Remove the private HOME and the private /tmp's directory (each if made here)."""
        try:
            self.home.cleanup()  # type: ignore[attr-defined]
        finally:
            if self.tmp is not None:
                self.tmp.cleanup()  # type: ignore[attr-defined]


class _Probes:
    """The seccomp backstop's probe and the containment's choice (a cgroup made and probed, its
    supervisor started: :func:`choose_containment`), run in a thread from the start of ``execgate
    run``: both mostly wait for child processes, which this process overlaps with its imports and
    the loading of the rules. :meth:`get` waits for one and returns it, or raises what it raised."""

    def __init__(self, args: argparse.Namespace) -> None:
        # Every module the probes need is imported here, before the thread starts: two threads
        # importing at once could meet a module half made.
        import subprocess  # noqa: F401

        import execgate.server.containment  # noqa: F401
        import execgate.wrapper.artifacts  # noqa: F401
        from execgate.server.run_intercept import choose_seccomp

        self._jobs = (("seccomp", choose_seccomp, args.seccomp), ("containment", choose_containment, args.containment))
        self._results: dict[str, tuple[bool, object]] = {}
        self._thread = threading.Thread(target=self._run, name="execgate-probes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for name, job, mode in self._jobs:
            try:
                self._results[name] = (True, job(mode))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller of get()
                self._results[name] = (False, exc)

    def settle(self) -> None:
        """Wait until the probes are done (a cgroup they made has its supervisor by then, which
        removes it when this process exits)."""
        self._thread.join()

    def get(self, name: str) -> object:
        self._thread.join()
        ok, value = self._results[name]
        if not ok:
            raise value  # type: ignore[misc]
        return value


def _plan(args: argparse.Namespace, probes: _Probes | None = None) -> _Plan:
    """Resolve the options. Raises RunSetupError with a one-line reason."""
    probes = probes if probes is not None else _Probes(args)
    from execgate.server.home import HomeError, SessionTmp, prepare_home, with_home, with_private_tmp
    from execgate.server.sandbox import SandboxError, choose_sandbox, unsafe_workdir

    if args.max_capture is not None and not args.json:
        raise RunSetupError("--max-capture is for --json (streamed output is never held)")
    if args.policy is not None and not args.policy.strip():
        raise RunSetupError("--policy: empty address (give unix:///path or host:port, or leave --policy out for the embedded service)")
    if args.policy is not None:
        from execgate.policy_service.transport import is_local_address

        try:
            is_local_address(args.policy)
        except ValueError:
            hint = f" (a socket path is written unix://{args.policy})" if args.policy.startswith("/") else ""
            raise RunSetupError(f"--policy {args.policy}: give unix:///path or host:port{hint}") from None
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
    from execgate.server.run_policy import policy_credentials, tls_credentials, token_from_file

    token = token_from_file(args.token_file)
    from execgate.server.run_intercept import interception_env, wrapper_path

    wrapper = wrapper_path(args.wrapper)
    visible, extra_env = interception_env(args.intercept, wrapper, shell)
    seccomp: tuple[str | None, str] = probes.get("seccomp")  # type: ignore[assignment]
    if seccomp[0] is not None:
        visible.append(str(Path(seccomp[0]).parent))
    # The audit log, read-only in the sandbox even inside its working directory (bound over
    # itself, its directories below the working directory bound onto themselves: no rename
    # either), so that the session cannot rewrite the record of its own execs. Made now: a
    # missing file would not be bound.
    # A symlink on its path is refused: the mount would hold what the link points to, and the
    # session could replace the link itself.
    audit = [] if args.sandbox == "none" or not getattr(args, "audit_log", None) else [os.path.abspath(args.audit_log)]
    try:
        for path in audit:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600))
            if os.path.realpath(path) != path:
                raise RunSetupError(f"--audit-log {args.audit_log}: its path goes through a symlink, which a sandboxed "
                                    f"session could replace; give the real path, {os.path.realpath(path)}")
    except OSError as exc:
        raise RunSetupError(f"--audit-log {audit[0]}: {exc.strerror}") from exc
    try:
        sandbox = choose_sandbox(args.sandbox, workdir=workdir, readable=[sys.prefix, sys.base_prefix, *visible],
                                 hidden=policy_credentials(args), protected=audit)
    except SandboxError as exc:
        raise RunSetupError(f"--sandbox bwrap: {exc}") from exc
    tls = tls_credentials(args)
    try:
        home = prepare_home(args.home, sandboxed=sandbox.mode == "bwrap", real_home=os.environ.get("HOME"))
    except HomeError as exc:
        raise RunSetupError(str(exc)) from exc
    from execgate.server import telemetry

    tmp = SessionTmp()
    try:
        # A working directory at or above the real HOME would show it, writable, over its mask.
        sandbox = with_home(sandbox, home)
        metrics_listen, tracing = telemetry.options(args, service_name="execgate-run")
        containment = probes.get("containment")
        # Last: the session's /tmp, a host directory that its sandboxed escalations bind at /tmp too.
        sandbox, tmp = with_private_tmp(sandbox)
    except (HomeError, telemetry.TelemetryError) as exc:
        home.cleanup()
        tmp.cleanup()
        raise RunSetupError(str(exc)) from exc
    except BaseException:
        home.cleanup()
        tmp.cleanup()
        raise
    return _Plan(shell, wrapper, sandbox, extra_env, seccomp, home, containment,
                 workdir, labels, token, tls, metrics_listen, tracing, tmp)


def choose_containment(mode: str) -> object:
    """Resolve ``--containment``: a cgroup per session where it works, else this process as child
    subreaper (docs/DESIGN.md §3; :mod:`execgate.server.containment`).

    Raises:
        RunSetupError: the mode asked for is unavailable here (the reason).
    """
    from execgate.server.containment import ContainmentError, choose

    try:
        return choose(mode, fallback="subreaper")
    except ContainmentError as exc:
        raise RunSetupError(f"--containment {mode}: {exc}") from exc


async def run(args: argparse.Namespace, probes: _Probes | None = None) -> int:
    """Run ``args.script`` as ``execgate run`` does; returns the exit status to use. A private
    HOME (``--home``) and the private /tmp's directory are removed afterwards, whatever happened.
    ``probes``: already started (:func:`main` starts them before importing asyncio)."""
    plan = _plan(args, probes)
    try:
        return await _run_planned(args, plan)
    finally:
        plan.cleanup()


async def _run_planned(args: argparse.Namespace, plan: _Plan) -> int:
    import asyncio

    from execgate.server.sandbox import SandboxError

    rules = rules_line(args)
    # Not silenced by --quiet: what the sandbox cannot keep from the session (ShellSandbox.start_warnings).
    for line in plan.sandbox.start_warnings(plan.workdir):  # type: ignore[attr-defined]
        print(f"execgate: warning: {line}", file=sys.stderr, flush=True)
    if not args.quiet:
        print(f"execgate: {plan.sandbox.note}", file=sys.stderr, flush=True)  # type: ignore[attr-defined]
        print(f"execgate: {plan.home.note}", file=sys.stderr, flush=True)  # type: ignore[attr-defined]
        print(f"execgate: {rules}", file=sys.stderr, flush=True)
        print(f"execgate: {plan.seccomp[1]}", file=sys.stderr, flush=True)
        print(f"execgate: {plan.containment.note}", file=sys.stderr, flush=True)  # type: ignore[attr-defined]
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
    import asyncio

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
    from execgate.server.run_policy import decides_in_process

    if decides_in_process(args, metrics=plan.metrics_listen is not None, tracing=plan.tracing is not None):
        return await _run_in_process(args, plan)
    import asyncio

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


async def _run_in_process(args: argparse.Namespace, plan: _Plan) -> int:
    """The embedded policy service deciding in this process (no gRPC, no metrics, no tracing:
    :func:`~execgate.server.run_policy.decides_in_process`)."""
    from execgate.server.run_policy import in_process_policy
    from execgate.server.run_stdio import script_stdio

    sandboxed = getattr(plan.sandbox, "mode", "none") != "none"
    async with in_process_policy(args, sandboxed) as service:
        async with script_stdio(args, service.broker if sandboxed else None) as stdio:  # type: ignore[attr-defined]
            result, cap = await _exec_script(args, plan, service.policy, stdio)  # type: ignore[attr-defined]
    return _finish(args, result, cap)


async def _run_gated(args: argparse.Namespace, plan: _Plan, telemetry) -> int:
    from execgate.server.grpc_policy import GrpcPolicy
    from execgate.server.run_policy import policy_address
    from execgate.server.run_stdio import script_stdio

    sandboxed = getattr(plan.sandbox, "mode", "none") != "none"
    async with policy_address(args, sandboxed, telemetry.service) as endpoint:
        token = plan.token if args.policy else endpoint.token
        policy = GrpcPolicy(endpoint.address, token=token, tls=plan.tls, metrics=telemetry.client)  # type: ignore[arg-type]
        try:
            async with script_stdio(args, endpoint.broker) as stdio:
                result, cap = await _exec_script(args, plan, policy, stdio)
        finally:
            await policy.aclose()
    return _finish(args, result, cap)


def _finish(args: argparse.Namespace, result, cap: int) -> int:  # type: ignore[no-untyped-def]
    """Print the ``--json`` result or the timeout line; the status ``execgate run`` exits with."""
    if args.json:
        print_json_result(result, cap)
    elif result.timed_out:
        print(f"execgate: timed out after {args.timeout:g} s; killed everything the script started", file=sys.stderr)
    return result.exit_code


async def _exec_script(args: argparse.Namespace, plan: _Plan, policy: object, stdio) -> tuple[object, int]:
    """Run the script in a session wired as ``stdio`` (:class:`~execgate.server.run_stdio.ScriptStdio`);
    returns the :class:`ExecResult` and the capture cap used."""
    from execgate.server.escalate_server import DEFAULT_MAX_CAPTURE, EscalateServer
    from execgate.wrapper.artifacts import NativeArtifactMissing, ctty_launcher_path

    try:
        ctty = str(ctty_launcher_path()) if stdio.ctty else None
    except NativeArtifactMissing as exc:
        raise RunSetupError(str(exc)) from exc
    server = EscalateServer(plan.shell, str(plan.wrapper), policy, launcher=plan.sandbox,  # type: ignore[arg-type]
                            extra_env=plan.extra_env,  # type: ignore[arg-type]
                            seccomp_launcher=plan.seccomp[0], on_note=_note, ctty_launcher=ctty,
                            containment=plan.containment)  # type: ignore[arg-type]
    # Streaming holds nothing (max_capture 0): chunks go straight to our stdout/stderr (or the
    # pty's to the terminal), through one pipe when those are one terminal or file (`2>&1`).
    cap = (DEFAULT_MAX_CAPTURE if args.max_capture is None else args.max_capture) if args.json else 0
    collect_from_now()
    result = await server.exec(
        script_text(args.script), plan.workdir, timeout_s=args.timeout, login=args.login,
        env={**os.environ, **plan.home.env},  # type: ignore[attr-defined]
        on_output=stdio.on_output, labels=plan.labels, max_capture=cap,
        stderr_to_stdout=stdio.stderr_to_stdout, stdio=stdio.stdio, ctty=stdio.ctty,
    )
    return result, cap


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
