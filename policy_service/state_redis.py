"""Shared state in Redis for replicated policy services (``policy serve --state redis://…``;
docs/DESIGN.md §9).

:class:`RedisState` is one replica's view of the state every replica shares:

- pending approvals, approve-for-session grants and the approvals stream:
  :class:`~execgate.policy_service.approvals_redis.RedisApprovalBroker`;
- the audit stream: every decision is ``XADD``-ed to ``execgate:audit`` (field ``record``, the
  audit log's JSON line; ``MAXLEN ~`` bounded) before it is answered, besides the replica's local
  JSON-lines file;
- decision ids are uuid4 (122 random bits), unique across replicas without coordination.

Health: a background task pings Redis every ``ping_interval_s`` seconds (and each time a command
found it unreachable). While it cannot reach Redis, :meth:`RedisState.unavailable` names it, the
service reports ``NOT_SERVING`` on its gRPC health service (clients balancing with gRPC's health
checking then stop sending it calls), and every ``DetermineAction`` fails closed — every one, a
plain run or deny too: its answer would be missing from the shared audit stream. The first ping
that succeeds again restores ``SERVING``; nothing needs restarting.

Connections: redis-py's asyncio client, one pool for short commands (``op_timeout_s`` socket
timeout, one immediate retry, so a connection broken by a Redis restart is replaced at once) and
one for blocking reads. URLs: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS;
redis-py's ``ssl_*`` query parameters, e.g. ``?ssl_ca_certs=/path/ca.pem``) and
``unix:///path/redis.sock``. The password is never logged or put in a reason:
:func:`redact` shows the URL without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
import uuid
from typing import AsyncIterator

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from execgate.policy_service.approvals_redis import PREFIX, RedisApprovalBroker
from execgate.policy_service.audit import AuditRecord
from execgate.policy_service.state import HealthHook, StateUnavailable

log = logging.getLogger(__name__)

#: The shared audit stream (``XRANGE execgate:audit - +`` reads it).
AUDIT_STREAM = f"{PREFIX}audit"
_SCHEMES = ("redis", "rediss", "unix")


def redact(url: str) -> str:
    """``url`` without its user name and password (for logs and reasons).

    Raises:
        ValueError: not a ``redis://``, ``rediss://`` or ``unix://`` URL.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"--state: {parts.scheme or url!r} is not a redis://, rediss:// or unix:// URL")
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}:{parts.port or 6379}{parts.path or '/0'}"


