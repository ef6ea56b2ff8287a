"""``execgate approve --web HOST:PORT``: answer pending approvals from a browser.

An ``Approvals`` gRPC client (like :mod:`execgate.policy_service.approver`) with a small aiohttp
web server in front of it, for people who are not at the terminal where the policy service runs:

- ``GET /`` — the page (``web/index.html``); without a valid session cookie, the login form
  (``web/login.html``). ``GET /?token=T`` logs in once and redirects to ``/`` so the token leaves
  the address bar; ``POST /login`` does the same from the form. A wrong token answers 401.
- ``GET /events`` — server-sent events (text/event-stream): ``snapshot`` (every pending request),
  then ``pending`` (one new request), ``gone`` (answered here, elsewhere, or expired) and
  ``status`` (connected to the policy service or not). 401 without the cookie.
- ``GET /api/pending`` — the same snapshot as JSON. 401 without the cookie.
- ``POST /api/resolve`` — ``{"id", "verdict": "once"|"session"|"deny", "reason"}`` →
  ``ResolveApproval``. 401 without the cookie; 403 without the ``X-Execgate: 1`` header (a
  cross-site form cannot send it, and the cookie is ``SameSite=Strict``).

The login token comes from ``--web-token-file`` or, without it, is made up at start and printed
with the URL. Tokens are compared in constant time (:func:`hmac.compare_digest`); the cookie holds
an HMAC of a per-process nonce under the token, not the token, and dies with the process.

Only while at least one page listens does the approver watch ``WatchPending``: a connected watcher
counts as an available approver (``policy serve --approver-wait``), so with no page open prompts
are denied as unattended instead of waiting for nobody. Requests answered elsewhere or expired are
found by polling ``ListPending`` (the stream only announces new requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import importlib.resources
import json
import logging
import os
import secrets
import shlex
import socket
import ssl
from typing import Any, AsyncIterator, Callable

import grpc
from aiohttp import web

from execgate.v1 import approvals_pb2 as apb
from execgate.v1 import approvals_pb2_grpc

log = logging.getLogger(__name__)

COOKIE = "execgate_web"
_VERDICTS = {"once": apb.VERDICT_APPROVE_ONCE, "session": apb.VERDICT_APPROVE_FOR_SESSION, "deny": apb.VERDICT_DENY}
_SAID = {"once": "approved once", "session": "approved for the session", "deny": "denied"}
#: Headers on every answer. The page loads nothing from elsewhere (no CDN) and shows request data
#: as text only; no-referrer keeps a ``?token=`` URL out of Referer headers.
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _execution_text(pending: apb.PendingApproval) -> str:
    kind = pending.execution.WhichOneof("kind")
    if kind == "permissions":
        p = pending.execution.permissions
        return (f"sandboxed (network {'on' if p.network else 'off'}; writable: "
                f"{', '.join(p.writable_roots) or 'none'})")
    return {"unsandboxed": "unsandboxed", "session_default": "in the session's sandbox"}.get(kind or "", "unknown")


def _env_of(pending: apb.PendingApproval) -> dict[str, str] | None:
    """The variables that reach the command, if this version of the proto carries them (``env``)."""
    if "env" not in pending.DESCRIPTOR.fields_by_name:
        return None
    value = getattr(pending, "env")
    return {str(k): str(v) for k, v in sorted(value.items())} if hasattr(value, "items") else None


def pending_to_json(pending: apb.PendingApproval) -> dict[str, Any]:
    """The request as the page shows it (JSON-ready; ``env`` is None when the proto has no such field)."""
    target, session = pending.target, pending.session
    return {
        "id": pending.request_id,
        "program": target.program,
        "argv": list(target.argv),
        "command": shlex.join(target.argv),
        "cwd": target.workdir,
        "session": session.session_id,
        "labels": dict(sorted(session.labels.items())),
        "sandboxed": session.HasField("sandbox"),
        "rule": pending.rule_id,
        "justification": pending.reason,
        "execution": _execution_text(pending),
        "seconds_left": round(pending.seconds_left, 1),
        "env": _env_of(pending),
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
        request = apb.ResolveApprovalRequest(request_id=request_id, verdict=_VERDICTS[verdict], reason=reason,
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


class TokenGate:
    """Checks the login token and the session cookie that stands for it.

    Args:
        token: the login token (non-empty).
    """

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the web login token is empty")
        self._token = token.encode()
        # A fresh nonce per process: cookies die with the approver, and the cookie is not the token.
        self.cookie_value = hmac.new(self._token, os.urandom(32), hashlib.sha256).hexdigest()

    def token_ok(self, given: str) -> bool:
        """True if ``given`` is the token (constant time)."""
        return hmac.compare_digest(given.encode(), self._token)

    def cookie_ok(self, request: web.Request) -> bool:
        """True if the request carries the session cookie (constant time)."""
        return hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), self.cookie_value.encode())


def _asset(name: str) -> bytes:
    return importlib.resources.files("execgate.policy_service.web").joinpath(name).read_bytes()


@web.middleware
async def _headers(request: web.Request, handler: Callable) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(_HEADERS)
        raise
    if not response.prepared:  # a stream (/events) sent its own headers already
        response.headers.update(_HEADERS)
    return response


def make_app(feed: PendingFeed, gate: TokenGate, *, secure: bool = False) -> web.Application:
    """The aiohttp application (routes in the module docstring); ``secure`` marks the cookie Secure (TLS)."""
    pages = {name: _asset(name) for name in ("index.html", "login.html", "app.js", "style.css")}
    types = {"js": "text/javascript", "css": "text/css", "html": "text/html"}

    def page(name: str, status: int = 200, error: str = "") -> web.Response:
        body = pages[name].replace(b"<!--error-->", error.encode())  # fixed texts only, never input
        return web.Response(body=body, status=status, content_type=types[name.rsplit(".", 1)[1]], charset="utf-8")

    def login(given: str) -> web.StreamResponse:
        if not gate.token_ok(given):
            return page("login.html", 401, "Wrong token.")
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie(COOKIE, gate.cookie_value, httponly=True, samesite="Strict", secure=secure, path="/")
        return response

    def require(request: web.Request) -> None:
        if not gate.cookie_ok(request):
            raise web.HTTPUnauthorized(text="log in first\n")

    async def index(request: web.Request) -> web.StreamResponse:
        if "token" in request.query:
            return login(request.query["token"])
        return page("index.html") if gate.cookie_ok(request) else page("login.html")

    async def login_form(request: web.Request) -> web.StreamResponse:
        return login(str((await request.post()).get("token", "")))

    async def logout(request: web.Request) -> web.StreamResponse:
        response = web.Response(status=303, headers={"Location": "/"})
        response.del_cookie(COOKIE, path="/")
        return response

    async def static(request: web.Request) -> web.StreamResponse:
        return page(request.match_info["name"])

    async def pending(request: web.Request) -> web.StreamResponse:
        require(request)
        return web.json_response({"connected": feed.connected, "pending": feed.snapshot()})

    async def resolve(request: web.Request) -> web.StreamResponse:
        require(request)
        if request.headers.get("X-Execgate") != "1":
            raise web.HTTPForbidden(text="missing X-Execgate header\n")
        try:
            body = await request.json()
            request_id, verdict, reason = body["id"], body["verdict"], str(body.get("reason", ""))[:1000]
            if not isinstance(request_id, str) or verdict not in _VERDICTS:
                raise ValueError(verdict)
        except (ValueError, KeyError, TypeError):
            raise web.HTTPBadRequest(text="expected {id, verdict: once|session|deny, reason}\n") from None
        status, message = await feed.resolve(request_id, verdict, reason.strip())
        return web.json_response({"message": message}, status=status)

    async def events(request: web.Request) -> web.StreamResponse:
        require(request)
        return await _events(request, feed)

    async def stop(_app: web.Application) -> None:
        feed.close()

    app = web.Application(middlewares=[_headers])
    app.router.add_get("/", index)
    app.router.add_post("/login", login_form)
    app.router.add_post("/logout", logout)
    app.router.add_get(r"/static/{name:(app\.js|style\.css)}", static)
    app.router.add_get("/events", events)
    app.router.add_get("/api/pending", pending)
    app.router.add_post("/api/resolve", resolve)
    app.on_shutdown.append(stop)
    return app


async def _events(request: web.Request, feed: PendingFeed) -> web.StreamResponse:
    """The server-sent event stream (https://html.spec.whatwg.org/multipage/server-sent-events.html)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **_HEADERS})
    await response.prepare(request)
    async with feed.listen() as queue:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), timeout=15)
            except TimeoutError:
                await response.write(b": keep-alive\n\n")  # a comment line; also finds dead peers
                continue
            if item is None:
                break
            event, data = item
            await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
    return response


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``; an empty host is 127.0.0.1) → (host, port).

    Raises:
        ValueError: no port, or not a number.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--web wants HOST:PORT, not {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


async def serve_web(channel: grpc.aio.Channel, *, listen: str, token: str | None, name: str,
                    metadata: tuple[tuple[str, str], ...] = (), tls: ssl.SSLContext | None = None) -> int:
    """Serve the approval page until cancelled (SIGINT/SIGTERM in the CLI).

    Prints one line to stdout: the URL to open (with ``?token=`` when the token was made up here).

    Returns:
        0 when stopped.

    Raises:
        ValueError: bad ``listen``. OSError: the address cannot be bound.
    """
    host, port = parse_listen(listen)
    printed_token = token is None
    token = token or secrets.token_urlsafe(32)
    feed = PendingFeed(channel, name=name, metadata=metadata)
    runner = web.AppRunner(make_app(feed, TokenGate(token), secure=tls is not None), shutdown_timeout=2,
                           access_log=None)
    await runner.setup()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))  # bound here so that port 0 works and the real port is printed
        site = web.SockSite(runner, sock, ssl_context=tls)
        await site.start()
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        url = f"{'https' if tls else 'http'}://{shown}:{bound}/" + (f"?token={token}" if printed_token else "")
        print(f"execgate approve: approval page at {url}", flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        sock.close()
    return 0  # pragma: no cover - the wait above ends by cancellation only


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server TLS context from PEM files.

    Raises:
        OSError, ssl.SSLError: unreadable or invalid files.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
