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
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from modeldeploy.operator import children, progression, routing
from modeldeploy.operator.analysis import describe
from modeldeploy.operator.api import AnalysisResult, ModelDeploymentSpec, ModelDeploymentStatus
from modeldeploy.operator.bundle import BUNDLE_LABEL, bundle_id, selector_labels
from modeldeploy.operator.rollout import (
    ACTIVE,
    RolloutState,
    Signals,
    advance,
    canary_weight,
    cohort_replicas,
    serving_bundles,
)
from modeldeploy.operator.status import cohort, condition, replica_failure
from modeldeploy.operator.topology import NodeInfo, fit

DESIRED_HASH = "modeldeploy.dev/desired-hash"


@dataclass(frozen=True)
class Create:
    obj: dict[str, Any]


@dataclass(frozen=True)
class Patch:
    """JSON merge patch: lists are replaced whole, so an edited container list reverts."""

    kind: str
    name: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str


@dataclass(frozen=True)
class PatchStatus:
    status: dict[str, Any]


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Annotate:
    """Merge patch of the ModelDeployment's own annotations (None removes): consumes a manual command."""

    annotations: dict[str, str | None]


Action = Create | Patch | Delete | PatchStatus | Event | Annotate


@dataclass
class Observed:
    deployments: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[NodeInfo] | None = None  # None: not known yet, skip the fit check
    # bundle id -> load progress (0..1) reported by /health/ready of its pods that are not Ready yet
    loading: dict[str, list[float]] = field(default_factory=dict)
    # bundle id -> load error a pod of it reported (runtime /health/ready status "failed")
    load_errors: dict[str, str] = field(default_factory=dict)
    # rollout inputs gathered by the I/O layer (canary_io): gate result, latest analysis, manual command
    conformance: tuple[bool, str] | None = None
    analysis: AnalysisResult | None = None
    analysis_at: float | None = None
    command: str | None = None
    command_annotations: tuple[str, ...] = ()
    routes: list[dict[str, Any]] | None = None  # HTTPRoutes owned; None: Gateway API not served
    analysis_fresh: bool = False  # `analysis` was computed for this reconcile (not read back from status)


