"""What both sides share for metrics and traces: the ``/metrics`` HTTP endpoint and OTLP set-up.

Metrics are kept in a private :class:`prometheus_client.CollectorRegistry` per service instance
(never the process-wide default registry, so that many servers, sessions and tests in one process
count apart); :class:`MetricsEndpoint` serves one registry as Prometheus text on
``http://HOST:PORT/metrics`` from prometheus_client's own HTTP server, in daemon threads: a scrape
never runs on (or waits for) the event loop that decides execs.

Traces use the OpenTelemetry API; the SDK and the OTLP exporter (the ``otel`` extra) are loaded only
when tracing is configured, by ``--otlp-endpoint`` or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) environment variable (:func:`tracer_provider_from_config`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # prometheus_client is imported where an endpoint is made: start-up time
    from prometheus_client import CollectorRegistry

#: Latency buckets, in seconds: a rules decision takes well under a millisecond, a prompt may wait
#: for a person for minutes (the default approval timeout is 60 s, a client's prompt deadline 300 s).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 30.0, 60.0, 120.0, 300.0)

#: The environment variables by which OpenTelemetry names an OTLP endpoint for traces.
OTLP_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class TelemetryError(ValueError):
    """A metrics or tracing option that cannot be honoured; the message says why."""


def parse_metrics_address(text: str, *, public: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` (``[IPV6]:PORT``; port 0: any free port) → ``(host, port)``.

    Args:
        public: allow a host that is not loopback (``0.0.0.0``, a LAN address, a name other than
            ``localhost``); without it such an address is refused, since anyone who reaches the
            port reads the decision counts of every rule.

    Raises:
        TelemetryError: not ``HOST:PORT``, or not loopback without ``public``.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise TelemetryError(f"--metrics {text!r}: expected HOST:PORT (e.g. 127.0.0.1:9464; port 0 for any free one)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    from execgate.policy_service.transport import is_loopback_host

    if not public and not is_loopback_host(host):
        raise TelemetryError(f"--metrics {text}: not a loopback address; anyone who reaches it reads the decision "
                             "counts of every rule; listen on 127.0.0.1 or pass --metrics-public")
    return host, int(port)


class MetricsEndpoint:
    """``/metrics`` (Prometheus text format) for one registry, served from daemon threads.

    Args:
        registry: what to serve.
        host, port: where to listen (port 0: any free port; see :attr:`url`).

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        bound_host, bound_port = self._httpd.server_address[:2]
        self.host, self.port = str(bound_host), int(bound_port)

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics`` as bound (the real port when 0 was asked for)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port (blocks briefly: call it off the event loop)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


@dataclass(frozen=True, slots=True)
class Tracing:
    """A configured OpenTelemetry SDK tracer provider, and how to flush it at exit.

    Attributes:
        provider: an ``opentelemetry.sdk.trace.TracerProvider`` exporting over OTLP.
        endpoint: where spans go.
    """

    provider: Any
    endpoint: str

    def shutdown(self) -> None:
        """Export what is buffered and stop (blocks up to the exporter's timeout)."""
        self.provider.shutdown()


def otlp_endpoint(option: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The OTLP endpoint to export traces to: ``option``, else the standard environment variables
    (:data:`OTLP_ENV`), else None (no tracing SDK: spans stay no-ops)."""
    if option:
        return option
    env = os.environ if environ is None else environ
    return next((env[name] for name in OTLP_ENV if env.get(name)), None)


def tracer_provider_from_config(endpoint: str | None, service_name: str) -> Tracing | None:
    """An SDK tracer provider exporting over OTLP/gRPC to ``endpoint`` in batches, or None.

    ``service_name`` is the ``service.name`` resource attribute unless ``OTEL_SERVICE_NAME`` says
    otherwise (``OTEL_RESOURCE_ATTRIBUTES`` adds others). An ``http://`` endpoint
    is plaintext, ``https://`` TLS (the exporter's own rules, which also read the other
    ``OTEL_EXPORTER_OTLP_*`` variables: headers, certificates, timeout).

    Raises:
        TelemetryError: the SDK or exporter is not installed (the ``otel`` extra).
    """
    if not endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ModuleNotFoundError as exc:
        raise TelemetryError(f"--otlp-endpoint needs {exc.name} (pip install 'execgate[otel]')") from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return Tracing(provider, endpoint)



def add_options(parser: Any, *, service_name: str) -> None:
    """Add ``--metrics HOST:PORT``, ``--metrics-public`` and ``--otlp-endpoint URL`` to ``parser``."""
    parser.add_argument("--metrics", metavar="HOST:PORT",
                        help="serve Prometheus metrics on http://HOST:PORT/metrics (loopback unless "
                             "--metrics-public; port 0: any free port, printed)")
    parser.add_argument("--metrics-public", action="store_true",
                        help="allow --metrics on a non-loopback address (anyone who reaches it reads the "
                             "decision counts of every rule)")
    parser.add_argument("--otlp-endpoint", metavar="URL",
                        help=f"export traces ({service_name}: a span per decision) over OTLP/gRPC to URL, e.g. "
                             "http://127.0.0.1:4317 (default: $OTEL_EXPORTER_OTLP_ENDPOINT; none: no export)")


def options(args: Any, *, service_name: str) -> tuple[tuple[str, int] | None, Tracing | None]:
    """Resolve :func:`add_options`' options: where to serve ``/metrics`` (or None) and the
    configured tracing (or None).

    Raises:
        TelemetryError: a bad or non-loopback ``--metrics``, or tracing without the ``otel`` extra.
    """
    listen = parse_metrics_address(args.metrics, public=args.metrics_public) if args.metrics else None
    if args.metrics_public and not args.metrics:
        raise TelemetryError("--metrics-public needs --metrics HOST:PORT")
    return listen, tracer_provider_from_config(otlp_endpoint(args.otlp_endpoint), service_name)
