"""The status half of `plan`: the Degraded reason, the phase, the conditions, the status object and
its patch, the Events a new Degraded or capacity wait posts, and the checks the operator makes on a
plan's status (`capacity_decided`, `unschedulable`). Pure, no I/O; reads `Inputs` like every
sub-planner."""

from __future__ import annotations

from typing import Any

from modeldeploy.operator.api.v1alpha1.status import Condition, ModelDeploymentStatus, PrefetchWait
from modeldeploy.operator.rollout import prefetch, progression
from modeldeploy.operator.rollout.actions import Action, Event, PatchStatus
from modeldeploy.operator.rollout.bundle import selector_labels
from modeldeploy.operator.rollout.capacity import INSUFFICIENT
from modeldeploy.operator.rollout.inputs import CohortSummary, Degraded, Inputs
from modeldeploy.operator.rollout.machine import ACTIVE_PHASES, IN_FLIGHT, RolloutState
from modeldeploy.operator.rollout.status import condition, replica_failure


def prefetch_progress(x: Inputs, state: RolloutState) -> tuple[int, int] | None:
    """(pre-pull pods Ready, wanted) of the canary being pre-pulled; None outside Prefetching."""
    if state.phase != "Prefetching" or state.canary is None:
        return None
    pulled = prefetch.progress(x.prefetching.get(state.canary))
    return pulled if pulled is not None else (0, prefetch.pods_wanted(x.spec, x.observed.nodes))


def prefetch_waits(x: Inputs, state: RolloutState) -> list[prefetch.Waiting]:
    """What the canary's pre-pull pods that are not Ready wait on; [] outside Prefetching."""
    if state.phase != "Prefetching" or state.canary is None:
        return []
    return x.observed.prefetch_waiting.get(state.canary, [])


def plan_degraded(x: Inputs, state: RolloutState, unfit: str | None, route_problem: str | None) -> Degraded:
    """The one Degraded reason that applies, most fundamental first; None when nothing is wrong."""
    failure = replica_failure(x.by_bundle.get(state.stable) if state.stable else None)
    load_error = x.observed.load_errors.get(state.stable) if state.stable else None
    if unfit is not None:
        return "Unschedulable", f"no node can ever fit a replica: {unfit}"
    if load_error is not None:
        return "LoadFailed", f"bundle {state.stable} failed to load: {load_error}"
    if failure is not None:
        return "ReplicaFailure", failure
    if route_problem is not None:
        return "GatewayAPIUnavailable", route_problem
    if state.phase == "Stable" and x.bid != state.stable and state.reason in progression.FAILURE_REASONS:
        return state.reason, state.message
    return None


def plan_phase(state: RolloutState, degraded: Degraded, cohorts: CohortSummary, bid: str) -> str:
    """status.phase: the machine's phase, except Degraded (broken, not a rollout) and first-load Deploying."""
    rollout_failed = degraded is not None and degraded[0] in progression.FAILURE_REASONS
    if degraded and not rollout_failed and not cohorts.all_ready and state.phase not in IN_FLIGHT:
        return "Degraded"  # a rollout that failed is Stable on the prior bundle, with Degraded=True
    if state.phase == "Stable" and not cohorts.stable_ready and state.stable == bid:
        return "Deploying"  # the bundle is loading with no canary involved (first deployment, scale-up)
    return state.phase


def plan_conditions(
    x: Inputs, state: RolloutState, degraded: Degraded, cohorts: CohortSummary, waiting: str | None = None
) -> list[Condition]:
    """Ready, Progressing and Degraded; lastTransitionTime kept while a condition's status holds."""
    ready_n, want = cohorts.stable.ready_replicas, x.spec.replicas
    pulled = prefetch_progress(x, state)
    if waiting is not None:
        progressing = (INSUFFICIENT, waiting)
    elif pulled is not None:
        waits = prefetch.summary(prefetch_waits(x, state))
        message = f"{state.message}; images pulled on {pulled[0]}/{pulled[1]} nodes" + (
            f"; {waits}" if waits else ""
        )
        progressing = ("Prefetching", message[:4096])
    elif state.phase in IN_FLIGHT:
        progressing = (state.reason or state.phase, state.message)
    elif cohorts.all_ready:
        progressing = ("Complete", "desired state reached")
    else:
        progressing = ("ReplicasNotReady", f"{ready_n}/{want} replicas ready")
    ready = cohorts.stable_ready
    moving = (not cohorts.all_ready and not degraded) or state.phase in ACTIVE_PHASES
    bad_reason, bad_message = degraded or ("AsExpected", "")
    gen, old, now = x.generation, x.prior.conditions, x.now
    return [
        condition("Ready", ready, "AllReplicasReady" if ready else "ReplicasNotReady",
                  f"{ready_n}/{want} stable replicas ready", gen, old, now),
        condition("Progressing", moving, progressing[0], progressing[1], gen, old, now),
        condition("Degraded", degraded is not None, bad_reason, bad_message, gen, old, now),
    ]  # fmt: skip


