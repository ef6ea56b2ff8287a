"""The policy service process: grpc.aio servers with health checking and reflection.

:class:`PolicyServer` serves ``EscalationPolicy`` and/or ``Approvals`` over one
:class:`~execgate.policy_service.decisions.DecisionService`, plus the standard
``grpc.health.v1.Health`` and server reflection. :func:`running_service` runs one listener for
both services, or two — a decision endpoint and a separate approvals endpoint with its own
credential (docs/DESIGN.md §8). :func:`serve_embedded` runs the service inside the caller's event
loop on private Unix sockets: for API callers, and for ``execgate run`` without ``--policy`` when
``--approver-wait``, ``--metrics``, tracing or ``--cache-ttl`` needs the gRPC side (otherwise ``execgate run``
decides in process, :mod:`execgate.policy_service.inprocess`).

The embedded service's trust model (docs/DESIGN.md §8):

- its sockets live in a fresh 0700 directory made directly under ``/tmp`` (never ``$TMPDIR``:
  every bwrap sandbox hides the host's ``/tmp`` under a private tmpfs, while a ``TMPDIR`` chosen
  by the caller may lie inside a directory the sandbox sees or writes);
- the decision endpoint requires a random per-run token that exists only in this process's
  memory (never in a file or an environment variable);
- the approvals endpoint is opened only when asked for (``approvals=True``), on its own socket,
  with its own random token written to a 0600 file in that private directory for ``execgate
  approve --token-file``; the decision token never authorises it;
- an approver in the caller's own process (``execgate run``'s terminal approver) subscribes to
  the broker itself (:attr:`EmbeddedService.broker`), on no endpoint at all;
- a caller that cannot isolate its sessions (``--sandbox none``) passes ``no_approver_reason``:
  every prompt is then denied with that reason instead of being offered to an approver that the
  session itself could reach.

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
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Collection, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from execgate.policy_service.audit import AuditLog
from execgate.policy_service.decisions import DecisionService, RulesSource
from execgate.policy_service.metrics import PolicyMetrics, server_interceptors
from execgate.policy_service.servicer import ApprovalsServicer, EscalationPolicyServicer
from execgate.policy_service.state import open_state
from execgate.policy_service.transport import TlsFiles, TokenInterceptor, add_port, new_token, write_private_file
from execgate.server import protocol as p
from execgate.server.telemetry import MetricsEndpoint
from execgate.v1 import approvals_pb2, approvals_pb2_grpc, policy_pb2, policy_pb2_grpc

log = logging.getLogger(__name__)

POLICY_SERVICE = policy_pb2.DESCRIPTOR.services_by_name["EscalationPolicy"].full_name
APPROVALS_SERVICE = approvals_pb2.DESCRIPTOR.services_by_name["Approvals"].full_name
#: Full names of the services a combined server offers (as used by health checking and reflection).
SERVICE_NAMES: tuple[str, ...] = (POLICY_SERVICE, APPROVALS_SERVICE)

#: Where the embedded service makes its private directory: hidden inside every bwrap sandbox.
EMBEDDED_PARENT = "/tmp"


class PolicyServer:
    """One grpc.aio server running the policy service.

    Args:
        decisions: the decision logic (its ``approvals`` broker backs the Approvals service).
        token: if set, every call except health checks needs ``authorization: Bearer <token>``.
        approvals_token: if set, Approvals calls need this token instead (``token`` is refused
            for them); see :class:`~execgate.policy_service.transport.TokenInterceptor`.
        services: full names of the services to offer (default both, on one listener).
        metrics: where the EscalationPolicy servicer counts and traces (default: a private
            :class:`~execgate.policy_service.metrics.PolicyMetrics`); with its ``tracer_provider``
            set, every call but health checks also gets OpenTelemetry's gRPC server span.

    Attributes:
        addresses: the bound addresses, in the order added.
        approvals_address: where Approvals is served (set by :func:`running_service`), or None.
    """

    def __init__(
        self,
        decisions: DecisionService,
        *,
        token: str | None = None,
        approvals_token: str | None = None,
        services: Collection[str] = SERVICE_NAMES,
        metrics: PolicyMetrics | None = None,
    ) -> None:
        self.decisions = decisions
        self.metrics = metrics if metrics is not None else PolicyMetrics()
        self.services = tuple(name for name in SERVICE_NAMES if name in services)
        secured = token or approvals_token
        interceptors = server_interceptors(self.metrics.tracer_provider)
        if secured:
            interceptors.append(TokenInterceptor(token, approvals_token=approvals_token))
        self._server = grpc.aio.server(interceptors=interceptors, options=(
            ("grpc.max_receive_message_length", p.GRPC_MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", p.GRPC_MAX_MESSAGE_BYTES),
        ))
        self._health = health.aio.HealthServicer()
        if POLICY_SERVICE in self.services:
            policy_pb2_grpc.add_EscalationPolicyServicer_to_server(
                EscalationPolicyServicer(decisions, self.metrics), self._server
            )
        if APPROVALS_SERVICE in self.services:
            approvals_pb2_grpc.add_ApprovalsServicer_to_server(ApprovalsServicer(decisions.approvals), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (*self.services, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        self.addresses: list[str] = []
        self.approvals_address: str | None = None
        self.metrics_url: str | None = None

    def add_port(self, address: str, *, tls: TlsFiles | None = None) -> str:
        """Listen on ``address`` (before :meth:`start`); return the address clients should use.

        Raises:
            AddressError: see :func:`execgate.policy_service.transport.add_port`.
        """
        bound = add_port(self._server, address, tls)
        self.addresses.append(bound)
        return bound

    async def start(self, *, serving: bool = True) -> None:
        """Start serving and report ``SERVING`` (``NOT_SERVING`` if ``serving`` is False: the
        shared state is out of reach) for every service and for the server ("")."""
        await self._server.start()
        await self.set_serving(serving)
        log.info("policy service listening on %s", ", ".join(self.addresses))

    async def set_serving(self, serving: bool) -> None:
        """Report ``SERVING`` or ``NOT_SERVING`` on the health service."""
        await self._set_health(health_pb2.HealthCheckResponse.SERVING if serving
                               else health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace_s: float | None = 5.0) -> None:
        """Report ``NOT_SERVING``, then stop; in-flight calls get ``grace_s`` seconds to finish."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._server.stop(grace_s)

    async def wait_for_termination(self) -> None:
        """Return when the server has stopped."""
        await self._server.wait_for_termination()

    async def _set_health(self, status: int) -> None:
        for name in ("", *self.services):
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
    approvals_address: str | None = None,
    approvals_token: str | None = None,
    serve_approvals: bool = True,
    audit_log: str | os.PathLike[str] | None = None,
    approval_timeout_s: float = 60.0,
    approver_wait_s: float = 0.0,
    no_approver_reason: str | None = None,
    grace_s: float = 1.0,
    rules_poll_s: float | None = 1.0,
    metrics: PolicyMetrics | None = None,
    metrics_listen: tuple[str, int] | None = None,
    state: str | None = None,
    state_password: str | None = None,
    audit_stream_maxlen: int = 100_000,
    cache_ttl_s: float = 0.0,
) -> AsyncIterator[PolicyServer]:
    """Run a policy service on ``address`` for the duration of the ``async with``.

    With ``approvals_address``, ``address`` serves only ``EscalationPolicy`` (needing ``token``)
    and a second server on ``approvals_address`` serves only ``Approvals`` (needing
    ``approvals_token``; the same ``tls`` if it is TCP); both share one broker. Without it, one
    listener serves both, and ``approvals_token`` (if set) is still the only credential that
    authorises Approvals calls. With ``serve_approvals`` False, Approvals is not served at all
    (prompts then find no approver, unless ``approvals_address`` is given).

    If ``rules`` has a ``watch(interval_s)`` coroutine (a RulesStore), it runs meanwhile, checking
    every ``rules_poll_s`` seconds, so that edited rules files are reloaded; ``rules_poll_s=None``
    reads them once.

    Args:
        no_approver_reason: if set, every prompt is denied with this reason (see
            :class:`~execgate.policy_service.approvals.ApprovalBroker`).
        metrics: this service's metrics and tracer (default: new ones, in a private registry).
        metrics_listen: ``(host, port)`` to serve ``/metrics`` on (port 0: any free port), or
            None for no endpoint. The caller checks the address (loopback unless asked).
        state: None to keep approvals, grants and audit in this process; a Redis URL
            (``redis://[:password@]host:port/db``, ``rediss://…``, ``unix:///…``) to share them
            with other replicas (:mod:`execgate.policy_service.state_redis`). Health then
            follows Redis: ``NOT_SERVING`` (and every decision failing closed) while it cannot
            be reached, ``SERVING`` again once it can.
        state_password: the Redis password, when not in the URL.
        audit_stream_maxlen: about how many entries the Redis audit stream keeps.
        cache_ttl_s: seconds an escalation server may reuse a cacheable Run or Deny (docs/DESIGN.md
            §9); 0 marks nothing cacheable.

    Yields:
        The started decision server; ``server.addresses[0]`` is its bound address,
        ``server.approvals_address`` where Approvals is served, ``server.metrics`` its metrics
        and ``server.metrics_url`` where they are served (or None).

    Raises:
        AddressError: cannot listen. OSError: the audit log cannot be opened, or the metrics
        address cannot be bound. ValueError: a bad ``state`` URL. ModuleNotFoundError: a
        ``state`` URL without redis-py installed.
    """
    metrics = metrics if metrics is not None else PolicyMetrics()
    shared = open_state(state, timeout_s=approval_timeout_s, approver_wait_s=approver_wait_s,
                        refuse_reason=no_approver_reason, audit_maxlen=audit_stream_maxlen, password=state_password)
    broker = shared.approvals
    metrics.watch_approvals(broker.pending_count, lambda: broker.approvers)
    audit = AuditLog(audit_log) if audit_log else None
    decisions = DecisionService(rules, state=shared, audit=audit, cache_ttl_s=cache_ttl_s)
    if approvals_address is None:
        services = SERVICE_NAMES if serve_approvals else (POLICY_SERVICE,)
        servers = [PolicyServer(decisions, token=token, approvals_token=approvals_token, services=services,
                                metrics=metrics)]
    else:
        servers = [
            PolicyServer(decisions, token=token, services=(POLICY_SERVICE,), metrics=metrics),
            PolicyServer(decisions, approvals_token=approvals_token, services=(APPROVALS_SERVICE,), metrics=metrics),
        ]
    watcher: asyncio.Task[None] | None = None
    started: list[PolicyServer] = []
    endpoint: MetricsEndpoint | None = None
    stopping = False

    async def on_health(serving: bool) -> None:
        for server in started if not stopping else ():
            await server.set_serving(serving)

    try:
        await shared.start(on_health)
        servers[0].add_port(address, tls=tls)
        if approvals_address is not None:
            servers[1].add_port(approvals_address, tls=tls if tls and not approvals_address.startswith("unix:") else None)
        if APPROVALS_SERVICE in servers[-1].services:
            servers[0].approvals_address = servers[-1].addresses[0]
        for server in servers:
            await server.start(serving=shared.unavailable() is None)
            started.append(server)
        if rules_poll_s is not None and callable(getattr(rules, "watch", None)):
            watcher = asyncio.create_task(rules.watch(rules_poll_s), name="execgate-rules-watch")  # type: ignore[attr-defined]
        if metrics_listen is not None:
            endpoint = await asyncio.to_thread(MetricsEndpoint, metrics.registry, *metrics_listen)
            servers[0].metrics_url = endpoint.url
        yield servers[0]
    finally:
        stopping = True
        if endpoint is not None:
            await asyncio.to_thread(endpoint.close)
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        for server in reversed(started):
            await server.stop(grace_s)
        await shared.aclose()
        if audit is not None:
            audit.close()



