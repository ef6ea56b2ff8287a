"""Where the policy service keeps the state that replicas share (docs/DESIGN.md §9).

Two implementations of one interface, :class:`SharedState`:

- :class:`InProcessState` — today's single service: the approvals broker
  (:class:`~execgate.policy_service.approvals.ApprovalBroker`) in this process, the audit log only
  in the local JSON-lines file; always available.
- :class:`~execgate.policy_service.state_redis.RedisState` (``policy serve --state redis://…``) —
  pending approvals, approve-for-session grants, the approvals stream and the audit stream in
  Redis, so that every replica sees them. It may become unavailable: then
  :meth:`SharedState.unavailable` names Redis, the service reports ``NOT_SERVING`` on its health
  service, and every ``DetermineAction`` fails closed (Deny) until Redis answers again.

:func:`open_state` picks one from a ``--state`` URL.
"""

from __future__ import annotations

from typing import AsyncContextManager, Awaitable, Callable, Protocol, Sequence

from execgate.policy_service.approvals import ApprovalBroker, ApprovalOutcome, ApprovalRequest, Verdict
from execgate.policy_service.audit import AuditRecord
from execgate.server.policy import ExecFacts, Execution, SessionContext

#: Called with True (reachable) or False (unreachable) each time the shared state's health changes.
HealthHook = Callable[[bool], Awaitable[None]]


class StateUnavailable(Exception):
    """Raised when the shared state cannot be reached or fails; the message names it (a Redis URL
    without its password) and the cause, and is shown to the caller in its fail-closed denial."""


class ApprovalState(Protocol):
    """What the ``Approvals`` servicer and the decision logic need of an approvals broker (the
    methods of :class:`~execgate.policy_service.approvals.ApprovalBroker`). A shared one raises
    :class:`StateUnavailable` from its coroutines when it cannot reach its store."""

    timeout_s: float

    @property
    def approvers(self) -> int: ...

    def pending_count(self) -> int: ...

    async def is_pending(self, request_id: str) -> bool: ...

    async def pending(self) -> list[ApprovalRequest]: ...

    def subscribe(self) -> AsyncContextManager[object]: ...

    async def request(
        self, session: SessionContext, program: str, argv: Sequence[str], workdir: str, *, rule_id: str,
        reason: str, execution: Execution, timeout_s: float | None = None, env: object = None,
        facts: ExecFacts | None = None,
    ) -> ApprovalOutcome: ...

    async def resolve(self, request_id: str, verdict: Verdict, *, reason: str = "", approver: str = "") -> None: ...


class SharedState(Protocol):
    """The policy service's shared state.

    Attributes:
        approvals: the approvals broker.
        description: where the state lives, for logs (``in-process`` or a Redis URL without
            its password).
    """

    approvals: ApprovalState
    description: str

    def unavailable(self) -> str | None:
        """Why the state cannot be used now (a decision then fails closed with this reason), or None."""

    async def record(self, record: AuditRecord) -> None:
        """Publish one audit record to the shared audit stream (the local file is written apart).

        Raises:
            StateUnavailable: it could not be published.
        """

    async def start(self, on_health: HealthHook | None = None) -> None:
        """Connect (a first health check) and start the background work; ``on_health`` is awaited
        at each later change of health."""

    async def aclose(self) -> None:
        """Stop the background work and close connections."""


class InProcessState:
    """Today's state: everything in this process, always available.

    Args:
        broker: the approvals broker (default: a new one with its defaults).
    """

    description = "in-process"

    def __init__(self, broker: ApprovalBroker | None = None) -> None:
        self.approvals: ApprovalBroker = broker if broker is not None else ApprovalBroker()

    def unavailable(self) -> str | None:
        """Always None: this state is never out of reach."""
        return None

    async def record(self, record: AuditRecord) -> None:
        """Nothing to share: the local audit file is the whole audit log."""

    async def start(self, on_health: HealthHook | None = None) -> None:
        """Nothing to start."""

    async def aclose(self) -> None:
        """Nothing to close."""


def open_state(
    url: str | None, *, timeout_s: float = 60.0, approver_wait_s: float = 0.0, refuse_reason: str | None = None,
    audit_maxlen: int = 100_000, password: str | None = None,
) -> SharedState:
    """The shared state a ``--state`` URL names (not yet started: see :meth:`SharedState.start`).

    Args:
        url: None for :class:`InProcessState`; ``redis://[:password@]host:port/db``,
            ``rediss://…`` (TLS) or ``unix:///path.sock`` (a Redis Unix socket) for
            :class:`~execgate.policy_service.state_redis.RedisState`.
        timeout_s, approver_wait_s, refuse_reason: the approvals broker's settings
            (:class:`~execgate.policy_service.approvals.ApprovalBroker`).
        audit_maxlen: about how many entries the Redis audit stream keeps (``XADD MAXLEN ~``).
        password: the Redis password, when it is not in the URL (never logged).

    Raises:
        ValueError: the URL is not one of these. ModuleNotFoundError: Redis is asked for but
            redis-py is not installed (the ``redis`` extra).
    """
    if url is None:
        return InProcessState(ApprovalBroker(timeout_s=timeout_s, approver_wait_s=approver_wait_s,
                                             refuse_reason=refuse_reason))
    from execgate.policy_service.state_redis import RedisState

    return RedisState(url, timeout_s=timeout_s, approver_wait_s=approver_wait_s, refuse_reason=refuse_reason,
                      audit_maxlen=audit_maxlen, password=password)

