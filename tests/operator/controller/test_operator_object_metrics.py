"""The operator's per-object gauges follow the statuses plan() writes."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY
from support.plan_driver import advance_to, analysis, at, stable_then_change

from modeldeploy.operator.controller.object_metrics import ObjectMetrics, series
from modeldeploy.operator.rollout.progression import epoch


def published(ns: str, name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the default registry labelled with this object, by (name, other labels)."""
    out = {}
    for fam in REGISTRY.collect():
        for s in fam.samples:
            if s.labels.get("namespace") == ns and s.labels.get("modeldeployment") == name:
                rest = tuple(
                    sorted((k, v) for k, v in s.labels.items() if k not in ("namespace", "modeldeployment"))
                )
                out[(s.name, rest)] = s.value
    return out


# the registry is the process's: a namespace no other test's objects use, so the series read back are
# this test's alone whatever ran before it in the same process
NS = "object-metrics-test"


def test_canary_step_publishes_phase_weight_cohorts_and_deadline() -> None:
    obj, obs, old, _ = stable_then_change()
    obj["metadata"]["namespace"] = NS
    obj, obs, _ = advance_to(obj, obs, at(0), ready={})
    new = obj["status"]["canary"]["bundle"]
    obj, obs, _ = advance_to(obj, obs, at(1))
    obj, obs, _ = advance_to(obj, obs, at(1, 20), conformance=(True, "8/8 checks passed"))
    st = obj["status"]
    assert st["phase"] == "Canary"
    m = ObjectMetrics()
    m.record(obj, st)
    got = published(NS, "chat")
    assert got[("modeldeploy_rollout_phase", (("phase", "Canary"),))] == 1.0
    assert sum(v for (n, _), v in got.items() if n == "modeldeploy_rollout_phase") == 1.0  # one current phase
    assert got[("modeldeploy_canary_weight", ())] == 25.0
    assert got[("modeldeploy_rollout_bundle", (("bundle", old), ("cohort", "stable")))] == 1.0
    assert got[("modeldeploy_rollout_bundle", (("bundle", new), ("cohort", "canary")))] == 1.0
    started = epoch(st["rollout"]["startedAt"])
    assert got[("modeldeploy_rollout_deadline_timestamp_seconds", ())] == started + 1800
    assert (
        got[("modeldeploy_condition", (("reason", "AsExpected"), ("status", "False"), ("type", "Degraded")))]
        == 1
    )

    # the analysis fails: rolled back, the canary cohort and the deadline are gone, Degraded is True
    obj, obs, _ = advance_to(obj, obs, at(1, 40), analysis=analysis("Fail", 0), analysis_at=epoch(at(1, 40)))
    obj, obs, _ = advance_to(obj, obs, at(1, 50))
    m.record(obj, obj["status"])
    got = published(NS, "chat")
    phase = obj["status"]["phase"]
    assert got[("modeldeploy_rollout_phase", (("phase", phase),))] == 1.0 and phase != "Canary"
    assert not any(n == "modeldeploy_rollout_bundle" and ("cohort", "canary") in k for n, k in got)
    assert ("modeldeploy_rollout_deadline_timestamp_seconds", ()) not in got
    assert got[
        ("modeldeploy_condition", (("reason", "AnalysisFailed"), ("status", "True"), ("type", "Degraded")))
    ]
    assert (
        "modeldeploy_condition",
        (("reason", "AsExpected"), ("status", "False"), ("type", "Degraded")),
    ) not in got

    m.forget(NS, "chat")
    assert published(NS, "chat") == {}


def test_awaiting_promotion_has_no_deadline_and_spec_deadline_is_used() -> None:
    md: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "x"},
        "spec": {"rollout": {"progressDeadlineSeconds": 600}},
    }
    status = {
        "phase": "Canary",
        "canaryWeight": 50,
        "rollout": {"startedAt": "2026-01-01T00:00:00Z", "reason": "StepPaused"},
    }
    deadline = [
        v for g, _, v in series(md, status) if g._name == "modeldeploy_rollout_deadline_timestamp_seconds"
    ]
    assert deadline == [epoch("2026-01-01T00:00:00Z") + 600]
    status["rollout"]["reason"] = "AwaitingPromotion"
    assert not [g for g, _, _ in series(md, status) if g._name.endswith("deadline_timestamp_seconds")]
