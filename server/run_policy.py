"""How ``execgate run`` reaches its policy service (docs/DESIGN.md §4, §8).

Either a running one (``--policy``, with ``--token-file`` and the ``--tls*`` files, which the
session's sandbox covers: :func:`policy_credentials`) or the embedded one. The embedded one decides
in this process (:func:`in_process_policy`, :mod:`execgate.policy_service.inprocess`: no endpoint)
unless ``--approver-wait``, ``--metrics``, tracing or ``--cache-ttl`` (the decision cache) needs its gRPC side
(:func:`decides_in_process`); then it runs on a private Unix socket (:func:`policy_address`),
reached through the gRPC client. That decision endpoint needs a per-run token held only in this
process's memory, and the process makes itself non-dumpable (``PR_SET_DUMPABLE`` 0, prctl(2)) so
that a process of the same user without ``CAP_SYS_PTRACE`` cannot read that memory through
``/proc/PID/mem`` (non-dumpable in both modes: the broker lives in its memory). Its approvals: the broker itself for an approver in this process (the terminal
approver, :mod:`execgate.server.run_stdio`), and an approvals endpoint only with
``--approver-wait``, whose ``execgate approve`` command is printed (socket and 0600 token file in
the service's private directory under ``/tmp``, which no bwrap sandbox sees). With neither a
terminal nor ``--approver-wait`` no approver can connect: prompts are denied with a reason that
says how to answer them (:func:`prompt_refusal`). With no sandbox
(``--sandbox none``, or ``auto`` without bubblewrap) the shell has the user's full power and could
reach any approver of this process: the embedded service then denies every prompt, naming the
fix, and ``--approver-wait`` is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, AsyncIterator

from execgate.server.run_cmd import RunSetupError


def token_from_file(path: str | None) -> str | None:
    """``--token-file``'s token (see :func:`execgate.policy_service.transport.read_token`).

    Raises:
        RunSetupError: the file cannot be read or is empty.
    """
    if not path:
        return None
    from execgate.policy_service.transport import read_token

    try:
        return read_token(path)
    except OSError as exc:
        raise RunSetupError(f"--token-file {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise RunSetupError(f"--token-file: {exc}") from exc



#: Why the embedded service denies prompts when the shell is not sandboxed.
NO_SANDBOX_PROMPTS = (
    "prompt denied: without a sandbox (--sandbox none) the shell has your full power and could answer "
    "its own prompt; use --sandbox bwrap, or --policy with a policy service whose approver the session "
    "cannot reach"
)


#: Why the embedded service denies prompts when no approver can ever answer them: no terminal to
#: ask at (stdin and stdout not one terminal, or ``--json``) and no ``--approver-wait``.
NO_APPROVER_PROMPTS = (
    "prompt denied: no approver can answer it: execgate run has no terminal to ask at (stdin and stdout "
    "are not one terminal, or --json) and no approvals endpoint; run it at a terminal, or pass "
    "--approver-wait SECONDS and answer with the `execgate approve --policy … --token-file …` command it prints"
)


@dataclass(frozen=True)
class PolicyEndpoint:
    """The decision endpoint ``execgate run`` talks to, and the token for it (None: none)."""

    address: str
    token: str | None
    broker: object = None  # the embedded service's ApprovalBroker for an in-process approver, or None


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
        if args.audit_log or args.approver_wait is not None or getattr(args, "cache_ttl", None) is not None:
            raise RunSetupError("--audit-log, --approver-wait and --cache-ttl are for the embedded policy "
                                "service; a running one (--policy) has its own")
        if not sandboxed and not args.quiet:
            print("execgate: no sandbox: the shell can do anything your account can; prompts are safe only if "
                  "the policy service's approver and its credential are out of your account's reach",
                  file=sys.stderr, flush=True)
        yield PolicyEndpoint(args.policy, None)
        return
    if args.approver_wait is not None and not sandboxed:
        raise RunSetupError("--approver-wait: without a sandbox the shell could reach the approver and answer "
                            "its own prompts; use --sandbox bwrap, or --policy with a remote policy service")
    from execgate.policy_service.server import serve_embedded

    make_undumpable()
    embedded = serve_embedded(
        args.rules, audit_log=args.audit_log, default_rules=not args.no_default_rules,
        approvals=args.approver_wait is not None,
        approver_wait_s=args.approver_wait or 0.0, approval_timeout_s=args.approval_timeout,
        no_approver_reason=prompt_refusal(args, sandboxed), metrics=metrics,  # type: ignore[arg-type]
        **({} if getattr(args, "cache_ttl", None) is None else {"cache_ttl_s": args.cache_ttl}),
    )
    service = await _enter_embedded(embedded, args, sandboxed)
    try:
        if service.approvals_address is not None:
            print(f"execgate: approvals: execgate approve --policy {service.approvals_address} "
                  f"--token-file {service.approvals_token_file}", file=sys.stderr, flush=True)
        yield PolicyEndpoint(service.address, service.token, service.broker if sandboxed else None)
    finally:
        await embedded.__aexit__(None, None, None)



def decides_in_process(args: argparse.Namespace, *, metrics: bool = False, tracing: bool = False) -> bool:
    """Whether ``execgate run`` decides in this process (:mod:`execgate.policy_service.inprocess`):
    the embedded service (no ``--policy``) when nothing needs its gRPC side — no approvals
    endpoint (``--approver-wait``), no ``--metrics`` endpoint (``metrics``), no tracing
    (``tracing``), no decision cache (``--cache-ttl``). Otherwise the embedded service runs on its private Unix socket
    (:func:`policy_address`) and is reached through the gRPC client, as a remote one is."""
    return (not args.policy and args.approver_wait is None and getattr(args, "cache_ttl", None) is None
            and not metrics and not tracing)


@contextlib.asynccontextmanager
async def in_process_policy(args: argparse.Namespace, sandboxed: bool = True) -> AsyncIterator[object]:
    """The embedded policy service deciding in this process
    (:class:`~execgate.policy_service.inprocess.EmbeddedPolicy`): same rules, audit log, approvals
    broker and prompt refusals as the gRPC embedded service of :func:`policy_address`, no endpoint.

    Raises:
        RunSetupError: the rules or the audit log cannot be loaded.
    """
    from execgate.policy_service.inprocess import embedded_policy

    make_undumpable()  # the terminal approver and the broker live in this process's memory
    embedded = embedded_policy(
        args.rules, audit_log=args.audit_log, default_rules=not args.no_default_rules,
        approval_timeout_s=args.approval_timeout, no_approver_reason=prompt_refusal(args, sandboxed),
    )
    service = await _enter_embedded(embedded, args, sandboxed)
    try:
        yield service
    finally:
        await embedded.__aexit__(None, None, None)


async def _enter_embedded(embedded: contextlib.AbstractAsyncContextManager[Any], args: argparse.Namespace,
                          sandboxed: bool) -> Any:
    """Enter an embedded policy service (either kind) and say at start that, without a sandbox, its
    prompts are denied. The caller exits it.

    Raises:
        RunSetupError: the rules or the audit log cannot be loaded.
    """
    from execgate.policy_service.rules import RulesError

    try:
        service = await embedded.__aenter__()
    except (RulesError, OSError) as exc:
        raise RunSetupError(f"cannot start the embedded policy service: {exc}") from exc
    if not sandboxed and not args.quiet:
        print("execgate: no sandbox: prompt rules are denied (the shell could answer its own prompts)",
              file=sys.stderr, flush=True)
    return service


def prompt_refusal(args: argparse.Namespace, sandboxed: bool) -> str | None:
    """Why the embedded service must deny every prompt of this run, or None if one can be
    answered: without a sandbox the shell could answer its own (:data:`NO_SANDBOX_PROMPTS`);
    with neither a terminal to ask at (:func:`~execgate.server.run_stdio.wants_pty`) nor
    ``--approver-wait`` no approver can ever connect, and the denial says how to get one
    (:data:`NO_APPROVER_PROMPTS`)."""
    from execgate.server.run_stdio import wants_pty

    if not sandboxed:
        return NO_SANDBOX_PROMPTS
    if args.approver_wait is None and not wants_pty(args):
        return NO_APPROVER_PROMPTS
    return None


def policy_credentials(args: argparse.Namespace) -> list[str]:
    """Files of a remote policy service that the session must not reach: its Unix socket and the
    token and TLS key files ``execgate run`` uses (the decision endpoint is the server's, not the
    session's; docs/DESIGN.md §8). They are covered inside the sandbox (:class:`ShellSandbox`)."""
    if not args.policy:
        return []
    from execgate.policy_service.transport import unix_path

    files = [args.token_file, args.tls_key, unix_path(args.policy)]
    return [os.path.abspath(f) for f in files if f]



def tls_credentials(args: argparse.Namespace) -> object:
    """gRPC channel credentials for ``--policy`` from the --tls* options, or None for plaintext.

    Raises:
        RunSetupError: TLS without a TCP ``--policy``, or a PEM file that cannot be read.
    """
    if not args.policy and (args.tls or args.tls_ca or args.tls_cert or args.tls_key):
        raise RunSetupError("--tls* options need --policy HOST:PORT")
    if not args.policy:
        return None
    from execgate.policy_service.transport import AddressError, client_credentials

    try:
        return client_credentials(args.policy, args)
    except (AddressError, OSError) as exc:
        raise RunSetupError(f"--tls: {exc}") from exc