@dataclass(frozen=True, slots=True)
class EmbeddedService:
    """Where an embedded policy service listens, and its credentials.

    Attributes:
        address: the decision endpoint (``unix:///tmp/execgate-…/policy.sock``).
        token: the decision endpoint's bearer token. Keep it in memory: it exists nowhere else.
        approvals_address: the approvals endpoint, or None when it was not asked for.
        approvals_token_file: the 0600 file holding the approvals token (for ``execgate
            approve --token-file``), or None.
        broker: the service's approvals broker, for an approver in this very process (``execgate
            run``'s terminal approver subscribes to it: no endpoint, no credential).
    """

    address: str
    token: str
    approvals_address: str | None = None
    approvals_token_file: str | None = None
    broker: ApprovalBroker | None = None


#: Seconds a cacheable decision may be reused, by default (``policy serve --cache-ttl``, the
#: embedded service of ``execgate run``; docs/DESIGN.md §9).
DEFAULT_CACHE_TTL_S = 60.0


@contextlib.asynccontextmanager
async def serve_embedded(
    rules_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    default: str = "run",
    default_rules: bool = True,
    audit_log: str | os.PathLike[str] | None = None,
    approval_timeout_s: float = 60.0,
    approver_wait_s: float = 0.0,
    approvals: bool = False,
    no_approver_reason: str | None = None,
    metrics: PolicyMetrics | None = None,
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
) -> AsyncIterator[EmbeddedService]:
    """Run the policy service in this event loop on private Unix sockets (see the module doc).

    The sockets live in a fresh directory of mode 0700 under ``/tmp`` (removed on exit),
    whatever ``TMPDIR`` says. ``rules_paths`` layer on top of the rules shipped in the package
    unless ``default_rules`` is False. They are read once, at start, and never reloaded: the
    sessions this service decides for may be able to write them (a rules file in their working
    directory), and a session must not change the rules that judge it.

    Args:
        approvals: also open the approvals endpoint (``approvals.sock``, its token in
            ``approvals.token``, mode 0600, in the same directory).
        no_approver_reason: deny every prompt with this reason (a session that could reach
            any approver of this process, e.g. one without a sandbox).
        metrics: the service's metrics and tracer (``execgate run --metrics`` serves their
            registry together with its client's); default: private ones.
        cache_ttl_s: seconds the client may reuse a cacheable decision (0: none is).

    Yields:
        An :class:`EmbeddedService`: give ``address`` and ``token`` to
        :class:`~execgate.server.grpc_policy.GrpcPolicy`.

    Raises:
        RulesError: a rules file is bad. OSError: the directory or token file cannot be made.
    """
    rules = load_rules(rules_paths, default=default, defaults=default_rules)
    directory = Path(tempfile.mkdtemp(prefix="execgate-", dir=EMBEDDED_PARENT))  # mode 0700 (mkdtemp)
    token = new_token()
    approvals_token = new_token() if approvals else None
    token_file = None
    try:
        if approvals_token is not None:
            token_file = str(directory / "approvals.token")
            write_private_file(token_file, approvals_token)
        async with running_service(
            rules,
            address=f"unix://{directory / 'policy.sock'}",
            token=token,
            approvals_address=f"unix://{directory / 'approvals.sock'}" if approvals else None,
            approvals_token=approvals_token,
            serve_approvals=approvals,
            audit_log=audit_log,
            approval_timeout_s=approval_timeout_s,
            approver_wait_s=approver_wait_s,
            no_approver_reason=no_approver_reason,
            metrics=metrics,
            cache_ttl_s=cache_ttl_s,
            rules_poll_s=None,
        ) as server:
            yield EmbeddedService(server.addresses[0], token, server.approvals_address, token_file,
                                  server.decisions.approvals)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
