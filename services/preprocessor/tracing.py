"""OpenTelemetry tracing of the request path: off by default, `--otlp-endpoint` turns it on.

One trace per request, continuing the client's W3C `traceparent` when it sends a valid one:

    POST /v1/chat/completions           (SERVER; request id, model, status, tokens)
      template, tokenize                the prompt stages that take time
      route                             per attempt: the router's decision (worker, overlap)
      prefill_hop                       disaggregated: opening the prefill + decode legs
      dispatch                          the attempt on its engine, until it ends; its context
        first_token                     goes to the engine as `traceparent` gRPC metadata
      migration                         a fault -> the new attempt dispatched (kind, tokens)

Spans are started and ended by hand (they cross awaits and callbacks, not one `with` block).
With tracing off, `Deps.tracing` is None, the request path imports neither this module nor
OpenTelemetry (generation.py only names it for type checking), and each span
point costs one None check per stage or attempt; nothing is done per token either way
(first_token ends once per attempt, where the token loop already branches).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SERVICE_NAME = "switchyard-preprocessor"
_PROPAGATOR = TraceContextTextMapPropagator()


def _version() -> str:
    try:
        return metadata.version("switchyard")
    except metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "unknown"


class Tracing:
    """The process's tracer; `processor` decides where spans go (OTLP, or a test's memory)."""

    def __init__(
        self, processor: SpanProcessor, sample_ratio: float = 1.0, instance: str = ""
    ) -> None:
        if not 0.0 <= sample_ratio <= 1.0:
            raise ValueError(f"--trace-sample-ratio must be within [0, 1], got {sample_ratio}")
        attributes = {"service.name": SERVICE_NAME}
        if instance:
            attributes["service.instance.id"] = instance
        self.provider = TracerProvider(
            resource=Resource.create(attributes),
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
        )
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("switchyard.preprocessor", _version())

    @classmethod
    def otlp(cls, endpoint: str, sample_ratio: float = 1.0, instance: str = "") -> Tracing:
        """Spans exported in batches over OTLP/gRPC (`http://` endpoints: plaintext)."""
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
        return cls(BatchSpanProcessor(exporter), sample_ratio, instance)

    def start(self, name: str, headers: Mapping[str, str], attributes: dict[str, Any]) -> Trace:
        parent = _PROPAGATOR.extract(headers) if headers else None
        root = self.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return Trace(self.tracer, root)

    def shutdown(self) -> None:
        """Export what is pending (BatchSpanProcessor) and stop."""
        self.provider.shutdown()


class Trace:
    """One request's spans."""

    __slots__ = ("_tracer", "root")

    def __init__(self, tracer: trace.Tracer, root: Span) -> None:
        self._tracer = tracer
        self.root = root

    def span(self, name: str, parent: Span | None = None, /, **attributes: Any) -> Span:
        """A started child span of `parent` (default: the request's span)."""
        context = trace.set_span_in_context(parent if parent is not None else self.root)
        return self._tracer.start_span(name, context=context, attributes=attributes or None)

    @staticmethod
    def traceparent(span: Span) -> str | None:
        """The W3C traceparent naming `span` as the parent (None for an invalid span)."""
        ctx = span.get_span_context()
        if not ctx.is_valid:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    @staticmethod
    def fail(span: Span, kind: str, message: str) -> None:
        """End a span that failed (an attempt that the engine or transport broke)."""
        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR, message))
        span.end()

    def end(self, status: int, error: str, attributes: dict[str, Any]) -> None:
        root = self.root
        root.set_attributes(attributes)
        root.set_attribute("http.response.status_code", status)
        if error:
            root.set_attribute("error.type", error)
            if status >= 500 or status == 200:  # a server fault, or one inside a stream
                root.set_status(Status(StatusCode.ERROR, error))
        root.end()