def degraded_event(prior: ModelDeploymentStatus, degraded: Degraded) -> list[Action]:
    """A Warning when the object turns Degraded for a new reason (a failed rollout has its own Events)."""
    if not degraded or degraded[0] in progression.FAILURE_REASONS:
        return []
    old = next((c for c in prior.conditions if c.type == "Degraded"), None)
    if old is not None and old.reason == degraded[0] and old.status == "True":
        return []
    return [Event("Warning", degraded[0], degraded[1])]


def capacity_event(prior: ModelDeploymentStatus, waiting: str | None) -> list[Action]:
    """A Warning when a Replace rollout starts waiting for capacity (once, while the condition says so)."""
    if waiting is None:
        return []
    old = next((c for c in prior.conditions if c.type == "Progressing"), None)
    return [] if old is not None and old.reason == INSUFFICIENT else [Event("Warning", INSUFFICIENT, waiting)]


def plan_status(
    x: Inputs,
    state: RolloutState,
    phase: str,
    conditions: list[Condition],
    cohorts: CohortSummary,
    sizes: dict[str, int],
    weight: int,
) -> ModelDeploymentStatus:
    """The whole status: figures, the machine's state, history and the analysis that decided the step."""
    sel = ",".join(f"{k}={v}" for k, v in selector_labels(x.md["metadata"]["name"]).items())
    waits = prefetch_waits(x, state)
    analysis_counts = state.phase in ACTIVE_PHASES or state.reason in (
        "AnalysisFailed",
        "AnalysisInconclusive",
    )
    return x.prior.model_copy(
        update={
            "observed_generation": x.generation,
            "phase": phase,
            "conditions": conditions,
            "stable": cohorts.stable,
            "canary": cohorts.canary,
            "canary_weight": weight,
            "replicas": scale_replicas(x.spec.replicas, state, sizes),
            "ready_replicas": cohorts.ready_total,
            "selector": sel,
            "history": progression.history_entries(state, x.prior.history, revisions_of(x), x.now),
            "current_step": state.step if state.phase == "Canary" else None,
            "failed_bundles": list(state.failed),
            "last_analysis": x.observed.analysis if analysis_counts else x.prior.last_analysis,
            "last_quality": x.observed.quality or x.prior.last_quality,  # kept after the rollout ends
            "rollout": progression.rollout_status(state, prefetch_progress(x, state)).model_copy(
                update={
                    "prefetch_waiting": [PrefetchWait(node=n, reason=r, message=m) for n, r, m in waits]
                    or None
                }
            ),
        }
    )


def scale_replicas(replicas: int, state: RolloutState, sizes: dict[str, int]) -> int:
    """status.replicas of the scale subresource, comparable with spec.replicas (what an HPA reads as the
    current scale): the slots stable and canary fill together, never the surge canary on top of a full
    stable, nor a warm prior bundle. So an HPA at its target during a canary does not scale up."""
    serving = sum(sizes.get(b, 0) for b in {state.stable, state.canary} if b)
    return min(replicas, serving)


# status.rollout fields that change exactly when the machine took a decision reading the nodes' spare
# GPUs: a rollout starting (capacity Auto's fit check), a Replace rollback's restore order, the warm
# prior at promotion
FIT_DECISIONS = ("startedAt", "restore", "prior", "priorReason")


def capacity_decided(prior: dict[str, Any] | None, actions: list[Action]) -> bool:
    """Whether `actions` (a plan of the object whose status was `prior`) record a decision made on the
    nodes' spare GPUs; the operator then plans again on a fresh node list, never on a cached one whose
    GPU usage may predate the stable's own pods."""
    new = next((a.status for a in actions if isinstance(a, PatchStatus)), None)
    if new is None:
        return False
    old, now = (prior or {}).get("rollout") or {}, new.get("rollout") or {}
    return any(old.get(f) != now.get(f) for f in FIT_DECISIONS)


def unschedulable(prior: dict[str, Any] | None, actions: list[Action]) -> bool:
    """Whether the status `actions` leave (the written one, else `prior`) says Degraded/Unschedulable:
    a verdict the operator makes only on a recent node list (observe.UNFIT_TTL_S)."""
    status = next((a.status for a in actions if isinstance(a, PatchStatus)), prior) or {}
    return any(
        c.get("type") == "Degraded" and c.get("status") == "True" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def status_patch(prior: ModelDeploymentStatus, status: ModelDeploymentStatus) -> list[Action]:
    """A PatchStatus when the status differs from what is stored, else nothing (idempotent reconcile)."""
    new = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    old = prior.model_dump(mode="json", by_alias=True, exclude_none=True)
    return [PatchStatus(new)] if new != old else []


def revisions_of(x: Inputs) -> dict[str, str | None]:
    """Model revision per bundle id: the spec's for the desired bundle, else what was recorded."""
    out: dict[str, str | None] = {h.bundle: h.revision for h in x.prior.history}
    for c in (x.prior.stable, x.prior.canary):
        if c is not None:
            out[c.bundle] = c.revision
    for b, d in x.by_bundle.items():
        out.setdefault(b, (d["metadata"].get("labels") or {}).get("app.kubernetes.io/version"))
    out[x.bid] = x.spec.bundle.model.revision
    return out
