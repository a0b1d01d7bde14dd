"""The reconcile decision: `plan(desired, observed, now) -> actions`. Pure, no I/O.

Given the ModelDeployment (spec, metadata, last status) and what exists (its child
Deployments and Services, the nodes), return what to do: create/patch/delete children,
the status to write, and one Event per decision. Level-triggered and idempotent: a second
call on the result of the first returns no actions, which is what makes operator restarts
safe and drift (someone editing a child) revert on the next event.

A bundle change goes through the rollout state machine (`rollout.advance`, one decision per
reconcile): a canary Deployment next to the full stable one, the conformance gate, weighted
steps judged by canary analysis, then promotion with the prior bundle kept warm, or a
rollback. The machine's state lives in status, so a restarted operator resumes it.

`plan()` is a chain of named sub-planners, read top to bottom as Argo's `rolloutCanary()` is:
rollout step, the pre-pull Deployment (phase Prefetching), Deployments, Services, HTTPRoute,
NetworkPolicy, cohort figures, Degraded, phase, conditions, status.
Each one is pure and takes the `Inputs` every planner shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from modeldeploy.operator.analysis.verdicts import describe
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.status import (
    CohortStatus,
    Condition,
    ModelDeploymentStatus,
    PrefetchWait,
)
from modeldeploy.operator.rollout import children, network, prefetch, progression, routing
from modeldeploy.operator.rollout.actions import (  # noqa: F401  (re-exported: plan's vocabulary)
    Action,
    Annotate,
    Create,
    Delete,
    Event,
    Observed,
    Patch,
    PatchStatus,
)
from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, bundle_id, selector_labels
from modeldeploy.operator.rollout.capacity import INSUFFICIENT, Have
from modeldeploy.operator.rollout.drift import (  # noqa: F401  (DESIRED_HASH re-exported)
    DESIRED_HASH,
    one_created,
    reconcile_child,
)
from modeldeploy.operator.rollout.machine import (
    ACTIVE_PHASES,
    IN_FLIGHT,
    Policy,
    RolloutState,
    Signals,
    advance,
)
from modeldeploy.operator.rollout.sizing import canary_weight, capacity_wait, cohort_replicas, serving_bundles
from modeldeploy.operator.rollout.status import cohort, condition, replica_failure
from modeldeploy.operator.rollout.topology import fit, spare_fit

Degraded = tuple[str, str] | None  # (reason, message) of a Degraded=True condition


@dataclass(frozen=True)
class Inputs:
    """What every sub-planner reads: the object, its parsed spec and last status, what exists, the time."""

    md: dict[str, Any]
    spec: ModelDeploymentSpec
    prior: ModelDeploymentStatus
    observed: Observed
    now: str
    bid: str  # bundle id of spec.bundle
    by_bundle: dict[str, dict[str, Any]]  # observed Deployments by bundle label (unlabelled ones left out)
    policy: Policy
    now_s: float
    have: dict[str, Have]  # observed size and Ready replicas per bundle (Replace capacity reads them)
    prefetching: dict[str, dict[str, Any]]  # observed pre-pull Deployments by the bundle they pull
    holding: dict[str, dict[str, Any]]  # observed hold Deployments by the bundle they keep warm

    @classmethod
    def of(
        cls,
        md: dict[str, Any],
        spec: ModelDeploymentSpec,
        prior: ModelDeploymentStatus,
        obs: Observed,
        now: str,
    ) -> Inputs:
        labelled = ((d["metadata"].get("labels", {}).get(BUNDLE_LABEL), d) for d in obs.deployments)
        by_bundle = {b: d for b, d in labelled if b}
        pulls = ((d["metadata"].get("labels", {}).get(prefetch.PREFETCH_LABEL), d) for d in obs.deployments)
        holds = ((d["metadata"].get("labels", {}).get(prefetch.HOLD_LABEL), d) for d in obs.deployments)
        have = {
            b: Have(int((d.get("spec") or {}).get("replicas") or 0), _ready(d)) for b, d in by_bundle.items()
        }
        return cls(
            md,
            spec,
            prior,
            obs,
            now,
            bundle_id(spec.bundle),
            by_bundle,
            progression.policy(spec),
            progression.epoch(now) or 0.0,
            have,
            {b: d for b, d in pulls if b},
            {b: d for b, d in holds if b},
        )

    @property
    def generation(self) -> int | None:
        return self.md["metadata"].get("generation")


@dataclass(frozen=True)
class CohortSummary:
    """Status figures of the stable and canary cohorts, and the readiness the conditions read."""

    stable: CohortStatus
    canary: CohortStatus | None
    ready_total: int  # Ready replicas over every live bundle
    stable_ready: bool  # the stable cohort has spec.replicas Ready
    all_ready: bool  # no canary, stable is the spec's bundle and fully Ready


def plan(md: dict[str, Any], observed: Observed, now: str) -> list[Action]:
    if md.get("metadata", {}).get("deletionTimestamp"):
        return []  # children carry ownerReferences: the garbage collector removes them
    prior = ModelDeploymentStatus.model_validate(md.get("status") or {})
    try:
        spec = ModelDeploymentSpec.model_validate(md.get("spec") or {})
    except ValidationError as e:
        return plan_invalid(md, prior, e, now)
    x = Inputs.of(md, spec, prior, observed, now)
    state, out = plan_rollout(x)
    sizes = cohort_replicas(state, x.policy, x.now_s, x.have)
    unfit = (
        fit(spec.topology, observed.nodes, spec.bundle.config.device) if observed.nodes is not None else None
    )
    live, deployments = plan_deployments(x, sizes, unfit)
    canary_id = state.canary if state.phase in IN_FLIGHT else None
    weight = canary_weight(state, x.policy)
    route_problem, routes = plan_routes(x, weight, canary_id is not None)
    children_out = deployments + plan_prefetch(x, state) + plan_hold(x, state)
    children_out += plan_services(x, state, live, canary_id)
    out += one_created(children_out + routes + plan_network(x))
    cohorts = plan_cohorts(x, state, sizes, canary_id, live)
    degraded = plan_degraded(x, state, unfit, route_problem)
    waiting = capacity_wait(state, x.policy, x.have)
    conditions = plan_conditions(x, state, degraded, cohorts, waiting)
    out += degraded_event(x.prior, degraded) + capacity_event(x.prior, waiting)
    phase = plan_phase(state, degraded, cohorts, x.bid)
    status = plan_status(x, state, phase, conditions, cohorts, sizes, weight)
    return out + status_patch(prior, status)


def plan_invalid(
    md: dict[str, Any], prior: ModelDeploymentStatus, e: ValidationError, now: str
) -> list[Action]:
    """A spec the API types refuse: Degraded=True InvalidSpec naming each field, no children touched."""
    generation = md["metadata"].get("generation")
    msg = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())[:1000]
    cond = [condition("Degraded", True, "InvalidSpec", msg, generation, prior.conditions, now)]
    status = prior.model_copy(
        update={"observed_generation": generation, "phase": "Degraded", "conditions": cond}
    )
    return [Event("Warning", "InvalidSpec", msg), *status_patch(prior, status)]


def plan_rollout(x: Inputs) -> tuple[RolloutState, list[Action]]:
    """One decision of the rollout machine, the Analysis Event that fed it, and consuming a command."""
    obs, out = x.observed, []
    state = progression.load_state(x.prior)
    if state.stable is not None and state.stable != x.bid and state.stable not in x.by_bundle:
        state = RolloutState(failed=state.failed)  # the stable Deployment is gone: start over from spec
    failure = obs.load_errors.get(state.canary) if state.canary else None
    waits = prefetch_waits(x, state)
    if state.phase == "Prefetching":  # a pre-pull pod whose image cannot be pulled: the canary's neither
        failure = prefetch_failure(x, state, waits)
    sig = Signals(
        desired=x.bid,
        canary_ready=_ready(x.by_bundle.get(state.canary) if state.canary else None),
        canary_failure=failure,
        prefetch=prefetch_progress(x, state),
        prefetch_waiting=prefetch.summary(waits) or None,
        conformance=obs.conformance,
        quality=obs.quality,
        analysis=obs.analysis,
        analysis_at=obs.analysis_at,
        command=obs.command,
        stable_ready=_ready(x.by_bundle.get(state.stable) if state.stable else None),
        **capacity_signals(x, state),
    )
    if obs.analysis_fresh and obs.analysis is not None:  # every analysis is an Event, with its figures
        kind = "Warning" if obs.analysis.verdict == "Fail" else "Normal"
        out.append(Event(kind, "Analysis", describe(obs.analysis)))
    step = advance(state, x.policy, sig, x.now_s)
    if step.event is not None:
        out.append(Event(*step.event))
    if obs.command_annotations:
        out.append(Annotate({a: None for a in obs.command_annotations}))  # a command acts once
    return step.state, out


def capacity_signals(x: Inputs, state: RolloutState) -> dict[str, Any]:
    """The fit check's answers the machine needs now: does a full canary fit beside stable (a rollout
    about to start, capacity Auto), do the stable's freed replicas fit again (a Replace rollout)."""
    nodes, topo, device = x.observed.nodes, x.spec.topology, x.spec.bundle.config.device
    if nodes is None:
        return {}
    if (
        state.phase == "Stable"
        and state.stable is not None  # a first deployment has no canary: nothing to fit beside
        and x.bid not in (state.stable, *state.failed)
        and x.policy.capacity == "Auto"
    ):
        return {"surge_fits": spare_fit(topo, nodes, x.spec.replicas, device)}
    if state.phase in ACTIVE_PHASES and state.capacity == "Replace" and state.stable in x.have:
        kept = x.have[state.stable].replicas
        missing, warm = x.spec.replicas - kept, x.policy.keep_previous_replicas - kept
        return {
            "restore_fits": spare_fit(topo, nodes, missing, device)[0],
            "prior_fits": spare_fit(topo, nodes, warm, device) if state.phase == "Promoting" else None,
        }
    return {}


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


