"""The operator's own Prometheus metrics (served by `modeldeploy operator --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RECONCILES = Counter("modeldeploy_operator_reconciles_total", "ModelDeployment reconciles completed")
REQUESTS = Counter(
    "modeldeploy_operator_reconcile_requests_total",
    "Reconciles asked for, by what asked (modeldeployment, child, tick, resync, retry, raced)"
    " and whether the ask ran a pass, was folded into one waiting or running (coalesced),"
    " or was found to be the echo of the operator's own status write once a worker took it (echo):"
    " where the reconciles come from",
    ["source", "outcome"],
)
ERRORS = Counter("modeldeploy_operator_reconcile_errors_total", "Reconciles that raised", ["error"])
DECISIONS = Counter(
    "modeldeploy_operator_decisions_total", "Child objects created, patched or deleted", ["action", "kind"]
)
STANDBY_SKIPS = Counter(
    "modeldeploy_operator_standby_skips_total",
    "Reconciles not run: another replica is the active one (peering)",
)
EVENTS = Counter("modeldeploy_operator_events_total", "Kubernetes Events posted, by reason", ["reason"])
RECONCILE_SECONDS = Histogram(
    "modeldeploy_operator_reconcile_seconds",
    "Wall time of one reconcile (read, plan, apply)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUALITY_GATES = Counter(
    "modeldeploy_operator_quality_gates_total",
    "Quality gates finished (canary against stable on the pinned evaluation set), by verdict and reason"
    " (QualityPassed, QualityFailed, EvalSetMismatch, EvalSetInvalid)",
    ["verdict", "reason"],
)
QUALITY_SECONDS = Histogram(
    "modeldeploy_operator_quality_gate_seconds",
    "Wall time of one quality gate (both cohorts answer and score every item)",
    buckets=(1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 300),
)
