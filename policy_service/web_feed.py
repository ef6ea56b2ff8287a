"""The pending requests as the approval page sees them (:mod:`execgate.policy_service.web_approver`).

:class:`PendingFeed` mirrors the policy service's pending approvals for the pages that listen: it
watches ``WatchPending`` while at least one page listens (a connected watcher counts as an
available approver, docs/DESIGN.md §4), notices requests answered elsewhere or expired by polling
``ListPending`` (the stream only announces new ones), and answers with ``ResolveApproval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from typing import Any, AsyncIterator

import grpc

from execgate.policy_service.approver import file_text, grant_note, has_hidden, raw_fields, visible
from execgate.v1 import approvals_pb2 as apb
from execgate.v1 import approvals_pb2_grpc

log = logging.getLogger(__name__)

#: The page's verdict names → the proto's.
VERDICTS = {"once": apb.VERDICT_APPROVE_ONCE, "session": apb.VERDICT_APPROVE_FOR_SESSION, "deny": apb.VERDICT_DENY}
_SAID = {"once": "approved once", "session": "approved for the session", "deny": "denied"}


def _execution_text(pending: apb.PendingApproval) -> str:
    kind = pending.execution.WhichOneof("kind")
    if kind == "permissions":
        p = pending.execution.permissions
        return visible(f"sandboxed (network {'on' if p.network else 'off'}; writable: "
                       f"{', '.join(p.writable_roots) or 'none'})")
    return {"unsandboxed": "unsandboxed", "session_default": "in the session's sandbox"}.get(kind or "", "unknown")


def _env_of(pending: apb.PendingApproval) -> dict[str, str] | None:
    """The variables that reach the command, if this version of the proto carries them (``env``)."""
    if "env" not in pending.DESCRIPTOR.fields_by_name:
        return None
    value = getattr(pending, "env")
    return {visible(str(k)): visible(str(v)) for k, v in sorted(value.items())} if hasattr(value, "items") else None


def pending_to_json(pending: apb.PendingApproval) -> dict[str, Any]:
    """The request as the page shows it (JSON-ready; ``env`` is None when the proto has no such field).

    Every text meant for a person is passed through :func:`~execgate.policy_service.approver.visible`
    (control characters, bidi overrides, line separators shown as ``\\xNN`` / ``\\uNNNN``), as
    ``execgate approve`` shows it; the page puts them in the document as text only. ``controls``
    is true when any field held such a character (the page flags the request), ``no_session_grant``
    says why "approve for the session" will approve once only (None when a grant is possible).
    ``id`` is the service's own and is sent as is: the page sends it back.
    """
    target, session = pending.target, pending.session
    return {
        "id": pending.request_id,
        "program": visible(target.program),
        "argv": [visible(a) for a in target.argv],
        "command": visible(shlex.join(target.argv)),
        "cwd": visible(target.workdir),
        "session": visible(session.session_id),
        "labels": {visible(k): visible(v) for k, v in sorted(session.labels.items())},
        "sandboxed": session.HasField("sandbox"),
        "rule": visible(pending.rule_id),
        "justification": visible(pending.reason),
        "controls": has_hidden(*raw_fields(pending)),
        "no_session_grant": grant_note(pending),
        "execution": _execution_text(pending),
        "seconds_left": round(pending.seconds_left, 1),
        "env": _env_of(pending),
        "file": file_text(pending),
        "children_unseen": pending.target.children_unseen if pending.target.HasField("children_unseen") else None,
    }


class PendingFeed:
    """A mirror of the service's pending requests for the pages that listen.

    Args:
        channel: open channel to the policy service (not closed here).
        name: approver name for the audit log.
        metadata: call metadata (the service's bearer token).
        poll_s: seconds between ``ListPending`` checks for requests that went away.
        linger_s: seconds the watch stays up after the last page left (survives a reload).
    """

    def __init__(self, channel: grpc.aio.Channel, *, name: str, metadata: tuple[tuple[str, str], ...] = (),
                 poll_s: float = 1.0, linger_s: float = 5.0) -> None:
        self.stub = approvals_pb2_grpc.ApprovalsStub(channel)
        self.name, self.metadata, self.poll_s, self.linger_s = name, metadata, poll_s, linger_s
        self.pending: dict[str, dict[str, Any]] = {}
        self.connected = False
        self._seen_at: dict[str, float] = {}  # loop time each request arrived (for the poll race)
        self._listeners: set[asyncio.Queue[tuple[str, Any] | None]] = set()
        self._watch: asyncio.Task[None] | None = None
        self._stopper: asyncio.TimerHandle | None = None

    def snapshot(self) -> list[dict[str, Any]]:
        """Every pending request, oldest first."""
        return list(self.pending.values())

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[asyncio.Queue[tuple[str, Any] | None]]:
        """Receive ``(event, data)`` pairs while inside; None means the server is stopping."""
        queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()
        queue.put_nowait(("status", {"connected": self.connected}))
        queue.put_nowait(("snapshot", self.snapshot()))
        self._listeners.add(queue)
        if self._stopper is not None:
            self._stopper.cancel()
            self._stopper = None
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._run())
        try:
            yield queue
        finally:
            self._listeners.discard(queue)
            if not self._listeners:
                self._stopper = asyncio.get_running_loop().call_later(self.linger_s, self._stop_watch)

    def close(self) -> None:
        """Stop watching and tell every listener to finish."""
        for queue in self._listeners:
            queue.put_nowait(None)
        self._stop_watch()

    def _stop_watch(self) -> None:
        self._stopper = None
        if self._watch is not None:
            self._watch.cancel()
        self.pending.clear()
        self._seen_at.clear()

    def _send(self, event: str, data: Any) -> None:
        for queue in self._listeners:
            queue.put_nowait((event, data))

    def _drop(self, request_id: str, why: str) -> None:
        self._seen_at.pop(request_id, None)
        if self.pending.pop(request_id, None) is not None:
            self._send("gone", {"id": request_id, "why": why})

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            self._send("status", {"connected": connected})

    async def _run(self) -> None:
        """Watch (reconnecting every second after a failure) and poll until cancelled."""
        poller = asyncio.ensure_future(self._poll())
        try:
            while True:
                stream = self.stub.WatchPending(apb.WatchPendingRequest(approver=self.name), metadata=self.metadata)
                try:
                    # The service sends nothing on the stream until a request is pending, so a
                    # ListPending answer is what shows the service is there and takes our token.
                    await self.stub.ListPending(apb.ListPendingRequest(), timeout=10, metadata=self.metadata)
                    self._set_connected(True)
                    async for pending in stream:
                        self._seen_at[pending.request_id] = asyncio.get_running_loop().time()
                        self.pending[pending.request_id] = item = pending_to_json(pending)
                        self._send("pending", item)
                    log.warning("the policy service closed the WatchPending stream")
                except grpc.aio.AioRpcError as exc:
                    log.warning("WatchPending: %s: %s", exc.code().name, exc.details())
                finally:
                    stream.cancel()
                self._set_connected(False)
                for request_id in list(self.pending):  # a closed stream no longer counts us: nothing is ours
                    self._drop(request_id, "lost the connection to the policy service")
                await asyncio.sleep(1.0)
        finally:
            poller.cancel()
            self._set_connected(False)

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.poll_s)
            asked_at = loop.time()
            try:
                reply = await self.stub.ListPending(apb.ListPendingRequest(), timeout=10, metadata=self.metadata)
            except grpc.aio.AioRpcError:
                continue  # the watch reports the failure
            still = {p.request_id for p in reply.pending}
            for request_id, seen in list(self._seen_at.items()):
                # A request that arrived after the question may legitimately be missing from the answer.
                if request_id not in still and seen < asked_at:
                    self._drop(request_id, "answered elsewhere or expired")

    async def resolve(self, request_id: str, verdict: str, reason: str) -> tuple[int, str]:
        """Answer one request; returns (HTTP status, message)."""
        request = apb.ResolveApprovalRequest(request_id=request_id, verdict=VERDICTS[verdict], reason=reason,
                                             approver=self.name)
        try:
            await self.stub.ResolveApproval(request, timeout=10, metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                self._drop(request_id, "answered elsewhere or expired")
                return 404, exc.details() or "no such pending request"
            return 502, f"{exc.code().name}: {exc.details()}"
        self._drop(request_id, _SAID[verdict] + (f": {reason}" if reason else ""))
        return 200, _SAID[verdict]