def prefetch_failure(x: Inputs, state: RolloutState, waits: list[prefetch.Waiting]) -> str | None:
    """A pre-pull whose failure ends Prefetching now (PrefetchFailed): a pull error that names the artifact
    (not found, a digest mismatch, refused credentials), read from the pods' waiting reasons or from the
    pull failure observe filed; a registry or network error that may pass waits for prefetch.timeoutSeconds,
    whose PrefetchTimeout message then names it (prefetch.terminal)."""
    failed = prefetch.failure(waits)
    filed = x.observed.load_errors.get(prefetch.error_key(state.canary or ""))
    if failed is None and filed is not None and prefetch.terminal("ImagePullBackOff", filed):
        failed = filed
    return failed


def plan_prefetch(x: Inputs, state: RolloutState) -> list[Action]:
    """The pre-pull Deployment while the spec's bundle is Prefetching (one pod per node its canary may
    use); deleted as the phase ends, whichever way: its pods only pulled, the canary's keep the images."""
    out: list[Action] = []
    have = dict(x.prefetching)
    if state.phase == "Prefetching" and state.canary == x.bid:
        want = prefetch.deployment(x.md, x.spec, x.bid, prefetch.pods_wanted(x.spec, x.observed.nodes))
        out += reconcile_child(want, have.pop(x.bid, None))
    for bid, dep in have.items():
        name = dep["metadata"]["name"]
        out += [
            Delete("Deployment", name),
            Event(
                "Normal", "Deleted", f"deleted Deployment {name} (pre-pull of {bid} done or no longer wanted)"
            ),
        ]
    return out


