"""The operator's reconcile and analysis spans reach an OTLP receiver with the decision."""

from __future__ import annotations

import time

import pytest
from support.plan_driver import advance_to, analysis, at, stable_then_change

from modeldeploy.operator.controller.tracing import OperatorTracing
from modeldeploy.operator.rollout.plan import Observed, plan
from modeldeploy.operator.rollout.progression import epoch

otlp = pytest.importorskip("modeldeploy_dev.otlp", reason="opentelemetry-proto not installed")


def test_reconcile_span_carries_the_decision_and_the_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    rx = otlp.Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url)
    tr = OperatorTracing()
    try:
        obj, obs, _, _ = stable_then_change()
        obj, obs, _ = advance_to(obj, obs, at(0), ready={})
        obj, obs, _ = advance_to(obj, obs, at(1))
        obj, obs, _ = advance_to(obj, obs, at(1, 20), conformance=(True, "8/8 checks passed"))
        # one reconcile as Controller._reconcile runs it: observe (here: an analysis it computed),
        # plan, record
        t0 = time.time()
        failing = analysis("Fail", 0)
        view = Observed(
            obs.deployments, obs.services, obs.nodes, analysis=failing, analysis_at=epoch(at(1, 40))
        )
        observed_at = time.time()
        actions = plan(obj, view, at(1, 40))
        status = next(a.status for a in actions if type(a).__name__ == "PatchStatus")
        tr.reconcile(obj, actions, status, t0, failing, observed_at)
        tr.flush()
        rx.wait_for(lambda: len(rx.spans) >= 2)
    finally:
        rx.stop()
    [root] = [s for s in rx.spans if s["name"] == "reconcile"]
    [child] = [s for s in rx.spans if s["name"] == "analysis"]
    assert child["parent"] == root["span_id"] and child["trace_id"] == root["trace_id"]
    assert child["attrs"]["modeldeploy.verdict"] == "Fail"
    assert child["attrs"]["modeldeploy.metric.ttft_p95_seconds"].startswith("Fail: canary")
    attrs = root["attrs"]
    assert attrs["modeldeploy.modeldeployment"] == "chat" and attrs["k8s.namespace.name"] == "ns"
    assert attrs["modeldeploy.phase"] == status["phase"] == "RollingBack"
    decision = (
        list(attrs["modeldeploy.decision"].values) if hasattr(attrs["modeldeploy.decision"], "values") else []
    )
    assert any(d.startswith("Event Warning AnalysisFailed") for d in [v.string_value for v in decision]), (
        decision
    )
    assert root["resource"]["service.name"] == "modeldeploy-operator"


def test_off_without_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    tr = OperatorTracing()
    assert tr.tracer is None
    tr.reconcile({"metadata": {"namespace": "n", "name": "x"}}, [], {}, time.time())  # a no-op
