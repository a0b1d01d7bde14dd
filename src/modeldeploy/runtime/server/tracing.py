"""OpenTelemetry traces of requests, exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set.

One SERVER span per /v1/* request (`POST /v1/completions`...), child of the caller's span when
a W3C `traceparent` came in, with the bundle id, request id, response id, status and outcome.
Under it, child spans from the timestamps the request already keeps: `queue` (arrival to first
scheduling, with the admission wait as an attribute), `prefill` (first scheduling to first token,
prompt tokens), `decode` (first to last token, generated tokens); events for a cancellation, a
drain abort and an admission refusal (429). Spans are built when the request ends, on the event
loop, so the engine step loop runs no tracing code; with the variable unset nothing is imported
and `from_env` returns None (the middleware then only sets headers and logs).

Exporter settings follow the OTel environment variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_EXPORTER_OTLP_HEADERS, OTEL_BSP_SCHEDULE_DELAY, OTEL_SERVICE_NAME...).
"""

from __future__ import annotations

import os
from typing import Any

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class Tracing:
    def __init__(self, resource: dict[str, str]) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attrs = {"service.name": os.environ.get("OTEL_SERVICE_NAME", "modeldeploy-runtime"), **resource}
        self.provider = TracerProvider(resource=Resource.create(attrs))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("modeldeploy.runtime.server")
        self.propagator = TraceContextTextMapPropagator()
        self._kind, self._status, self._code, self._in = SpanKind, Status, StatusCode, set_span_in_context

    @classmethod
    def from_env(cls, resource: dict[str, str]) -> Tracing | None:
        if not any(os.environ.get(v) for v in ENDPOINT_VARS):
            return None
        return cls(resource)

    def record(self, ev: Any, labels: dict[str, str]) -> str:
        """Export the spans of one finished request; returns its trace id (hex)."""
        parent = self.propagator.extract(carrier=ev.headers)
        attrs = {
            "http.request.method": ev.method,
            "url.path": ev.path,
            "http.response.status_code": ev.status,
            "modeldeploy.request_id": ev.request_id,
            "modeldeploy.bundle": labels.get("bundle", ""),
            "modeldeploy.outcome": ev.outcome or "",
            "modeldeploy.prompt_tokens": ev.prompt_tokens,
            "modeldeploy.completion_tokens": ev.completion_tokens,
        }
        if ev.response_id:
            attrs["modeldeploy.response_id"] = ev.response_id
        if ev.adapter:
            attrs["modeldeploy.adapter"] = ev.adapter
        root = self.tracer.start_span(
            f"{ev.method} {ev.path}",
            context=parent,
            kind=self._kind.SERVER,
            start_time=ev.wall_ns(ev.arrival),
            attributes=attrs,
        )
        if ev.status >= 500 or ev.outcome == "error":
            root.set_status(self._status(self._code.ERROR, f"outcome {ev.outcome}, status {ev.status}"))
        inside = self._in(root)
        m = ev.metrics
        sched = getattr(m, "first_scheduled_time", None)
        first = getattr(m, "first_token_time", None)
        last = getattr(m, "finished_time", None) or getattr(m, "last_token_time", None)
        if sched is not None:
            wait = None if ev.admitted is None else round(ev.admitted - ev.arrival, 6)
            self._child("queue", inside, ev, ev.arrival, sched, {"modeldeploy.admission_wait_s": wait})
            if first is not None:
                chunks = getattr(m, "prefill_chunks", None)
                attrs = {"modeldeploy.prompt_tokens": ev.prompt_tokens, "modeldeploy.prefill_chunks": chunks}
                self._child("prefill", inside, ev, sched, first, attrs)
                if last is not None:
                    self._child(
                        "decode", inside, ev, first, last, {"modeldeploy.tokens": ev.completion_tokens}
                    )
        elif ev.admitted is None and ev.response_id and ev.outcome != "rejected":
            self._child("queue", inside, ev, ev.arrival, ev.end, {"modeldeploy.admitted": False})
        for name, t, a in ev.events:
            root.add_event(name, attributes=a, timestamp=ev.wall_ns(t))
        root.end(end_time=ev.wall_ns(ev.end))
        return format(root.get_span_context().trace_id, "032x")

    def _child(self, name: str, ctx: Any, ev: Any, t0: float, t1: float, attrs: dict[str, Any]) -> None:
        span = self.tracer.start_span(
            name,
            context=ctx,
            start_time=ev.wall_ns(t0),
            attributes={k: v for k, v in attrs.items() if v is not None},
        )
        span.end(end_time=ev.wall_ns(max(t0, t1)))

    def shutdown(self) -> None:
        """Flush what is queued (on server exit)."""
        self.provider.shutdown()
