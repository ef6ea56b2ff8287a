"""Approvals shared by policy-service replicas through Redis (docs/DESIGN.md §4, §9).

The same methods and outcomes as :class:`~execgate.policy_service.approvals.ApprovalBroker`, with
the state in Redis so that an approver connected to any replica answers a prompt raised on any
other. Keys (all under ``execgate:``):

- ``pending:<id>`` — a hash: ``pb`` (the request as an ``execgate.v1.PendingApproval``) and
  ``deadline`` (Unix time, ms); it expires a little after its deadline.
- ``pending`` — a sorted set of the pending ids, scored by creation time (``ListPending``).
- ``approvals`` — a stream (``XADD MAXLEN ~ 1000``) announcing each new request; every replica
  follows it with one blocking ``XREAD`` and hands the requests to its ``WatchPending`` callers.
- ``result:<id>`` — a list holding the outcome; the replica whose ``DetermineAction`` waits for
  the request blocks on it (``BLPOP``), so a resolution on any replica wakes it.
- ``grant:<sha256>`` — an approve-for-session grant (the approver's name), for
  :data:`GRANT_TTL_S` seconds after its last use; the digest is
  :func:`~execgate.policy_service.approvals.grant_key` (session, program, argv, working directory,
  environment, file), and none is stored for a file the caller can change
  (:func:`~execgate.policy_service.approvals.session_grant_refusal`), as in one process.
- ``approvers`` — a hash: replica id → ``"<count> <expiry ms>"``, the approvers connected to
  each replica, refreshed by every health check (a killed replica's entry expires).

The first answer wins: a resolution (or the waiter's own timeout) is one Lua script that deletes
the pending hash and pushes the outcome only if the hash was still there. Redis errors become
:class:`~execgate.policy_service.state.StateUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, AsyncIterator, Mapping, Sequence

from redis.exceptions import RedisError

from execgate.policy_service.approvals import (
    ApprovalOutcome, ApprovalRequest, UnknownRequest, Verdict, grant_key, outcome_for, session_grant_refusal,
    settle,
)
from execgate.server import policy_codec as codec
from execgate.server.policy import ExecFacts, Execution, SessionContext
from execgate.v1 import approvals_pb2 as apb

if TYPE_CHECKING:  # pragma: no cover
    from execgate.policy_service.state_redis import RedisState

log = logging.getLogger(__name__)

PREFIX = "execgate:"
#: Seconds an approve-for-session grant lasts after its last use (sessions have no end the
#: service is told of).
GRANT_TTL_S = 24 * 3600
#: Seconds an unread outcome is kept; and a pending hash outlives its deadline by this much.
_RESULT_TTL_S = 60
#: About how many announcements the approvals stream keeps.
_STREAM_MAXLEN = 1000
#: Longest single blocking read (seconds): a waiter checks its request is still there this often.
_BLOCK_S = 1.0

#: KEYS: pending hash, pending set, result list; ARGV: id, outcome JSON, result TTL (ms).
_CLAIM = """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
"""


def _encode(request: ApprovalRequest) -> bytes:
    """The request as ``PendingApproval`` bytes (its deadline travels apart, as Unix time)."""
    return apb.PendingApproval(
        request_id=request.request_id, session=codec.session_to_pb(request.session),
        target=codec.target_to_pb(request.program, request.argv, request.workdir, request.facts),
        rule_id=request.rule_id, reason=request.reason, execution=codec.execution_to_pb(request.execution),
        env=dict(request.env),
    ).SerializeToString()


def _decode(data: bytes, deadline_ms: int) -> ApprovalRequest:
    """A request stored by :func:`_encode`, its deadline turned into this loop's clock.

    Raises:
        codec.CodecError, ValueError: the bytes are not such a request.
    """
    msg = apb.PendingApproval.FromString(data)
    program, argv, workdir = codec.target_from_pb(msg.target)
    facts = codec.facts_from_pb(msg.target)
    left = deadline_ms / 1000.0 - time.time()
    return ApprovalRequest(
        msg.request_id, codec.session_from_pb(msg.session), program, argv, workdir, msg.rule_id, msg.reason,
        codec.execution_from_pb(msg.execution), asyncio.get_running_loop().time() + left,
        tuple(sorted(msg.env.items())), facts,
    )


class _Watch:
    """One connected approver's queue; each request is handed over once."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[ApprovalRequest] = asyncio.Queue()
        self._seen: set[str] = set()

    def put(self, request: ApprovalRequest) -> None:
        if request.request_id not in self._seen:
            self._seen.add(request.request_id)
            self._queue.put_nowait(request)

    async def get(self) -> ApprovalRequest:
        return await self._queue.get()


