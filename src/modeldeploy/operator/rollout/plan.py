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
Each one is pure and takes the `Inputs` every planner shares (`inputs.py`); the status half
(Degraded, phase, conditions, status, its patch) is `status_plan.py`, re-exported here.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from modeldeploy.operator.analysis.verdicts import describe
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.status import (
    CohortStatus,
    ModelDeploymentStatus,
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
from modeldeploy.operator.rollout.drift import (  # noqa: F401  (DESIRED_HASH re-exported)
    DESIRED_HASH,
    one_created,
    reconcile_child,
)
from modeldeploy.operator.rollout.inputs import CohortSummary, Degraded, Inputs  # noqa: F401 (re-exported)
from modeldeploy.operator.rollout.inputs import ready_of as _ready
from modeldeploy.operator.rollout.machine import (
    ACTIVE_PHASES,
    IN_FLIGHT,
    RolloutState,
    Signals,
    advance,
)
from modeldeploy.operator.rollout.sizing import canary_weight, capacity_wait, cohort_replicas, serving_bundles
from modeldeploy.operator.rollout.status import cohort, condition
from modeldeploy.operator.rollout.status_plan import (  # noqa: F401  (re-exported: the reconciler and tests)
    capacity_decided,
    capacity_event,
    degraded_event,
    plan_conditions,
    plan_degraded,
    plan_phase,
    plan_status,
    prefetch_progress,
    prefetch_waits,
    revisions_of,
    scale_replicas,
    status_patch,
    unschedulable,
)
from modeldeploy.operator.rollout.topology import fit, spare_fit


def plan(md: dict[str, Any], observed: Observed, now: str) -> list[Action]:
    if md.get("metadata", {}).get("deletionTimestamp"):
        return []  # children carry ownerReferences: the garbage collector removes them
    prior = ModelDeploymentStatus.model_validate(md.get("status") or {})
    try:
        spec = ModelDeploymentSpec.model_validate(md.get("spec") or {})
    except ValidationError as e:
        return plan_invalid(md, prior, e, now)
    if observed.gate_key_sha256 is None and (problem := keyed_gates(spec)):
        return plan_refused(md, prior, "NoGateKey", problem, now)
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
    out += one_created(children_out + routes + plan_network(x)) + plan_lost_pods(x, state)
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
    msg = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())[:1000]
    return plan_refused(md, prior, "InvalidSpec", msg, now)


def plan_refused(
    md: dict[str, Any], prior: ModelDeploymentStatus, reason: str, msg: str, now: str
) -> list[Action]:
    """A spec this operator cannot carry out: Degraded=True `reason`, no children touched (running
    pods keep serving)."""
    generation = md["metadata"].get("generation")
    cond = [condition("Degraded", True, reason, msg, generation, prior.conditions, now)]
    status = prior.model_copy(
        update={"observed_generation": generation, "phase": "Degraded", "conditions": cond}
    )
    return [Event("Warning", reason, msg), *status_patch(prior, status)]


def keyed_gates(spec: ModelDeploymentSpec) -> str | None:
    """Why a keyed ModelDeployment cannot be gated by an operator without a gate key (None: it can)."""
    if spec.bundle.config.api_key_secret_ref is None:
        return None
    gates = [
        name
        for name, on in (
            ("rollout.conformanceGate", spec.rollout.conformance_gate),
            ("rollout.analysis.quality", spec.rollout.analysis.quality is not None),
        )
        if on
    ]
    if not gates:
        return None
    return (
        f"bundle.config.apiKeySecretRef with {' and '.join(gates)}: the gates ask the pods' /v1 API, and "
        "this operator has no gate key to ask a keyed pod with "
        f"(set env {children.GATE_KEY_ENV} on the operator; the Helm chart does), or turn those gates off"
    )


def plan_lost_pods(x: Inputs, state: RolloutState) -> list[Action]:
    """Delete our pods that sit not Ready on a node the node controller marked lost, so their
    ReplicaSet places them elsewhere now rather than after their NoExecute toleration (300 s by
    default) runs out, where deleting them costs nothing or is what the rollout waits on:
    - a pod that never started there (Pending: bound in the node's grace period, before it was
      marked; a restore's new stable pod, seen in bench/results/chaos.md): it never served;
    - the canary's pods while a canary moves (its step holds on them), and the stable's while
      rolling back (the restore waits on them).
    Other pods, which ran there and may come back with the node, follow the cluster's eviction policy
    (`topology.tolerations`), which also rides out a short heartbeat gap. A deleted pod stays
    Terminating until its node answers or is removed; its ReplicaSet no longer counts it."""
    if state.phase == "RollingBack":
        waited = state.stable
    elif state.phase in ACTIVE_PHASES:
        waited = state.canary
    else:
        waited = None
    out: list[Action] = []
    for bundle, pods in sorted(x.observed.lost_pods.items()):
        for pod in pods:
            if bundle != waited and pod.started:
                continue
            why = "never started there" if not pod.started else f"the {state.phase} rollout waits on it"
            out.append(Delete("Pod", pod.name))
            out.append(
                Event(
                    "Warning",
                    "PodOnLostNode",
                    f"deleted pod {pod.name} (bundle {bundle}; {why}): not Ready on node {pod.node}, which "
                    "the node controller marked unreachable or not ready; its ReplicaSet places it on "
                    "another node",
                )
            )
    return out


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
            want = children.deployment(x.md, x.spec, x.bid, n, x.observed.gate_key_sha256)
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