class RedisState:
    """One replica's connections to the shared state, and their health (see the module doc).

    Args:
        url: the Redis URL (see the module doc).
        timeout_s, approver_wait_s, refuse_reason: the approvals broker's settings.
        audit_maxlen: about how many entries the audit stream keeps.
        password: the password, if not in the URL (``--state-password-file``).
        ping_interval_s: seconds between health checks.
        op_timeout_s: seconds one command may take (connecting included) before Redis counts as
            unreachable.

    Attributes:
        approvals: the shared approvals broker.
        description: the URL without its password.
        replica_id: this replica's random id (its approvers' entry, its Redis client name).

    Raises:
        ValueError: a bad URL.
    """

    def __init__(
        self, url: str, *, timeout_s: float = 60.0, approver_wait_s: float = 0.0, refuse_reason: str | None = None,
        audit_maxlen: int = 100_000, password: str | None = None, ping_interval_s: float = 0.5,
        op_timeout_s: float = 2.0,
    ) -> None:
        self.description = redact(url)
        self._secrets = [s for s in (urllib.parse.urlsplit(url).password, password) if s]
        self.replica_id = uuid.uuid4().hex[:12]
        self.audit_maxlen = audit_maxlen
        self.ping_interval_s = ping_interval_s
        self.op_timeout_s = op_timeout_s
        self.heartbeat_ttl_s = max(2.0, 4 * ping_interval_s)
        extra = {"password": password} if password else {}
        common = dict(socket_connect_timeout=op_timeout_s, retry=Retry(NoBackoff(), 1),
                      client_name=f"execgate-policy-{self.replica_id}", **extra)
        self.redis = aioredis.from_url(url, socket_timeout=op_timeout_s, **common)
        self.blocking = aioredis.from_url(url, socket_timeout=None, **common)
        self._why: str | None = f"shared state: Redis at {self.description} not reached yet; failing closed"
        self._reported: bool | None = None
        self._on_health: HealthHook | None = None
        self._poke = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.approvals = RedisApprovalBroker(self, timeout_s=timeout_s, approver_wait_s=approver_wait_s,
                                             refuse_reason=refuse_reason)

    def unavailable(self) -> str | None:
        """Why Redis cannot be used now (the reason of every fail-closed decision), or None."""
        return self._why

    def failure(self, what: str) -> StateUnavailable:
        """A :class:`StateUnavailable` naming Redis and ``what`` (secrets scrubbed)."""
        for secret in self._secrets:
            what = what.replace(secret, "***")
        return StateUnavailable(f"shared state: Redis at {self.description}: {what}; failing closed")

    @contextlib.asynccontextmanager
    async def guard(self, extra_s: float = 0.0) -> AsyncIterator[None]:
        """Run Redis commands within ``op_timeout_s + extra_s`` seconds; turn their failures into
        :class:`StateUnavailable` (an unreachable Redis also makes the state unhealthy at once)."""
        try:
            async with asyncio.timeout(self.op_timeout_s + extra_s):
                yield
        except (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError) as exc:
            error = self.failure(f"cannot be reached ({_cause(exc)})")
            self._mark(str(error))
            raise error from None
        except RedisError as exc:
            raise self.failure(f"command failed ({_cause(exc)})") from None

    async def record(self, record: AuditRecord) -> None:
        """``XADD`` one audit record to :data:`AUDIT_STREAM` (``MAXLEN ~ audit_maxlen``).

        Raises:
            StateUnavailable: Redis failed.
        """
        async with self.guard():
            await self.redis.xadd(AUDIT_STREAM, {"record": record.to_json()}, maxlen=self.audit_maxlen,
                                  approximate=True)

    async def start(self, on_health: HealthHook | None = None) -> None:
        """Check Redis once, then keep checking it and following the approvals stream in the
        background; ``on_health`` is awaited at each later change of health."""
        await self._check()
        if self._why is None:
            log.info("shared state: Redis at %s (replica %s)", self.description, self.replica_id)
        else:
            log.warning("%s; NOT_SERVING until it answers", self._why)
        self._reported = self._why is None
        self._on_health = on_health
        self._tasks = [asyncio.create_task(self._monitor(), name="execgate-redis-health"),
                       asyncio.create_task(self._follow(), name="execgate-redis-approvals")]

    async def aclose(self) -> None:
        """Stop the background tasks, withdraw this replica's approvers, close the pools."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(self.op_timeout_s):
                await self.redis.hdel(f"{PREFIX}approvers", self.replica_id)
        await self.redis.aclose()
        await self.blocking.aclose()

    def _mark(self, why: str) -> None:
        """Unhealthy now (a command could not reach Redis); the monitor checks again at once."""
        if self._why is None:
            log.warning("%s", why)
        self._why = why
        self._poke.set()

    async def _check(self) -> None:
        """One health check: PING and the approvers heartbeat."""
        try:
            async with asyncio.timeout(self.op_timeout_s):
                await self.redis.ping()
                await self.approvals.heartbeat(self.heartbeat_ttl_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self._why = str(self.failure(f"cannot be reached ({_cause(exc)})"))
        else:
            if self._why is not None and self._reported is not None:
                log.info("shared state: Redis at %s reachable again", self.description)
            self._why = None

    async def _monitor(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ping_interval_s):
                    await self._poke.wait()
            self._poke.clear()
            await self._check()
            healthy = self._why is None
            if healthy != self._reported:
                self._reported = healthy
                if not healthy:
                    log.warning("%s; NOT_SERVING", self._why)
                if self._on_health is not None:
                    await self._on_health(healthy)

    async def _follow(self) -> None:
        """Follow the approvals stream (one blocking XREAD at a time) for this replica's approvers."""
        stream, last = f"{PREFIX}approvals", None
        while True:
            try:
                async with asyncio.timeout(self.op_timeout_s + 1.0):
                    if last is None:
                        newest = await self.redis.xrevrange(stream, count=1)
                        last = newest[0][0] if newest else b"0-0"
                    reply = await self.blocking.xread({stream: last}, block=1000, count=100)
            except (RedisError, OSError, TimeoutError) as exc:
                log.debug("approvals stream: %s", _cause(exc))
                await asyncio.sleep(self.ping_interval_s)
                continue
            for _name, entries in reply or ():
                for entry_id, fields in entries:
                    last = entry_id
                    with contextlib.suppress(KeyError, ValueError):
                        self.approvals.announce(fields[b"pb"], int(fields[b"deadline"]))


def _cause(exc: BaseException) -> str:
    """A short description of a Redis failure."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
