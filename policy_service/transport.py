"""Listening addresses, TLS and bearer-token authentication of the policy service (docs/DESIGN.md §4).

Addresses: ``unix:///abs/path`` (or ``unix:path``; the socket file gets mode 0600) and
``host:port`` (port 0 picks a free one). TCP may use TLS, optionally requiring client
certificates. A bearer token (gRPC metadata ``authorization: Bearer <token>``) may be required on
any transport; health checks are exempt so that orchestrators can probe without the secret.

Two credentials (docs/DESIGN.md §8): the *decision* token authorises ``EscalationPolicy`` (and
reflection); an *approvals* token, when set, is the only credential that authorises
``Approvals`` calls — the decision token never does, because whoever holds the decision token
(the escalation server, and anything that can read its token file) must not be able to answer
its own prompts.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc

HEALTH_PREFIX = "/grpc.health.v1.Health/"
#: Method-name prefix of the Approvals service (its calls need the approvals credential).
APPROVALS_PREFIX = "/execgate.v1.Approvals/"


class AddressError(ValueError):
    """Raised for a listening or target address execgate cannot use."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for TLS.

    Attributes:
        cert: the certificate chain (server: its own; client: its client certificate, optional).
        key: the private key of ``cert``.
        ca: CA bundle verifying the peer (server: client certificates, which are then
            required; client: the server's certificate, else the system roots).
    """

    cert: str | None = None
    key: str | None = None
    ca: str | None = None


def unix_path(address: str) -> str | None:
    """The socket path of a ``unix:`` address, else None."""
    if address.startswith("unix://"):
        return address[len("unix://"):]
    if address.startswith("unix:"):
        return address[len("unix:"):]
    return None


def is_local_address(address: str) -> bool:
    """True when ``address`` can only be reached from this host: a Unix socket (``unix:…``) or a
    TCP address whose host is ``localhost`` or a loopback IP (127.0.0.0/8, ``::1``; RFC 5735,
    RFC 4291). A wildcard (``0.0.0.0``, ``[::]``), another IP or any other name is not local.

    Raises:
        ValueError: ``address`` is not ``unix:…``, ``HOST:PORT`` or ``[IPV6]:PORT``.
    """
    if address.startswith("unix:"):
        return True
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is neither unix:///path nor host:port")
    return is_loopback_host(host[1:-1] if host.startswith("[") and host.endswith("]") else host)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IPs (127.0.0.0/8, ``::1``); False for any other name or IP."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: str | None) -> str | None:
    """The token in ``path`` (surrounding whitespace removed), or None without a path.

    Raises:
        OSError: the file cannot be read. ValueError: it is empty.
    """
    if not path:
        return None
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def new_token() -> str:
    """A fresh random bearer token: 32 bytes from the OS CSPRNG (``secrets``), URL-safe base64."""
    return secrets.token_urlsafe(32)


def write_private_file(path: str | os.PathLike[str], text: str) -> None:
    """Create ``path`` with mode 0600 (``O_EXCL``: never reuse or follow an existing file) and
    write ``text`` to it.

    Raises:
        OSError: the file exists or cannot be created.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text + "\n")


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """Server TLS credentials; client certificates are required when ``tls.ca`` is set.

    Raises:
        AddressError: the certificate or key is missing.
        OSError: a file cannot be read.
    """
    if not tls.cert or not tls.key:
        raise AddressError("TLS needs both a certificate and a key")
    ca = _read(tls.ca)
    return grpc.ssl_server_credentials(
        [(_read(tls.key), _read(tls.cert))], root_certificates=ca, require_client_auth=ca is not None
    )


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """Client TLS credentials (``ca`` None: system roots; ``cert``/``key``: a client certificate)."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca), private_key=_read(tls.key), certificate_chain=_read(tls.cert)
    )


def client_credentials(address: str, args: Any) -> grpc.ChannelCredentials | None:
    """Channel credentials from a client's ``--tls``/``--tls-ca``/``--tls-cert``/``--tls-key``
    options (attributes of ``args``), or None when none is given (plaintext).

    Raises:
        AddressError: TLS asked for with a Unix socket address. OSError: a PEM file is unreadable.
    """
    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_key):
        return None
    if unix_path(address) is not None:
        raise AddressError("TLS is for TCP addresses; a Unix socket is protected by its file mode")
    return channel_credentials(TlsFiles(args.tls_cert, args.tls_key, args.tls_ca))


def add_port(server: grpc.aio.Server, address: str, tls: TlsFiles | None) -> str:
    """Bind ``server`` to ``address``.

    Returns:
        The address clients should use (the real port when ``address`` asked for port 0).

    Raises:
        AddressError: the address is malformed, TLS was asked for on a Unix socket, or binding failed.
    """
    path = unix_path(address)
    if path is not None:
        if tls is not None:
            raise AddressError("TLS is for TCP addresses; a Unix socket is protected by its file mode")
        if not os.path.isabs(path):
            raise AddressError(f"Unix socket path {path!r} must be absolute")
        if not os.path.isdir(os.path.dirname(path)):
            raise AddressError(f"cannot listen on {address}: directory {os.path.dirname(path)} does not exist "
                               f"(create it first, e.g. mkdir -p -m 0700 {os.path.dirname(path)})")
        _remove_stale_socket(path)
        # The socket file must never be reachable by others, not even between bind and chmod.
        old = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            raise AddressError(f"cannot listen on {address}: {exc}") from exc
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        return f"unix://{path}"
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise AddressError(f"address {address!r} is neither unix:///path nor host:port")
    try:
        bound = server.add_secure_port(address, server_credentials(tls)) if tls else server.add_insecure_port(address)
    except RuntimeError as exc:
        raise AddressError(f"cannot listen on {address}: {exc}") from exc
    return f"{host}:{bound}"


def _remove_stale_socket(path: str) -> None:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without the right ``authorization: Bearer <token>`` with ``UNAUTHENTICATED``.

    Health checks need no token. ``Approvals`` calls need ``approvals_token`` when it is set
    (the decision token is then refused for them), else ``token``. Every other call needs
    ``token`` when it is set. Tokens are compared in constant time (``hmac.compare_digest``).

    Args:
        token: the decision token, or None for none.
        approvals_token: the approvals token, or None to let ``token`` cover Approvals too.
    """

    def __init__(self, token: str | None, *, approvals_token: str | None = None) -> None:
        self._decision = f"Bearer {token}".encode() if token else None
        self._approvals = f"Bearer {approvals_token}".encode() if approvals_token else self._decision

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_PREFIX):
            return handler
        expected = self._approvals if details.method.startswith(APPROVALS_PREFIX) else self._decision
        if expected is None:
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        given_bytes = given.encode() if isinstance(given, str) else bytes(given)
        if hmac.compare_digest(given_bytes, expected):
            return handler
        return _deny_handler(handler, "missing bearer token" if not given else "wrong bearer token")


def _deny_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that aborts with UNAUTHENTICATED."""

    async def abort(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(abort, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(abort, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(abort, **kw)
    return grpc.stream_stream_rpc_method_handler(abort, **kw)
