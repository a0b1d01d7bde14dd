"""OpenTelemetry spans of the operator's decisions, exported over OTLP/HTTP when configured.

One `reconcile` span per reconcile of a ModelDeployment, with the phase it left the object in
and the decision (the actions applied and the Events posted) as attributes; an `analysis`
child when its observe step computed a canary analysis (spanning that step), with the verdict
and each metric's figures. The Controller owns the instance (no module state in operator/). Like the
runtime's spans (runtime/server/tracing.py) they are built after the fact from timestamps, so
with OTEL_EXPORTER_OTLP_ENDPOINT unset nothing is imported and each hook is one attribute test.
"""

from __future__ import annotations

import os
import time
from typing import Any

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def _ns(t: float) -> int:
    return int(t * 1e9)


def describe(action: Any) -> str:
    """`Create Deployment chat-1234`, `Event Warning AnalysisFailed`, `PatchStatus Canary`..."""
    kind = type(action).__name__
    if hasattr(action, "obj"):
        return f"{kind} {action.obj['kind']} {action.obj['metadata']['name']}"
    if hasattr(action, "reason"):
        return f"{kind} {action.type} {action.reason}"
    if hasattr(action, "status"):
        return f"{kind} {action.status.get('phase')}"
    if hasattr(action, "name"):
        return f"{kind} {action.kind} {action.name}"
    return kind


class OperatorTracing:
    def __init__(self) -> None:
        self.tracer: Any = None
        self.provider: Any = None
        if any(os.environ.get(v) for v in ENDPOINT_VARS):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            name = os.environ.get("OTEL_SERVICE_NAME", "modeldeploy-operator")
            self.provider = TracerProvider(resource=Resource.create({"service.name": name}))
            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            self.tracer = self.provider.get_tracer("modeldeploy.operator")

    def reconcile(
        self,
        md: dict[str, Any],
        actions: list[Any],
        status: dict[str, Any],
        start: float,
        analysis: Any = None,
        observed_at: float | None = None,
    ) -> None:
        """One finished reconcile (`start`: its time.time()); `analysis`: the canary analysis its
        observe step computed (spanning `start`..`observed_at`), if it computed one."""
        if self.tracer is None:
            return
        from opentelemetry.trace import set_span_in_context

        meta = md["metadata"]
        decision = [describe(a) for a in actions]
        root = self.tracer.start_span(
            "reconcile",
            start_time=_ns(start),
            attributes={
                "k8s.namespace.name": meta["namespace"],
                "modeldeploy.modeldeployment": meta["name"],
                "modeldeploy.phase": status.get("phase") or "",
                "modeldeploy.canary_weight": int(status.get("canaryWeight") or 0),
                "modeldeploy.stable_bundle": (status.get("stable") or {}).get("bundle") or "",
                "modeldeploy.canary_bundle": (status.get("canary") or {}).get("bundle") or "",
                "modeldeploy.decision": decision or ["none"],
            },
        )
        inside = set_span_in_context(root)
        if analysis is not None:
            r = analysis
            attrs: dict[str, Any] = {"modeldeploy.verdict": r.verdict, "modeldeploy.step": r.step or 0}
            for m in r.metrics:
                attrs[f"modeldeploy.metric.{m.metric}"] = (
                    f"{m.verdict}: canary {m.canary} stable {m.stable} threshold {m.threshold}"
                    f" samples {m.samples}"
                )
            if r.message:
                attrs["modeldeploy.message"] = r.message
            end = observed_at if observed_at is not None else time.time()
            self.tracer.start_span("analysis", context=inside, start_time=_ns(start), attributes=attrs).end(
                end_time=_ns(end)
            )
        root.end(end_time=time.time_ns())

    def flush(self) -> None:
        if self.provider is not None:
            self.provider.force_flush()
