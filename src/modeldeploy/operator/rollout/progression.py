"""Glue between the ModelDeployment and the pure rollout machine: spec -> Policy, status <->
RolloutState, with RFC 3339 times in status and epoch seconds inside the machine. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

from modeldeploy.operator.api.v1alpha1.common import resolve_count
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.status import HistoryEntry, ModelDeploymentStatus, RolloutStatus
from modeldeploy.operator.rollout.children import image_volume
from modeldeploy.operator.rollout.machine import IN_FLIGHT, Policy, RolloutState, Step

# Reasons a rollout ends in, that leave the object Degraded while spec still asks for that bundle.
FAILURE_REASONS = (
    "AnalysisFailed",
    "AnalysisInconclusive",
    "LoadTimeout",
    "ConformanceFailed",
    "ConformanceTimeout",
    "QualityFailed",
    "QualityTimeout",
    "EvalSetMismatch",
    "EvalSetInvalid",
    "CanaryFailed",
    "PrefetchFailed",
    "PrefetchTimeout",
    "ProgressDeadlineExceeded",
    "PromotionTimeout",
    "Aborted",
    "RolledBackTo",
    "BundleFailed",
)


RFC3339 = "%Y-%m-%dT%H:%M:%SZ"  # every time the operator writes (status, Events, annotations), UTC seconds


def epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    return datetime.strptime(ts, RFC3339).replace(tzinfo=UTC).timestamp()


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(round(t), UTC).strftime(RFC3339)


def now_iso() -> str:
    """The current time as status writes it."""
    return datetime.now(UTC).strftime(RFC3339)


def policy(spec: ModelDeploymentSpec) -> Policy:
    r = spec.rollout
    return Policy(
        replicas=spec.replicas,
        steps=tuple(Step(s.weight, s.pause_seconds, s.await_promotion, s.replicas) for s in r.steps),
        conformance_gate=r.conformance_gate,
        quality_gate=r.analysis.quality is not None and r.analysis.quality.enabled,
        quality_timeout_seconds=r.analysis.quality.timeout_seconds if r.analysis.quality else 300,
        quality_each_step=r.analysis.quality is not None
        and r.analysis.quality.enabled
        and r.analysis.quality.at_each_step,
        load_timeout_seconds=spec.readiness.load_timeout_seconds,
        progress_deadline_seconds=r.progress_deadline_seconds,
        keep_previous_replicas=warm_budget(spec),
        keep_previous_seconds=(r.keep_prior or r.keep_previous).seconds,
        keep_gpus=(r.keep_prior.max_gpus if r.keep_prior else None),
        gateway=r.traffic_routing.gateway_api is not None,
        on_inconclusive=r.analysis.on_inconclusive,
        capacity=r.capacity,
        min_available=min(spec.replicas, resolve_count(r.min_available, spec.replicas)),
        prefetch=prefetch_enabled(spec),
        prefetch_timeout_seconds=r.prefetch.timeout_seconds,
    )


def prefetch_enabled(spec: ModelDeploymentSpec) -> bool:
    """spec.rollout.prefetch.enabled, by default on exactly when an artifact is an image volume: the node's
    image store keeps what a pre-pull pod pulled, where other schemes stage files inside each pod."""
    if spec.rollout.prefetch.enabled is not None:
        return spec.rollout.prefetch.enabled
    artifacts = [spec.bundle.model, *(spec.bundle.adapters or [])]
    return any(image_volume(a) for a in artifacts)


def warm_budget(spec: ModelDeploymentSpec) -> int:
    """Warm prior replicas: keepPrior.replicas within maxGPUs (without keepPrior: keepPrevious.replicas)."""
    keep, gpus = spec.rollout.keep_prior, spec.topology.gpus_per_replica
    if keep is None:
        return spec.rollout.keep_previous.replicas
    if keep.max_gpus is None or gpus == 0:
        return keep.replicas
    return min(keep.replicas, keep.max_gpus // gpus)


def load_state(st: ModelDeploymentStatus) -> RolloutState:
    """The machine's state from status; an object never reconciled starts empty."""
    ro = st.rollout or RolloutStatus()
    phase = st.phase if st.phase in IN_FLIGHT else "Stable"
    if st.canary is None and phase != "RollingBack":
        phase = "Stable"  # "Deploying" with no canary is the first bundle loading, shown but not a rollout
    return RolloutState(
        phase=phase,
        stable=st.stable.bundle if st.stable else None,
        canary=st.canary.bundle if st.canary and phase != "Stable" else None,
        step=st.current_step,
        started_at=epoch(ro.started_at),
        phase_since=epoch(ro.phase_since),
        reason=ro.reason,
        message=ro.message,
        failed=tuple(st.failed_bundles),
        previous=ro.previous,
        previous_until=epoch(ro.previous_until),
        history=tuple(h.bundle for h in st.history),
        capacity=ro.capacity or "",
        capacity_reason=ro.capacity_reason or "",
        restore=ro.restore or "",
        prior=ro.prior or "",
        prior_reason=ro.prior_reason or "",
    )


def history_entries(
    state: RolloutState, prior: list[HistoryEntry], revisions: dict[str, str | None], now: str
) -> list[HistoryEntry]:
    """status.history for the machine's history ids, keeping the timestamps already recorded."""
    known = {h.bundle: h for h in prior}
    return [
        known.get(b) or HistoryEntry(bundle=b, revision=revisions.get(b), replaced_at=now)
        for b in state.history
    ][-50:]


def rollout_status(state: RolloutState, pulled: tuple[int, int] | None = None) -> RolloutStatus:
    """status.rollout from the machine's state; `pulled`: Prefetching's (pods Ready, pods wanted)."""
    return RolloutStatus(
        prefetched_nodes=pulled[0] if pulled else None,
        prefetch_nodes=pulled[1] if pulled else None,
        started_at=iso(state.started_at),
        phase_since=iso(state.phase_since),
        reason=state.reason,
        message=state.message[:4096],
        previous=state.previous,
        previous_until=iso(state.previous_until),
        capacity=state.capacity or None,
        capacity_reason=state.capacity_reason[:1024] or None,
        restore=state.restore or None,
        prior=state.prior or None,
        prior_reason=state.prior_reason[:1024] or None,
    )
