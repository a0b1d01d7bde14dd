"""The reconcile decision: `plan(desired, observed, now) -> actions`. Pure, no I/O.

Given the ModelDeployment (spec, metadata, last status) and what exists (its child
Deployments and Services, the nodes), return what to do: create/patch/delete children,
the status to write, and one Event per decision. Level-triggered and idempotent: a second
call on the result of the first returns no actions, which is what makes operator restarts
safe and drift (someone editing a child) revert on the next event.

Bundle change without the rollout engine: the new bundle gets its own Deployment at full
size next to the stable one; when all its replicas are Ready it is promoted and the old
Deployment is deleted. The rollout issue refines the middle (steps, analysis, rollback).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from modeldeploy.operator import children
from modeldeploy.operator.api import HistoryEntry, ModelDeploymentSpec, ModelDeploymentStatus
from modeldeploy.operator.bundle import BUNDLE_LABEL, bundle_id, selector_labels
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


Action = Create | Patch | Delete | PatchStatus | Event


@dataclass
class Observed:
    deployments: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[NodeInfo] | None = None  # None: not known yet, skip the fit check
    # bundle id -> load progress (0..1) reported by /health/ready of its pods that are not Ready yet
    loading: dict[str, list[float]] = field(default_factory=dict)
    # bundle id -> load error a pod of it reported (runtime /health/ready status "failed")
    load_errors: dict[str, str] = field(default_factory=dict)


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
    if not subset(fields, have):
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
    stable_id = prior.stable.bundle if prior.stable else None
    if stable_id is None or stable_id not in by_bundle or stable_id == bid:
        stable_id, canary_id = bid, None
    else:
        canary_id = bid

    unfit = fit(spec.topology, observed.nodes) if observed.nodes is not None else None
    history = list(prior.history)
    live: dict[str, dict[str, Any]] = {}
    promoted = False
    if canary_id is not None:
        canary_dep = by_bundle.get(canary_id)
        ready = int(((canary_dep or {}).get("status") or {}).get("readyReplicas") or 0)
        if canary_dep is not None and ready >= spec.replicas:
            history.append(HistoryEntry(bundle=stable_id, revision=prior.stable.revision, replaced_at=now))
            out.append(
                Event(
                    "Normal",
                    "Promoted",
                    f"bundle {canary_id} is Ready ({ready}/{spec.replicas}); replaces {stable_id}",
                )
            )
            stable_id, canary_id, promoted = canary_id, None, True
        else:
            live[stable_id] = by_bundle[stable_id]  # keep serving as it is while the new bundle loads

    if unfit is None:
        want = children.deployment(md, spec, bid, spec.replicas)
        _reconcile_child(want, by_bundle.get(bid), out)
        live[bid] = want
    elif bid in by_bundle:
        live[bid] = by_bundle[bid]  # an impossible placement is not applied: running pods keep serving
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

    svcs = {s["metadata"]["name"]: s for s in observed.services}
    for suffix, sid in (
        ("", None),
        ("stable", stable_id if stable_id in live else None),
        ("canary", canary_id),
    ):
        want = children.service(md, suffix, sid)
        _reconcile_child(want, svcs.get(want["metadata"]["name"]), out)

    stable_c = cohort(
        stable_id,
        _revision(prior, stable_id, spec, bid),
        by_bundle.get(stable_id),
        _size(by_bundle.get(stable_id), spec, stable_id == bid),
        observed.loading.get(stable_id, []),
    )
    canary_c = None
    if canary_id:
        dep = by_bundle.get(canary_id)
        canary_c = cohort(
            canary_id, spec.bundle.model.revision, dep, spec.replicas, observed.loading.get(canary_id, [])
        )
    ready_total = stable_c.ready_replicas + (canary_c.ready_replicas if canary_c else 0)
    weight = round(100 * canary_c.ready_replicas / ready_total) if canary_c and ready_total else 0

    failure = replica_failure(by_bundle.get(bid))
    load_error = next(((b, observed.load_errors[b]) for b in (bid, stable_id) if b in observed.load_errors), None)
    if unfit is not None:
        degraded = ("Unschedulable", f"no node can ever fit a replica: {unfit}")
    elif load_error is not None:
        degraded = ("LoadFailed", f"bundle {load_error[0]} failed to load: {load_error[1]}")
    elif failure is not None:
        degraded = ("ReplicaFailure", failure)
    else:
        degraded = None
    all_ready = canary_c is None and stable_c.ready_replicas >= spec.replicas and stable_id == bid
    if degraded and not all_ready:
        phase = "Degraded"
    elif canary_c is not None:
        phase = "Deploying"
    else:
        phase = "Stable" if all_ready else "Deploying"
    progressing = (
        ("NewBundle", f"bundle {bid} loading: {canary_c.ready_replicas}/{spec.replicas} ready")
        if canary_c
        else (
            ("Complete", "desired state reached")
            if all_ready
            else ("ReplicasNotReady", f"{stable_c.ready_replicas}/{spec.replicas} replicas ready")
        )
    )
    if promoted:
        progressing = ("Promoted", f"bundle {bid} promoted")
    conds = [
        condition(
            "Ready",
            stable_c.ready_replicas >= spec.replicas,
            "AllReplicasReady" if stable_c.ready_replicas >= spec.replicas else "ReplicasNotReady",
            f"{stable_c.ready_replicas}/{spec.replicas} stable replicas ready",
            generation,
            prior.conditions,
            now,
        ),
        condition(
            "Progressing",
            not all_ready and not degraded,
            progressing[0],
            progressing[1],
            generation,
            prior.conditions,
            now,
        ),
        condition(
            "Degraded",
            degraded is not None,
            degraded[0] if degraded else "AsExpected",
            degraded[1] if degraded else "",
            generation,
            prior.conditions,
            now,
        ),
    ]
    old_degraded = next((c for c in prior.conditions if c.type == "Degraded"), None)
    if degraded and (
        old_degraded is None or old_degraded.reason != degraded[0] or old_degraded.status != "True"
    ):
        out.append(Event("Warning", degraded[0], degraded[1]))
    sel = ",".join(f"{k}={v}" for k, v in selector_labels(name).items())
    status = prior.model_copy(
        update={
            "observed_generation": generation, "phase": phase, "conditions": conds, "stable": stable_c, "canary": canary_c,
            "canary_weight": weight, "replicas": stable_c.replicas + (canary_c.replicas if canary_c else 0),
            "ready_replicas": ready_total, "selector": sel, "history": history[-50:],
        }
    )  # fmt: skip
    return _finish(md, prior, status, out)


def _size(dep: dict[str, Any] | None, spec: ModelDeploymentSpec, current: bool) -> int:
    if current or dep is None:
        return spec.replicas
    return int((dep.get("spec") or {}).get("replicas") or 0)


def _revision(prior: ModelDeploymentStatus, sid: str, spec: ModelDeploymentSpec, bid: str) -> str | None:
    if sid == bid:
        return spec.bundle.model.revision
    return prior.stable.revision if prior.stable and prior.stable.bundle == sid else None


def _finish(
    md: dict[str, Any], prior: ModelDeploymentStatus, status: ModelDeploymentStatus, out: list[Action]
) -> list[Action]:
    new = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    old = prior.model_dump(mode="json", by_alias=True, exclude_none=True)
    if new != old:
        out.append(PatchStatus(new))
    return out