def subset(want: Any, have: Any) -> bool:
    """Every field we set has our value (API defaults may add fields; lists must match in length)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(subset(a, b) for a, b in zip(want, have, strict=True))
        )
    if want == have:
        return True
    if isinstance(want, str) and isinstance(have, str | int):
        return _same_quantity(want, str(have))
    return False


def _same_quantity(a: str, b: str) -> bool:
    from kubernetes.utils.quantity import parse_quantity

    try:
        return parse_quantity(a) == parse_quantity(b)
    except (ValueError, TypeError, ArithmeticError):
        return False


def _reconcile_child(want: dict[str, Any], have: dict[str, Any] | None, out: list[Action]) -> None:
    """Create, or patch back to `want`; the desired-hash annotation tells our update from drift."""
    kind, name = want["kind"], want["metadata"]["name"]
    digest = hashlib.sha256(
        json.dumps([want["spec"], want["metadata"]["labels"]], sort_keys=True).encode()
    ).hexdigest()[:16]
    want["metadata"].setdefault("annotations", {})[DESIRED_HASH] = digest
    if have is None:
        out.append(Create(want))
        out.append(Event("Normal", "Created", f"created {kind} {name}"))
        return
    fields = {
        "spec": want["spec"],
        "metadata": {"labels": want["metadata"]["labels"], "annotations": {DESIRED_HASH: digest}},
    }
    # a merge patch keeps map keys it does not name: a selector key we no longer want (e.g. the
    # bundle pin of `<name>` once the canary joins) is removed with an explicit null
    stale = set((have.get("spec") or {}).get("selector") or {}) - set(want["spec"].get("selector") or {})
    if kind == "Service" and stale:
        fields["spec"] = {**want["spec"], "selector": {**want["spec"]["selector"], **dict.fromkeys(stale)}}
    if not subset(fields, have):  # (a null in the selector never matches, so it always patches)
        out.append(Patch(kind, name, fields))
        if (have["metadata"].get("annotations") or {}).get(DESIRED_HASH) == digest:
            out.append(
                Event("Normal", "DriftReverted", f"{kind} {name} was changed outside the operator; reverted")
            )
        else:
            out.append(Event("Normal", "Updated", f"updated {kind} {name} to the desired state"))


def plan(md: dict[str, Any], observed: Observed, now: str) -> list[Action]:
    meta = md.get("metadata", {})
    if meta.get("deletionTimestamp"):
        return []  # children carry ownerReferences: the garbage collector removes them
    name, generation = meta["name"], meta.get("generation")
    prior = ModelDeploymentStatus.model_validate(md.get("status") or {})
    out: list[Action] = []
    try:
        spec = ModelDeploymentSpec.model_validate(md.get("spec") or {})
    except ValidationError as e:
        msg = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())[:1000]
        cond = [condition("Degraded", True, "InvalidSpec", msg, generation, prior.conditions, now)]
        status = prior.model_copy(
            update={"observed_generation": generation, "phase": "Degraded", "conditions": cond}
        )
        return _finish(md, prior, status, out + [Event("Warning", "InvalidSpec", msg)])

    bid = bundle_id(spec.bundle)
    by_bundle = {d["metadata"].get("labels", {}).get(BUNDLE_LABEL): d for d in observed.deployments}
    pol = progression.policy(spec)
    state = progression.load_state(prior)
    if state.stable is not None and state.stable != bid and state.stable not in by_bundle:
        state = RolloutState(failed=state.failed)  # the stable Deployment is gone: start over from spec
    now_s = progression.epoch(now) or 0.0
    canary_dep = by_bundle.get(state.canary) if state.canary else None
    sig = Signals(
        desired=bid, canary_ready=_ready(canary_dep),
        canary_failure=observed.load_errors.get(state.canary) if state.canary else None,
        conformance=observed.conformance, analysis=observed.analysis, analysis_at=observed.analysis_at,
        command=observed.command,
    )  # fmt: skip
    if (
        observed.analysis_fresh and observed.analysis is not None
    ):  # every analysis is an Event, with its figures
        out.append(
            Event(
                "Warning" if observed.analysis.verdict == "Fail" else "Normal",
                "Analysis",
                describe(observed.analysis),
            )
        )
    step = advance(state, pol, sig, now_s)
    state = step.state
    if step.event is not None:
        out.append(Event(*step.event))
    if observed.command_annotations:
        out.append(Annotate({a: None for a in observed.command_annotations}))  # a command acts once

    unfit = fit(spec.topology, observed.nodes) if observed.nodes is not None else None
    sizes = cohort_replicas(state, pol, now_s)
    live: dict[str, dict[str, Any]] = {}
    for b, n in sizes.items():
        if b == bid:
            if unfit is None:
                want = children.deployment(md, spec, bid, n)
                _reconcile_child(want, by_bundle.get(bid), out)
                live[b] = want
            elif bid in by_bundle:
                live[b] = by_bundle[bid]  # an impossible placement is not applied: running pods keep serving
        elif b in by_bundle:  # an older bundle: its pod template stays as it was, only its size moves
            live[b] = by_bundle[b]
            if int((by_bundle[b].get("spec") or {}).get("replicas") or 0) != n:
                name_b = by_bundle[b]["metadata"]["name"]
                out.append(Patch("Deployment", name_b, {"spec": {"replicas": n}}))
                out.append(Event("Normal", "Scaled", f"scaled Deployment {name_b} (bundle {b}) to {n}"))
    for other, dep in by_bundle.items():
        if other not in live:
            out.append(Delete("Deployment", dep["metadata"]["name"]))
            out.append(
                Event(
                    "Normal",
                    "Deleted",
                    f"deleted Deployment {dep['metadata']['name']} (bundle {other} no longer live)",
                )
            )

    serving = serving_bundles(state)
    canary_id = state.canary if state.phase in ACTIVE or state.phase == "RollingBack" else None
    svcs = {s["metadata"]["name"]: s for s in observed.services}
    for suffix, sid in (
        ("", serving[0] if len(serving) == 1 else None),
        ("stable", state.stable if state.stable in live else None),
        ("canary", canary_id),
    ):
        want = children.service(md, suffix, sid)
        _reconcile_child(want, svcs.get(want["metadata"]["name"]), out)
    weight = canary_weight(state, pol)
    route_problem = _routes(md, spec, weight, canary_id is not None, observed, out)

    revisions = _revisions(by_bundle, prior, spec, bid)
    stable_c = cohort(
        state.stable, revisions.get(state.stable), by_bundle.get(state.stable), sizes.get(state.stable, 0),
        observed.loading.get(state.stable, []),
    )  # fmt: skip
    canary_c = None
    if canary_id:
        canary_c = cohort(
            canary_id,
            revisions.get(canary_id),
            by_bundle.get(canary_id),
            sizes.get(canary_id, 0),
            observed.loading.get(canary_id, []),
        )
    ready_total = sum(_ready(by_bundle.get(b)) for b in sizes)

    failure = replica_failure(by_bundle.get(state.stable))
    load_error = observed.load_errors.get(state.stable)
    if unfit is not None:
        degraded = ("Unschedulable", f"no node can ever fit a replica: {unfit}")
    elif load_error is not None:
        degraded = ("LoadFailed", f"bundle {state.stable} failed to load: {load_error}")
    elif failure is not None:
        degraded = ("ReplicaFailure", failure)
    elif route_problem is not None:
        degraded = ("GatewayAPIUnavailable", route_problem)
    elif state.phase == "Stable" and bid != state.stable and state.reason in progression.FAILURE_REASONS:
        degraded = (state.reason, state.message)
    else:
        degraded = None
    stable_ready = stable_c.ready_replicas >= spec.replicas
    all_ready = canary_c is None and stable_ready and state.stable == bid
    rollout_failed = degraded is not None and degraded[0] in progression.FAILURE_REASONS
    if (
        degraded
        and not rollout_failed
        and not all_ready
        and state.phase not in ACTIVE
        and state.phase != "RollingBack"
    ):
        phase = "Degraded"  # a rollout that failed is Stable on the prior bundle, with Degraded=True
    elif state.phase == "Stable" and not stable_ready and state.stable == bid:
        phase = "Deploying"  # the bundle is loading with no canary involved (first deployment, scale-up)
    else:
        phase = state.phase
    if state.phase in ACTIVE or state.phase == "RollingBack":
        progressing = (state.reason or state.phase, state.message)
    elif all_ready:
        progressing = ("Complete", "desired state reached")
    else:
        progressing = ("ReplicasNotReady", f"{stable_c.ready_replicas}/{spec.replicas} replicas ready")
    conds = [
        condition("Ready", stable_ready, "AllReplicasReady" if stable_ready else "ReplicasNotReady",
                  f"{stable_c.ready_replicas}/{spec.replicas} stable replicas ready", generation, prior.conditions, now),
        condition("Progressing", (not all_ready and not degraded) or state.phase in ACTIVE, progressing[0],
                  progressing[1], generation, prior.conditions, now),
        condition("Degraded", degraded is not None, degraded[0] if degraded else "AsExpected",
                  degraded[1] if degraded else "", generation, prior.conditions, now),
    ]  # fmt: skip
    old_degraded = next((c for c in prior.conditions if c.type == "Degraded"), None)
    if (
        degraded
        and degraded[0] not in progression.FAILURE_REASONS
        and (old_degraded is None or old_degraded.reason != degraded[0] or old_degraded.status != "True")
    ):
        out.append(Event("Warning", degraded[0], degraded[1]))
    sel = ",".join(f"{k}={v}" for k, v in selector_labels(name).items())
    status = prior.model_copy(
        update={
            "observed_generation": generation, "phase": phase, "conditions": conds, "stable": stable_c, "canary": canary_c,
            "canary_weight": weight, "replicas": sum(sizes.values()), "ready_replicas": ready_total, "selector": sel,
            "history": progression.history_entries(state, prior.history, revisions, now),
            "current_step": state.step if state.phase == "Canary" else None, "failed_bundles": list(state.failed),
            "last_analysis": observed.analysis if state.phase in ACTIVE or state.reason == "AnalysisFailed"
            else prior.last_analysis,
            "rollout": progression.rollout_status(state),
        }
    )  # fmt: skip
    return _finish(md, prior, status, out)


def _ready(dep: dict[str, Any] | None) -> int:
    return int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)


def _routes(
    md: dict[str, Any],
    spec: ModelDeploymentSpec,
    weight: int,
    has_canary: bool,
    observed: Observed,
    out: list[Action],
) -> str | None:
    """Reconcile the HTTPRoute under spec.rollout.trafficRouting.gatewayAPI; a problem message or None."""
    try:
        want = routing.http_route(md, spec, weight, has_canary)
    except ValueError as e:
        return str(e)
    have = {r["metadata"]["name"]: r for r in observed.routes or []}
    if want is None:
        for n in have:
            out.append(Delete(routing.KIND, n))
        return None
    if observed.routes is None:
        return "spec.rollout.trafficRouting.gatewayAPI is set but the cluster serves no gateway.networking.k8s.io/v1 HTTPRoute"
    _reconcile_child(want, have.get(want["metadata"]["name"]), out)
    return None


def _revisions(
    by_bundle: dict[str, dict[str, Any]], prior: ModelDeploymentStatus, spec: ModelDeploymentSpec, bid: str
) -> dict[str, str | None]:
    """Model revision per bundle id: the spec's for the desired bundle, else what was recorded."""
    out: dict[str, str | None] = {h.bundle: h.revision for h in prior.history}
    for c in (prior.stable, prior.canary):
        if c is not None:
            out[c.bundle] = c.revision
    for b, d in by_bundle.items():
        out.setdefault(b, (d["metadata"].get("labels") or {}).get("app.kubernetes.io/version"))
    out[bid] = spec.bundle.model.revision
    return out


def _finish(
    md: dict[str, Any], prior: ModelDeploymentStatus, status: ModelDeploymentStatus, out: list[Action]
) -> list[Action]:
    new = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    old = prior.model_dump(mode="json", by_alias=True, exclude_none=True)
    if new != old:
        out.append(PatchStatus(new))
    return out