class RedisApprovalBroker:
    """Pending requests, approvers and grants shared by every replica (see the module doc).

    Args:
        state: the replica's Redis connections (its ``redis`` for short commands, ``blocking``
            for blocking reads) and health.
        timeout_s, approver_wait_s, refuse_reason: as for
            :class:`~execgate.policy_service.approvals.ApprovalBroker`.
    """

    def __init__(self, state: RedisState, *, timeout_s: float = 60.0, approver_wait_s: float = 0.0,
                 refuse_reason: str | None = None) -> None:
        self.state = state
        self.timeout_s = timeout_s
        self.approver_wait_s = approver_wait_s
        self.refuse_reason = refuse_reason
        self._watches: set[_Watch] = set()
        self._held: set[str] = set()
        self._withdrawing: set[asyncio.Future[None]] = set()
        self._claim = state.redis.register_script(_CLAIM)

    @property
    def approvers(self) -> int:
        """Number of approvers connected to this replica."""
        return len(self._watches)

    def pending_count(self) -> int:
        """Number of prompts this replica's ``DetermineAction`` calls wait on (a plain read)."""
        return len(self._held)

    async def is_pending(self, request_id: str) -> bool:
        """True while ``request_id`` waits for an answer, on any replica.

        Raises:
            StateUnavailable: Redis failed.
        """
        async with self.state.guard():
            return bool(await self.state.redis.exists(f"{PREFIX}pending:{request_id}"))

    async def pending(self) -> list[ApprovalRequest]:
        """Requests waiting now on every replica, oldest first.

        Raises:
            StateUnavailable: Redis failed.
        """
        redis = self.state.redis
        async with self.state.guard():
            ids = [i.decode() for i in await redis.zrange(f"{PREFIX}pending", 0, -1)]
            async with redis.pipeline(transaction=False) as pipe:
                for request_id in ids:
                    pipe.hmget(f"{PREFIX}pending:{request_id}", "pb", "deadline")
                rows = await pipe.execute()
            gone = [i for i, (data, _) in zip(ids, rows) if data is None]
            if gone:
                await redis.zrem(f"{PREFIX}pending", *gone)
        now_ms = time.time() * 1000
        return [_decode(data, int(deadline)) for data, deadline in rows
                if data is not None and int(deadline) > now_ms]

    async def approvers_anywhere(self) -> int:
        """Approvers connected to any replica (entries of replicas that stopped refreshing expire).

        Raises:
            StateUnavailable: Redis failed.
        """
        async with self.state.guard():
            entries = await self.state.redis.hgetall(f"{PREFIX}approvers")
        now_ms = time.time() * 1000
        total = 0
        for value in entries.values():
            count, _, until = value.decode().partition(" ")
            total += int(count) if float(until or 0) > now_ms else 0
        return total

    async def heartbeat(self, ttl_s: float) -> None:
        """Publish this replica's approver count, valid ``ttl_s`` seconds (raises RedisError)."""
        key, field = f"{PREFIX}approvers", self.state.replica_id
        if self._watches:
            await self.state.redis.hset(key, field, f"{len(self._watches)} {int((time.time() + ttl_s) * 1000)}")
        else:
            await self.state.redis.hdel(key, field)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[_Watch]:
        """Connect an approver for the duration of the ``async with``.

        Yields:
            An object whose ``get()`` returns every request pending at subscription (on any
            replica), then each new one.

        Raises:
            StateUnavailable: Redis failed while listing the pending requests.
        """
        watch = _Watch()
        self._watches.add(watch)  # first, so that nothing announced while listing is missed
        try:
            with contextlib.suppress(RedisError, OSError):
                await self.heartbeat(self.state.heartbeat_ttl_s)
            for request in await self.pending():
                watch.put(request)
            yield watch
        finally:
            self._watches.discard(watch)
            with contextlib.suppress(RedisError, OSError):
                await self.heartbeat(self.state.heartbeat_ttl_s)

    def announce(self, data: bytes, deadline_ms: int) -> None:
        """Hand one announced request (read from the approvals stream) to this replica's approvers."""
        if not self._watches:
            return
        try:
            request = _decode(data, deadline_ms)
        except (ValueError, codec.CodecError) as exc:
            log.warning("approvals stream: undecodable request skipped: %s", exc)
            return
        for watch in self._watches:
            watch.put(request)

    async def request(
        self,
        session: SessionContext,
        program: str,
        argv: Sequence[str],
        workdir: str,
        *,
        rule_id: str,
        reason: str,
        execution: Execution,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        facts: ExecFacts | None = None,
    ) -> ApprovalOutcome:
        """Ask the approvers of every replica about one exec and wait for the outcome (as
        :meth:`ApprovalBroker.request <execgate.policy_service.approvals.ApprovalBroker.request>`).

        Raises:
            StateUnavailable: Redis failed before an outcome was known.
        """
        if self.refuse_reason is not None:
            return ApprovalOutcome(False, self.refuse_reason, result="refused")
        shown_env = tuple(sorted((env or {}).items()))
        refusal = session_grant_refusal(facts)
        grant = f"{PREFIX}grant:{grant_key(session, program, argv, workdir, shown_env, facts)}"
        if refusal is None and (granted := await self._granted(grant)) is not None:
            return granted
        timeout = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        deadline = time.time() + timeout
        wait = min(self.approver_wait_s, timeout)
        if not await self.approvers_anywhere() and not await self._wait_for_approver(wait):
            return ApprovalOutcome(False, "approval required but no approver is connected", result="no_approver")
        loop_deadline = asyncio.get_running_loop().time() + (deadline - time.time())
        request = ApprovalRequest(uuid.uuid4().hex, session, program, tuple(argv), workdir, rule_id, reason, execution,
                                  loop_deadline, shown_env, facts)
        self._held.add(request.request_id)
        try:
            await self._publish(request, deadline)
            outcome = await self._wait(request.request_id, deadline, timeout)
        except asyncio.CancelledError:  # the caller left: no approver should see it any more
            self._withdraw(request.request_id)
            raise
        finally:
            self._held.discard(request.request_id)
        outcome = settle(outcome, refusal)  # no grant for a file the caller can change
        if outcome.approved and outcome.for_session:
            async with self.state.guard():
                await self.state.redis.set(grant, outcome.approver, ex=GRANT_TTL_S)
        return outcome

    def _withdraw(self, rid: str) -> None:
        """Remove an abandoned request from Redis, in the background (best effort)."""
        async def withdraw() -> None:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                async with asyncio.timeout(self.state.op_timeout_s):
                    await self.state.redis.delete(f"{PREFIX}pending:{rid}")
                    await self.state.redis.zrem(f"{PREFIX}pending", rid)

        task = asyncio.ensure_future(withdraw())
        self._withdrawing.add(task)
        task.add_done_callback(self._withdrawing.discard)

    async def _granted(self, grant: str) -> ApprovalOutcome | None:
        """The outcome of an earlier approve-for-session grant (its lease renewed), or None."""
        async with self.state.guard():
            granted_by = await self.state.redis.get(grant)
            if granted_by is None:
                return None
            await self.state.redis.expire(grant, GRANT_TTL_S)
        return ApprovalOutcome(True, "approved earlier for this session", granted_by.decode(), True, "granted")

    async def _wait_for_approver(self, wait_s: float) -> bool:
        """Poll (every 0.1 s, up to ``wait_s`` seconds) for an approver on any replica."""
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            await asyncio.sleep(min(0.1, max(0.0, end - time.monotonic())))
            if await self.approvers_anywhere():
                return True
        return False

    async def _publish(self, request: ApprovalRequest, deadline: float) -> None:
        """Store a new pending request and announce it (raises StateUnavailable)."""
        data, deadline_ms, rid = _encode(request), int(deadline * 1000), request.request_id
        async with self.state.guard(), self.state.redis.pipeline(transaction=True) as pipe:
            pipe.hset(f"{PREFIX}pending:{rid}", mapping={"pb": data, "deadline": deadline_ms})
            pipe.pexpireat(f"{PREFIX}pending:{rid}", deadline_ms + _RESULT_TTL_S * 1000)
            pipe.zadd(f"{PREFIX}pending", {rid: time.time() * 1000})
            pipe.xadd(f"{PREFIX}approvals", {"id": rid, "pb": data, "deadline": deadline_ms},
                      maxlen=_STREAM_MAXLEN, approximate=True)
            await pipe.execute()

    async def _wait(self, rid: str, deadline: float, timeout: float) -> ApprovalOutcome:
        """Block on the request's result list until an outcome arrives or ``deadline`` (Unix time).

        Raises:
            StateUnavailable: Redis failed, or lost the request (a restart without persistence).
        """
        result = f"{PREFIX}result:{rid}"
        while True:
            left = deadline - time.time()
            if left <= 0:
                return await self._expire(rid, timeout)
            async with self.state.guard(extra_s=_BLOCK_S):
                got = await self.state.blocking.blpop([result], timeout=max(0.01, min(left, _BLOCK_S)))
                if got is not None:
                    return ApprovalOutcome(**json.loads(got[1]))
                if not await self.state.redis.exists(f"{PREFIX}pending:{rid}"):
                    got = await self.state.redis.lpop(result)
                    if got is None:
                        raise self.state.failure(f"the approval request {rid[:12]} vanished from Redis "
                                                 "(restarted without persistence?)")
                    return ApprovalOutcome(**json.loads(got))

    async def _expire(self, rid: str, timeout: float) -> ApprovalOutcome:
        """The deadline passed: claim the request as timed out, unless an answer won the race."""
        outcome = ApprovalOutcome(False, f"approval timed out after {timeout:g} s with no answer", result="timeout")
        keys = (f"{PREFIX}pending:{rid}", f"{PREFIX}pending", f"{PREFIX}result:{rid}")
        async with self.state.guard():
            if await self._claim(keys=keys, args=(rid, json.dumps(asdict(outcome)), 1)):
                await self.state.redis.delete(keys[2])
                return outcome
            got = await self.state.redis.lpop(keys[2])
        return ApprovalOutcome(**json.loads(got)) if got is not None else outcome

    async def resolve(self, request_id: str, verdict: Verdict, *, reason: str = "", approver: str = "") -> None:
        """Answer one pending request, raised on any replica.

        Raises:
            UnknownRequest: no such request is pending (unknown, already answered or expired).
            ValueError: ``verdict`` is not "once", "session" or "deny".
            StateUnavailable: Redis failed.
        """
        outcome = outcome_for(verdict, reason, approver)
        keys = (f"{PREFIX}pending:{request_id}", f"{PREFIX}pending", f"{PREFIX}result:{request_id}")
        async with self.state.guard():
            won = await self._claim(keys=keys, args=(request_id, json.dumps(asdict(outcome)), _RESULT_TTL_S * 1000))
        if not won:
            raise UnknownRequest(request_id)
        log.info("approval %s resolved by %s: %s", request_id, approver or "?", verdict)
