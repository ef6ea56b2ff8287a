"""``execgate policy serve|check|health`` and ``execgate approve [--web]`` (see each parser's help).

``policy check`` comes from :mod:`execgate.policy_service.check` (the rules engine) when present.

``policy serve`` separates the two credentials (docs/DESIGN.md §8): ``--token-file`` guards the
decision endpoint (the escalation servers hold it; a session may be able to read it), and
``--approvals-token-file`` is then the only credential that authorises Approvals calls, on the
same listener or on a separate one (``--approvals-listen``). Keep the approvals token file and
socket where no session can read or reach them (another user's file, or under ``/tmp`` of the
host, which every bwrap sandbox hides).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import importlib
import logging
import signal
import socket
import sys

import grpc

from execgate.policy_service.transport import (AddressError, TlsFiles, client_credentials, is_local_address,
                                               is_loopback_host, read_token)
from execgate.server import telemetry

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``policy`` (serve, check, health) and ``approve`` to the ``execgate`` command line."""
    policy = subparsers.add_parser("policy", help="run or check the policy service")
    sub = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", required=True)
    _add_serve(sub)
    try:
        check = importlib.import_module("execgate.policy_service.check")
    except ModuleNotFoundError as exc:
        if exc.name != "execgate.policy_service.check":
            raise
    else:
        parser = sub.add_parser("check", help="check rules files and evaluate commands against them")
        check.add_arguments(parser)
        parser.set_defaults(func=check.run)
    health = sub.add_parser("health", help="exit 0 if the policy service reports SERVING")
    _add_client_options(health)
    health.set_defaults(func=_health)
    approve = subparsers.add_parser("approve", help="answer pending approvals from this terminal (y/s/n) "
                                                    "or, with --web, from a browser")
    _add_client_options(approve)
    approve.add_argument("--name", default=f"{getpass.getuser()}@{socket.gethostname()}",
                         help="approver name recorded in the audit log (default: user@host)")
    web = approve.add_argument_group("browser", "serve an approval page instead of asking on this terminal "
                                                "(needs the 'web' extra: pip install 'execgate[web]')")
    web.add_argument("--web", metavar="HOST:PORT", help="serve the page here (port 0: any free port; the URL "
                                                        "is printed)")
    web.add_argument("--web-token-file", metavar="FILE", help="login token for the page (default: a random "
                                                              "one, printed in the URL)")
    web.add_argument("--web-tls-cert", metavar="PEM", help="serve HTTPS with this certificate")
    web.add_argument("--web-tls-key", metavar="PEM", help="private key of --web-tls-cert")
    web.add_argument("--web-insecure", action="store_true",
                     help="serve plain HTTP on an address beyond loopback (the login token and every answer "
                          "cross the network in clear; e.g. inside a container published on loopback only)")
    approve.set_defaults(func=_approve)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve EscalationPolicy and Approvals over gRPC")
    p.add_argument("--listen", required=True, metavar="ADDRESS", help="unix:///path (mode 0600) or host:port")
    p.add_argument("--rules", nargs="+", action="extend", default=[], metavar="FILE",
                   help="rules files or directories (.toml, Codex .rules), layered on top of the shipped "
                        "rules ('default' names the shipped file)")
    p.add_argument("--no-default-rules", action="store_true",
                   help="do not load the shipped default rules under --rules")
    p.add_argument("--default", choices=("run", "escalate", "prompt", "deny"), default="run",
                   help="decision for commands no rule matches (default: run)")
    p.add_argument("--audit-log", metavar="FILE", help="append one JSON line per decision to FILE")
    p.add_argument("--tls-cert", metavar="PEM", help="server certificate (TCP only)")
    p.add_argument("--tls-key", metavar="PEM", help="server private key")
    p.add_argument("--tls-client-ca", metavar="PEM", help="require client certificates signed by this CA")
    p.add_argument("--token-file", metavar="FILE", help="require 'authorization: Bearer <token in FILE>'")
    p.add_argument("--approvals-listen", metavar="ADDRESS",
                   help="serve Approvals on this separate listener only (TCP needs --approvals-token-file)")
    p.add_argument("--approvals-token-file", metavar="FILE",
                   help="Approvals calls need 'authorization: Bearer <token in FILE>'; the --token-file token "
                        "is then refused for them")
    p.add_argument("--approval-timeout", type=float, default=60.0, metavar="S",
                   help="seconds a prompt waits for an answer before it is denied (default 60)")
    p.add_argument("--approver-wait", type=float, default=0.0, metavar="S",
                   help="seconds a prompt waits for an approver to connect when none is (default 0)")
    p.add_argument("--insecure", action="store_true",
                   help="allow plaintext (no --tls-cert) on a TCP address that is not loopback; anyone who "
                        "can reach it reads every request and its tokens")
    p.add_argument("--grace", type=float, default=5.0, metavar="S",
                   help="on SIGTERM, seconds in-flight calls get to finish (default 5)")
    p.add_argument("--rules-poll", type=float, default=1.0, metavar="S",
                   help="seconds between checks of the rules files for changes (default 1)")
    p.add_argument("--cache-ttl", type=float, default=60.0, metavar="S",
                   help="seconds an escalation server may reuse a Run or Deny the rules alone decided "
                        "(its decision cache; each reuse is still audited, marked cached); 0 disables "
                        "(default 60)")
    state = p.add_argument_group("replicas", "share pending approvals, session grants and the audit stream with "
                                             "other replicas through Redis (needs the 'redis' extra)")
    state.add_argument("--state", metavar="URL",
                       help="redis://[:PASSWORD@]HOST:PORT/DB, rediss://… (TLS) or unix:///PATH.sock; default: "
                            "in this process only. Health is NOT_SERVING and decisions fail closed while Redis "
                            "is out of reach")
    state.add_argument("--state-password-file", metavar="FILE",
                       help="the Redis password (instead of one in the URL, which other users may see in ps)")
    state.add_argument("--audit-stream-maxlen", type=int, default=100_000, metavar="N",
                       help="about how many decisions the Redis audit stream execgate:audit keeps (default 100000)")
    telemetry.add_options(p, service_name="execgate-policy")
    p.set_defaults(func=_serve)


