"""The policy service process: a grpc.aio server with health checking and reflection.

:class:`PolicyServer` serves ``EscalationPolicy`` and ``Approvals`` over one
:class:`~execgate.policy_service.decisions.DecisionService`, plus the standard
``grpc.health.v1.Health`` and server reflection. :func:`serve_embedded` runs one inside the
caller's event loop on a private Unix socket (``execgate run`` without ``--policy``).

Shutdown: :meth:`PolicyServer.stop` first reports ``NOT_SERVING`` (so load balancers and
``execgate policy health`` see it go), then lets in-flight calls finish within the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import AsyncIterator, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from execgate.policy_service.approvals import ApprovalBroker
from execgate.policy_service.audit import AuditLog
from execgate.policy_service.decisions import DecisionService, RulesSource
from execgate.policy_service.servicer import ApprovalsServicer, EscalationPolicyServicer
from execgate.policy_service.transport import TlsFiles, TokenInterceptor, add_port
from execgate.v1 import approvals_pb2, approvals_pb2_grpc, policy_pb2, policy_pb2_grpc

log = logging.getLogger(__name__)

#: Full names of the services this server offers (as used by health checking and reflection).
SERVICE_NAMES: tuple[str, ...] = (
    policy_pb2.DESCRIPTOR.services_by_name["EscalationPolicy"].full_name,
    approvals_pb2.DESCRIPTOR.services_by_name["Approvals"].full_name,
)


class PolicyServer:
    """One grpc.aio server running the policy service.

    Args:
        decisions: the decision logic (its ``approvals`` broker backs the Approvals service).
        token: if set, every call except health checks needs ``authorization: Bearer <token>``.
    """

    def __init__(self, decisions: DecisionService, *, token: str | None = None) -> None:
        self.decisions = decisions
        interceptors = [TokenInterceptor(token)] if token else []
        self._server = grpc.aio.server(interceptors=interceptors)
        self._health = health.aio.HealthServicer()
        policy_pb2_grpc.add_EscalationPolicyServicer_to_server(EscalationPolicyServicer(decisions), self._server)
        approvals_pb2_grpc.add_ApprovalsServicer_to_server(ApprovalsServicer(decisions.approvals), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        self.addresses: list[str] = []

    def add_port(self, address: str, *, tls: TlsFiles | None = None) -> str:
        """Listen on ``address`` (before :meth:`start`); return the address clients should use.

        Raises:
            AddressError: see :func:`execgate.policy_service.transport.add_port`.
        """
        bound = add_port(self._server, address, tls)
        self.addresses.append(bound)
        return bound

    async def start(self) -> None:
        """Start serving and report ``SERVING`` for every service and for the server ("")."""
        await self._server.start()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("policy service listening on %s", ", ".join(self.addresses))

    async def stop(self, grace_s: float | None = 5.0) -> None:
        """Report ``NOT_SERVING``, then stop; in-flight calls get ``grace_s`` seconds to finish."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._server.stop(grace_s)

    async def wait_for_termination(self) -> None:
        """Return when the server has stopped."""
        await self._server.wait_for_termination()

    async def _set_health(self, status: int) -> None:
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status)


def load_rules(paths: Sequence[str | os.PathLike[str]], *, default: str = "run", defaults: bool = True):  # -> RulesStore
    """Load the rules engine's store (imported here: the engine is a separate module).

    ``paths`` layer on top of the shipped default rules unless ``defaults`` is False
    (:func:`execgate.policy_service.rules.layered_paths`; ``"default"`` names the shipped file).

    Raises:
        RulesError: a rules file is bad, or there are no rules at all.
    """
    from execgate.policy_service.rules import RulesStore, layered_paths

    return RulesStore(layered_paths(paths, defaults=defaults), default=default)


@contextlib.asynccontextmanager
async def running_service(
    rules: RulesSource,
    *,
    address: str,
    tls: TlsFiles | None = None,
    token: str | None = None,
    audit_log: str | os.PathLike[str] | None = None,
    approval_timeout_s: float = 60.0,
    approver_wait_s: float = 0.0,
    grace_s: float = 1.0,
    rules_poll_s: float = 1.0,
) -> AsyncIterator[PolicyServer]:
    """Run a policy service on ``address`` for the duration of the ``async with``.

    If ``rules`` has a ``watch(interval_s)`` coroutine (a RulesStore), it runs meanwhile, checking
    every ``rules_poll_s`` seconds, so that edited rules files are reloaded.

    Yields:
        The started server; ``server.addresses[0]`` is the bound address.

    Raises:
        AddressError: cannot listen. OSError: the audit log cannot be opened.
    """
    audit = AuditLog(audit_log) if audit_log else None
    broker = ApprovalBroker(timeout_s=approval_timeout_s, approver_wait_s=approver_wait_s)
    server = PolicyServer(DecisionService(rules, approvals=broker, audit=audit), token=token)
    watcher: asyncio.Task[None] | None = None
    try:
        server.add_port(address, tls=tls)
        await server.start()
        if callable(getattr(rules, "watch", None)):
            watcher = asyncio.create_task(rules.watch(rules_poll_s), name="execgate-rules-watch")  # type: ignore[attr-defined]
        yield server
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await server.stop(grace_s)
        if audit is not None:
            audit.close()


@contextlib.asynccontextmanager
async def serve_embedded(
    rules_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    default: str = "run",
    default_rules: bool = True,
    audit_log: str | os.PathLike[str] | None = None,
    approval_timeout_s: float = 60.0,
    approver_wait_s: float = 0.0,
) -> AsyncIterator[str]:
    """Run the policy service in this event loop on a private Unix socket.

    The socket lives in a fresh directory of mode 0700 (removed on exit), so only this user
    reaches it. ``rules_paths`` layer on top of the rules shipped in the package unless
    ``default_rules`` is False.

    Yields:
        The address to give :class:`~execgate.server.grpc_policy.GrpcPolicy` (``unix:///…``).

    Raises:
        RulesError: a rules file is bad.
    """
    rules = load_rules(rules_paths, default=default, defaults=default_rules)
    directory = tempfile.mkdtemp(prefix="execgate-policy-")
    try:
        async with running_service(
            rules,
            address=f"unix://{Path(directory) / 'policy.sock'}",
            audit_log=audit_log,
            approval_timeout_s=approval_timeout_s,
            approver_wait_s=approver_wait_s,
        ) as server:
            yield server.addresses[0]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
