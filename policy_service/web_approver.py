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

The login token comes from ``--web-token-file`` (at least 16 characters) or, without it, is made
up at start and printed with the URL. Tokens are compared in constant time
(:func:`hmac.compare_digest`); wrong ones are answered one at a time after a second, so whoever
reaches the port guesses slowly. The cookie holds an HMAC of a per-process nonce under the token,
not the token, and dies with the process.

The requests come from :class:`~execgate.policy_service.web_feed.PendingFeed`. Only while at least
one page listens does the approver watch ``WatchPending``: a connected watcher
counts as an available approver (``policy serve --approver-wait``), so with no page open prompts
are denied as unattended instead of waiting for nobody. Requests answered elsewhere or expired are
found by polling ``ListPending`` (the stream only announces new requests).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib.resources
import json
import logging
import os
import secrets
import socket
import ssl
from typing import Callable

import grpc
from aiohttp import web

from execgate.policy_service.web_feed import VERDICTS, PendingFeed

log = logging.getLogger(__name__)

COOKIE = "execgate_web"
#: Shortest login token accepted (the made-up one has 43).
MIN_TOKEN_CHARS = 16
#: Seconds a wrong login token is held before the answer, one at a time.
FAILED_LOGIN_DELAY_S = 1.0
#: Headers on every answer. The page loads nothing from elsewhere (no CDN) and shows request data
#: as text only; no-referrer keeps a ``?token=`` URL out of Referer headers.
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class TokenGate:
    """Checks the login token and the session cookie that stands for it.

    Args:
        token: the login token (non-empty).
    """

    def __init__(self, token: str) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(f"the web login token must have at least {MIN_TOKEN_CHARS} characters")
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


class ApprovalPage:
    """The HTTP side: routes in the module docstring, every answer with :data:`_HEADERS`.

    Args:
        feed: the pending requests and the way to answer them.
        gate: the login token check.
        secure: served over TLS (the cookie is then marked Secure).
    """

    def __init__(self, feed: PendingFeed, gate: TokenGate, *, secure: bool = False) -> None:
        self.feed, self.gate, self.secure = feed, gate, secure
        self._failures = asyncio.Lock()
        self.assets = {name: _asset(name) for name in ("index.html", "login.html", "app.js", "style.css")}

    def app(self) -> web.Application:
        """A new aiohttp application serving this page."""
        app = web.Application(middlewares=[_headers])
        app.router.add_get("/", self.index)
        app.router.add_post("/login", self.login_form)
        app.router.add_post("/logout", self.logout)
        app.router.add_get(r"/static/{name:(app\.js|style\.css)}", self.static)
        app.router.add_get("/events", self.events)
        app.router.add_get("/api/pending", self.pending)
        app.router.add_post("/api/resolve", self.resolve)
        app.on_shutdown.append(self._shutdown)
        return app

    def _page(self, name: str, status: int = 200, error: str = "") -> web.Response:
        body = self.assets[name].replace(b"<!--error-->", error.encode())  # fixed texts only, never input
        kind = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[name.rsplit(".", 1)[1]]
        return web.Response(body=body, status=status, content_type=kind, charset="utf-8")

    async def _login(self, given: str) -> web.Response:
        if not self.gate.token_ok(given):
            # One wrong guess at a time, each held for a second: a script that reaches the port
            # (a session with network access, another local user) guesses at most once a second.
            async with self._failures:
                await asyncio.sleep(FAILED_LOGIN_DELAY_S)
            return self._page("login.html", 401, "Wrong token.")
        response = web.Response(status=303, headers={"Location": "/"})  # the token leaves the address bar
        response.set_cookie(COOKIE, self.gate.cookie_value, httponly=True, samesite="Strict", secure=self.secure,
                            path="/")
        return response

    def _require(self, request: web.Request) -> None:
        if not self.gate.cookie_ok(request):
            raise web.HTTPUnauthorized(text="log in first\n")

    async def index(self, request: web.Request) -> web.Response:
        if "token" in request.query:
            return await self._login(request.query["token"])
        return self._page("index.html" if self.gate.cookie_ok(request) else "login.html")

    async def login_form(self, request: web.Request) -> web.Response:
        return await self._login(str((await request.post()).get("token", "")))

    async def logout(self, request: web.Request) -> web.Response:
        response = web.Response(status=303, headers={"Location": "/"})
        response.del_cookie(COOKIE, path="/")
        return response

    async def static(self, request: web.Request) -> web.Response:
        return self._page(request.match_info["name"])

    async def pending(self, request: web.Request) -> web.Response:
        self._require(request)
        return web.json_response({"connected": self.feed.connected, "pending": self.feed.snapshot()})

    async def resolve(self, request: web.Request) -> web.Response:
        self._require(request)
        if request.headers.get("X-Execgate") != "1":
            raise web.HTTPForbidden(text="missing X-Execgate header\n")
        try:
            body = await request.json()
            request_id, verdict, reason = body["id"], body["verdict"], str(body.get("reason", ""))[:1000]
            if not isinstance(request_id, str) or verdict not in VERDICTS:
                raise ValueError(verdict)
        except (ValueError, KeyError, TypeError):
            raise web.HTTPBadRequest(text="expected {id, verdict: once|session|deny, reason}\n") from None
        status, message = await self.feed.resolve(request_id, verdict, reason.strip())
        return web.json_response({"message": message}, status=status)

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events (https://html.spec.whatwg.org/multipage/server-sent-events.html)."""
        self._require(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **_HEADERS})
        await response.prepare(request)
        async with self.feed.listen() as queue:
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

    async def _shutdown(self, _app: web.Application) -> None:
        self.feed.close()


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
    runner = web.AppRunner(ApprovalPage(feed, TokenGate(token), secure=tls is not None).app(), shutdown_timeout=2,
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
