"""Per-ModelDeployment gauges on the operator's /metrics: rollout phase, canary weight, cohorts, conditions.

Runtime series carry only `bundle`; which bundle is stable and which is the canary is the
operator's knowledge. `modeldeploy_rollout_bundle{cohort, bundle}` publishes it, so dashboards
and alerts (charts/modeldeploy-operator/files/prometheus-rules.yaml) join the two by
`(namespace, modeldeployment, bundle)`. Every series is labelled `namespace` and
`modeldeployment` (the label the chart's PodMonitor gives runtime targets). Written from the
status each reconcile computes; a changed label set removes the old series, a deleted object
removes all of its series, so a join never picks up a cohort that no longer exists.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from prometheus_client import Gauge

from modeldeploy.operator.api.v1alpha1.rollout import Rollout
from modeldeploy.operator.rollout.machine import ACTIVE_PHASES, AWAITING

KEY = ("namespace", "modeldeployment")
PHASES = ("Stable", "Prefetching", "Deploying", "Verifying", "Canary", "Promoting", "RollingBack", "Degraded")
DEFAULT_DEADLINE_S = Rollout.model_fields["progress_deadline_seconds"].default

PHASE = Gauge(
    "modeldeploy_rollout_phase", "1 for the object's current phase, 0 for the others", [*KEY, "phase"]
)
WEIGHT = Gauge("modeldeploy_canary_weight", "Percent of traffic on the canary cohort", KEY)
BUNDLE = Gauge(
    "modeldeploy_rollout_bundle",
    "1 per live cohort: which bundle is stable and which canary",
    [*KEY, "cohort", "bundle"],
)
CONDITION = Gauge(
    "modeldeploy_condition",
    "1 for each status condition's current status and reason",
    [*KEY, "type", "status", "reason"],
)
QUALITY = Gauge(
    "modeldeploy_quality_figure",
    "The last quality gate's figures (status.lastQuality): metric accuracy, greedy_agreement, "
    "answer_agreement, tokenization, mean_logprob, logprob_delta or kl, for cohort stable, canary, or the "
    "threshold applied",
    [*KEY, "metric", "cohort"],
)
QUALITY_VERDICT = Gauge(
    "modeldeploy_quality_verdict",
    "1 when the last quality gate passed, 0 when it failed; reason QualityPassed, QualityFailed, "
    "EvalSetMismatch or EvalSetInvalid, canary the bundle judged",
    [*KEY, "canary", "reason"],
)
DEADLINE = Gauge(
    "modeldeploy_rollout_deadline_timestamp_seconds",
    "Unix time by which the running rollout must be done (absent when none runs or it awaits a promote)",
    KEY,
)


def _epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def series(md: dict[str, Any], status: dict[str, Any]) -> list[tuple[Gauge, tuple[str, ...], float]]:
    """(gauge, label values, value) for one object: a pure function of its spec and status."""
    meta = md["metadata"]
    key = (meta["namespace"], meta["name"])
    phase = status.get("phase") or "Stable"
    out: list[tuple[Gauge, tuple[str, ...], float]] = [
        (PHASE, (*key, p), float(p == phase)) for p in dict.fromkeys((*PHASES, phase))
    ]
    out.append((WEIGHT, key, float(status.get("canaryWeight") or 0)))
    for cohort in ("stable", "canary"):
        bid = (status.get(cohort) or {}).get("bundle")
        if bid:
            out.append((BUNDLE, (*key, cohort, bid), 1.0))
    for c in status.get("conditions") or []:
        out.append((CONDITION, (*key, c["type"], c["status"], c.get("reason", "")), 1.0))
    out += quality_series(key, status.get("lastQuality"))
    ro = status.get("rollout") or {}
    started = _epoch(ro.get("startedAt"))
    if phase in ACTIVE_PHASES and ro.get("reason") != AWAITING and started is not None:
        spec_ro = (md.get("spec") or {}).get("rollout") or {}
        out.append(
            (DEADLINE, key, started + float(spec_ro.get("progressDeadlineSeconds", DEFAULT_DEADLINE_S)))
        )
    return out


def quality_series(
    key: tuple[str, str], q: dict[str, Any] | None
) -> list[tuple[Gauge, tuple[str, ...], float]]:
    """The last quality gate's verdict and figures (none before a gate ran)."""
    if not q:
        return []
    out = [
        (
            QUALITY_VERDICT,
            (*key, q.get("canary") or "", q.get("reason") or ""),
            float(q.get("verdict") == "Pass"),
        )
    ]
    for m in q.get("metrics") or []:
        for cohort in ("stable", "canary", "threshold"):
            if isinstance(m.get(cohort), int | float):
                out.append((QUALITY, (*key, m["metric"], cohort), float(m[cohort])))
    return out


class ObjectMetrics:
    """Keeps each object's published label sets, so what a new status no longer has is removed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[tuple[str, str], set[tuple[Gauge, tuple[str, ...]]]] = {}

    def record(self, md: dict[str, Any], status: dict[str, Any]) -> None:
        meta = md["metadata"]
        now = series(md, status)
        with self._lock:
            old = self._live.get((meta["namespace"], meta["name"]), set())
            for gauge, labels, value in now:
                gauge.labels(*labels).set(value)
            keep = {(g, labels) for g, labels, _ in now}
            for gauge, labels in old - keep:
                gauge.remove(*labels)
            self._live[(meta["namespace"], meta["name"])] = keep

    def holds(self, namespace: str, name: str) -> bool:
        """Whether series of this object are published (for tests: a deleted object has none)."""
        with self._lock:
            return (namespace, name) in self._live

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            for gauge, labels in self._live.pop((namespace, name), set()):
                gauge.remove(*labels)