def plan_hold(x: Inputs, state: RolloutState) -> list[Action]:
    """With spec.rollout.prefetch.keepRollbackTarget: a hold Deployment keeping the rollback target's
    images (status.history's newest bundle) in use on every node the bundle may use, so image garbage
    collection leaves them (prefetch.py says why). Built from the target's Deployment while it exists (the
    warm or cold prior after a promotion); after that the hold's own template is the record and only its
    size follows the nodes. Any other hold is deleted: a new promotion moves the target."""
    have = dict(x.holding)
    target = state.history[-1] if state.history else None
    out: list[Action] = []
    if x.spec.rollout.prefetch.keep_rollback_target and target not in (None, state.stable):
        assert target is not None
        source = x.by_bundle.get(target) or have.get(target)
        held = prefetch.held_images(source) if source is not None else None
        if held is not None:
            n = prefetch.pods_wanted(x.spec, x.observed.nodes)
            out += reconcile_child(
                prefetch.hold_deployment(x.md, x.spec, target, held, n), have.pop(target, None)
            )
    for bid, dep in have.items():
        name = dep["metadata"]["name"]
        out += [
            Delete("Deployment", name),
            Event("Normal", "Deleted", f"deleted Deployment {name} ({bid} is no longer the rollback target)"),
        ]
    return out


def plan_deployments(
    x: Inputs, sizes: dict[str, int], unfit: str | None
) -> tuple[dict[str, dict[str, Any]], list[Action]]:
    """One Deployment per live bundle at its size; others deleted. Returns the live ones and the actions."""
    live: dict[str, dict[str, Any]] = {}
    out: list[Action] = []
    for b, n in sizes.items():
        have = x.by_bundle.get(b)
        if b == x.bid and unfit is None:
            want = children.deployment(x.md, x.spec, x.bid, n)
            out += reconcile_child(want, have)
            live[b] = want
        elif have is not None:  # an impossible placement is not applied: running pods keep serving;
            live[b] = have  # an older bundle's pod template stays as it was, only its size moves
            if b != x.bid and int((have.get("spec") or {}).get("replicas") or 0) != n:
                name = have["metadata"]["name"]
                out.append(Patch("Deployment", name, {"spec": {"replicas": n}}))
                out.append(Event("Normal", "Scaled", f"scaled Deployment {name} (bundle {b}) to {n}"))
    for other, dep in x.by_bundle.items():
        if other not in live:
            name = dep["metadata"]["name"]
            out.append(Delete("Deployment", name))
            out.append(
                Event("Normal", "Deleted", f"deleted Deployment {name} (bundle {other} no longer live)")
            )
    return live, out