def _add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True, metavar="ADDRESS", help="unix:///path or host:port")
    p.add_argument("--token-file", metavar="FILE", help="send 'authorization: Bearer <token in FILE>'")
    p.add_argument("--tls", action="store_true", help="use TLS (implied by the --tls-* options)")
    p.add_argument("--tls-ca", metavar="PEM", help="CA that signed the service's certificate")
    p.add_argument("--tls-cert", metavar="PEM", help="client certificate")
    p.add_argument("--tls-key", metavar="PEM", help="client private key")


def _run(coro) -> int:
    """Run ``coro`` on uvloop (chosen by loop factory, not a global policy)."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from execgate.policy_service.server import load_rules

    try:
        rules = load_rules(args.rules, default=args.default, defaults=not args.no_default_rules)
        token = read_token(args.token_file)
        approvals_token = read_token(args.approvals_token_file)
        _check_approvals_options(args.approvals_listen, token, approvals_token)
        state_password = _check_state_options(args)
        metrics_listen, tracing = telemetry.options(args, service_name="execgate-policy")
        if not (args.tls_cert or args.insecure):
            for flag, address in (("--listen", args.listen), ("--approvals-listen", args.approvals_listen)):
                if address and not is_local_address(address):
                    raise ValueError(f"{flag} {address}: plaintext on a non-loopback address; give --tls-cert "
                                     f"and --tls-key, listen on unix:// or 127.0.0.1, or pass --insecure")
    except Exception as exc:  # RulesError, OSError, ValueError: a one-line message, exit 2
        print(f"execgate policy serve: {exc}", file=sys.stderr)
        return 2
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert or args.tls_key else None
    from execgate.policy_service.rules import describe_paths

    log.info("rules in force: %s", describe_paths(rules.current.sources))
    if approvals_token is None and args.approvals_listen is None:
        log.warning("Approvals share the decision endpoint and its credential: a session that can reach "
                    "%s (or read the --token-file) can answer its own prompts; see --approvals-token-file "
                    "and --approvals-listen", args.listen)
    try:
        return _run(_serve_async(args, rules, tls, token, approvals_token, metrics_listen, tracing, state_password))
    finally:
        if tracing is not None:
            tracing.shutdown()  # export the spans still buffered


def _check_approvals_options(listen: str | None, token: str | None, approvals_token: str | None) -> None:
    """Refuse approvals settings that would let a holder of the decision token approve.

    Raises:
        ValueError: a TCP approvals listener without its own token, or the same token twice.
    """
    if listen and not listen.startswith("unix:") and not approvals_token:
        raise ValueError("--approvals-listen on TCP needs --approvals-token-file")
    if approvals_token is not None and approvals_token == token:
        raise ValueError("--approvals-token-file must hold a different token than --token-file")


def _check_state_options(args: argparse.Namespace) -> str | None:
    """Check ``--state`` and its options; return the password of ``--state-password-file``.

    Raises:
        ValueError: a bad URL, a password file without ``--state``, or a bad maximum length.
        ModuleNotFoundError: ``--state`` without redis-py (the ``redis`` extra).
        OSError: the password file cannot be read.
    """
    if not args.cache_ttl >= 0:
        raise ValueError("--cache-ttl must be 0 (no cache) or more seconds")
    if args.state is None:
        if args.state_password_file:
            raise ValueError("--state-password-file needs --state")
        return None
    if args.audit_stream_maxlen < 1:
        raise ValueError("--audit-stream-maxlen must be at least 1")
    try:
        from execgate.policy_service.state_redis import redact
    except ModuleNotFoundError as exc:
        raise ValueError(f"--state needs {exc.name} (pip install 'execgate[redis]')") from exc
    redact(args.state)  # ValueError for a URL that is not Redis's
    return read_token(args.state_password_file)


async def _serve_async(
    args: argparse.Namespace, rules, tls: TlsFiles | None, token: str | None, approvals_token: str | None,
    metrics_listen: tuple[str, int] | None = None, tracing: telemetry.Tracing | None = None,
    state_password: str | None = None,
) -> int:
    from execgate.policy_service.metrics import PolicyMetrics
    from execgate.policy_service.server import running_service

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if hasattr(rules, "reload"):
        loop.add_signal_handler(signal.SIGHUP, rules.reload)
    try:
        async with running_service(
            rules, address=args.listen, tls=tls, token=token, approvals_address=args.approvals_listen,
            approvals_token=approvals_token, audit_log=args.audit_log,
            approval_timeout_s=args.approval_timeout, approver_wait_s=args.approver_wait, grace_s=args.grace,
            rules_poll_s=args.rules_poll, metrics_listen=metrics_listen,
            metrics=PolicyMetrics(tracer_provider=tracing.provider if tracing else None),
            state=args.state, state_password=state_password, audit_stream_maxlen=args.audit_stream_maxlen,
            cache_ttl_s=args.cache_ttl,
        ) as server:
            if server.metrics_url:
                log.info("metrics on %s", server.metrics_url)
            if tracing is not None:
                log.info("traces exported over OTLP to %s", tracing.endpoint)
            await stop.wait()
            log.info("stopping: NOT_SERVING, %g s grace", args.grace)
    except (AddressError, OSError) as exc:
        print(f"execgate policy serve: {exc}", file=sys.stderr)
        return 2
    return 0


def client_channel(args: argparse.Namespace) -> grpc.aio.Channel:
    """A channel to ``args.policy`` honouring the --tls* options (create inside the running loop)."""
    creds = client_credentials(args.policy, args)
    return grpc.aio.secure_channel(args.policy, creds) if creds else grpc.aio.insecure_channel(args.policy)


def _metadata(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    token = read_token(args.token_file)
    return (("authorization", f"Bearer {token}"),) if token else ()


def _health(args: argparse.Namespace) -> int:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async def check() -> int:
        async with client_channel(args) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
            except grpc.aio.AioRpcError as exc:
                print(f"execgate policy health: {exc.code().name}: {exc.details()}", file=sys.stderr)
                return 1
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        print(status)
        return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1

    return _run(check())


def _approve(args: argparse.Namespace) -> int:
    if args.web:
        return _approve_web(args)
    from execgate.policy_service.approver import run_approver

    async def approve() -> int:
        async with client_channel(args) as channel:
            return await run_approver(channel, name=args.name, metadata=_metadata(args))

    with contextlib.suppress(KeyboardInterrupt):
        return _run(approve())
    return 130


def _approve_web(args: argparse.Namespace) -> int:
    try:
        from execgate.policy_service import web_approver
    except ModuleNotFoundError as exc:  # aiohttp comes with the 'web' extra only
        print(f"execgate approve: --web needs {exc.name} (pip install 'execgate[web]')", file=sys.stderr)
        return 2
    try:
        host, _ = web_approver.parse_listen(args.web)
        if not (args.web_tls_cert or args.web_insecure or is_loopback_host(host)):
            raise ValueError(f"--web {args.web}: a plain HTTP page beyond loopback would send the login token in "
                             "clear; give --web-tls-cert and --web-tls-key, listen on 127.0.0.1, or pass "
                             "--web-insecure")
        token = read_token(args.web_token_file)
        if token is not None:
            web_approver.TokenGate(token)  # too short: refused before anything starts
        tls = web_approver.tls_context(args.web_tls_cert, args.web_tls_key) if args.web_tls_cert else None
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        print(f"execgate approve: {exc}", file=sys.stderr)
        return 2

    async def serve() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        async with client_channel(args) as channel:
            with contextlib.suppress(asyncio.CancelledError):
                return await web_approver.serve_web(channel, listen=args.web, token=token, name=f"{args.name} (web)",
                                                    metadata=_metadata(args), tls=tls)
        return 0

    try:
        return _run(serve())
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # the address cannot be bound
        print(f"execgate approve: {exc}", file=sys.stderr)
        return 2
