"""A real OTLP/gRPC trace receiver for tests: a ``TraceService`` (opentelemetry-proto) on loopback
that keeps every span exported to it."""

from __future__ import annotations

import contextlib
import threading
from concurrent import futures
from typing import Any, Iterator

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps each exported span as ``(name, {attribute: value})``."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 - gRPC method name
        with self.lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        attrs = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                        self.spans.append((span.name, attrs))
        return trace_service_pb2.ExportTraceServiceResponse()

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [attrs for n, attrs in self.spans if n == name]


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[Receiver, str]]:
    """A running receiver and its endpoint (``http://127.0.0.1:PORT``: plaintext)."""
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        server.stop(0).wait()