def plan_services(
    x: Inputs, state: RolloutState, live: dict[str, dict[str, Any]], canary_id: str | None
) -> list[Action]:
    """`<name>` (every serving bundle, pinned while there is one), `<name>-stable`, `<name>-canary`.

    The cohort Services are created when there are cohorts and kept after (selecting no pod, or the
    stable's, between rollouts): `<name>-canary` with the first canary, `<name>-stable` with the first
    canary or as soon as an HTTPRoute names it (gatewayAPI routing). Before that `<name>` is pinned to
    the one serving bundle and selects exactly the stable's pods, so a cohort Service would be a copy
    of it: each costs a ClusterIP, Endpoints, an EndpointSlice and every node's proxy rules, which a
    fleet of new objects would pay for Services nothing routes to (bench/results/operator.md)."""
    serving = serving_bundles(state)
    have = {s["metadata"]["name"]: s for s in x.observed.services}
    routed = x.spec.rollout.traffic_routing.gateway_api is not None
    out: list[Action] = []
    for suffix, sid in (
        ("", serving[0] if len(serving) == 1 else None),
        ("stable", state.stable if state.stable in live else None),
        ("canary", canary_id),
    ):
        want = children.service(x.md, suffix, sid)
        kept = have.get(want["metadata"]["name"])
        if suffix and kept is None and canary_id is None and not (suffix == "stable" and routed):
            continue  # no cohorts yet: created when the first canary starts
        out += reconcile_child(want, kept)
    return out


def plan_routes(x: Inputs, weight: int, has_canary: bool) -> tuple[str | None, list[Action]]:
    """The HTTPRoute under spec.rollout.trafficRouting.gatewayAPI: (a problem message or None, actions)."""
    try:
        want = routing.http_route(x.md, x.spec, weight, has_canary)
    except ValueError as e:
        return str(e), []
    have = {r["metadata"]["name"]: r for r in x.observed.routes or []}
    if want is None:
        return None, [Delete(routing.KIND, n) for n in have]
    if x.observed.routes is None:
        return (
            "spec.rollout.trafficRouting.gatewayAPI is set but the cluster serves no "
            "gateway.networking.k8s.io/v1 HTTPRoute",
            [],
        )
    return None, reconcile_child(want, have.get(want["metadata"]["name"]))


def plan_network(x: Inputs) -> list[Action]:
    """The NetworkPolicy `<name>` under spec.network: created or reverted while wanted, deleted when
    spec.network.policy turns false (as is any other owned policy). Nothing when policies were not read."""
    if x.observed.policies is None:
        return []
    want = network.network_policy(x.md, x.spec, x.observed.operator_namespace)
    have = {p["metadata"]["name"]: p for p in x.observed.policies}
    out: list[Action] = []
    if want is not None:
        out += reconcile_child(want, have.pop(want["metadata"]["name"], None))
    why = "spec.network.policy is false" if want is None else "not this object's policy"
    for name in have:
        out += [
            Delete(network.KIND, name),
            Event("Normal", "Deleted", f"deleted NetworkPolicy {name} ({why})"),
        ]
    return out


def plan_cohorts(
    x: Inputs,
    state: RolloutState,
    sizes: dict[str, int],
    canary_id: str | None,
    live: dict[str, dict[str, Any]],
) -> CohortSummary:
    """Replica and load-progress figures of the stable and (while in flight) canary cohorts.

    A Deployment this plan creates is named in status already (`live`, no status: 0 ready), so the
    create needs no second reconcile just to record its name."""
    revisions = revisions_of(x)

    def figures(b: str) -> CohortStatus:
        dep = x.by_bundle.get(b) or live.get(b)
        return cohort(b, revisions.get(b), dep, sizes.get(b, 0), x.observed.loading.get(b, []))

    stable = figures(state.stable or x.bid)  # advance() makes the first bundle stable: never None here
    stable_ready = stable.ready_replicas >= x.spec.replicas
    return CohortSummary(
        stable=stable,
        canary=figures(canary_id) if canary_id else None,
        ready_total=sum(_ready(x.by_bundle.get(b)) for b in sizes),
        stable_ready=stable_ready,
        all_ready=canary_id is None and stable_ready and state.stable == x.bid,
    )


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


def _ready(dep: dict[str, Any] | None) -> int:
    return int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)
