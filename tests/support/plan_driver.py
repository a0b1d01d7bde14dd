"""Drives plan(desired, observed) as the applier and the cluster would: the rollout tests' clock
and world."""

from __future__ import annotations

import copy
from typing import Any

from modeldeploy.operator.api.v1alpha1.status import AnalysisResult, MetricVerdict
from modeldeploy.operator.rollout.plan import (
    Create,
    Delete,
    Observed,
    Patch,
    PatchStatus,
    plan,
)
from support.operator_fixtures import as_observed, gpu_nodes, md

NOW = "2026-01-01T00:00:00Z"


def kinds(actions: list) -> list[tuple[str, str, str]]:
    out = []
    for a in actions:
        if isinstance(a, Create):
            out.append(("create", a.obj["kind"], a.obj["metadata"]["name"]))
        elif isinstance(a, Patch):
            out.append(("patch", a.kind, a.name))
        elif isinstance(a, Delete):
            out.append(("delete", a.kind, a.name))
    return sorted(out)


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386) as the API server applies it: null removes, maps merge."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


def status_of(actions: list) -> dict[str, Any]:
    found = [a.status for a in actions if isinstance(a, PatchStatus)]
    assert len(found) == 1, actions
    return found[0]


def converge(
    obj: dict[str, Any], observed: Observed, ready: int | None = None
) -> tuple[dict[str, Any], Observed]:
    """Apply a plan the way the applier would, with every Deployment at `ready` ready replicas."""
    acts = plan(obj, observed, NOW)
    deps = {d["metadata"]["name"]: d for d in observed.deployments}
    svcs = {s["metadata"]["name"]: s for s in observed.services}
    for a in acts:
        if isinstance(a, Create):
            target = deps if a.obj["kind"] == "Deployment" else svcs
            target[a.obj["metadata"]["name"]] = as_observed(a.obj, ready)
        elif isinstance(a, Delete):
            (deps if a.kind == "Deployment" else svcs).pop(a.name)
        elif isinstance(a, Patch):
            target = deps if a.kind == "Deployment" else svcs
            merge(target[a.name]["spec"], a.body["spec"])
            target[a.name]["metadata"].setdefault("annotations", {}).update(
                a.body.get("metadata", {}).get("annotations", {})
            )
        elif isinstance(a, PatchStatus):
            obj = {**obj, "status": a.status}
    return obj, Observed(list(deps.values()), list(svcs.values()), observed.nodes)


def at(minute: int, second: int = 0) -> str:
    return f"2026-01-01T00:{minute:02d}:{second:02d}Z"


def advance_to(
    obj: dict[str, Any], obs: Observed, now: str, ready: dict[str, int] | None = None, **rollout: Any
) -> tuple[dict[str, Any], Observed, list]:
    """One reconcile at `now`; Deployments report `ready[bundle]` ready replicas (default: all)."""
    for d in obs.deployments:
        b = d["metadata"]["labels"]["modeldeploy.dev/bundle"]
        d["status"]["readyReplicas"] = (ready or {}).get(b, d["spec"]["replicas"])
    view = Observed(obs.deployments, obs.services, obs.nodes, **rollout)
    acts = plan(obj, view, now)
    deps = {d["metadata"]["name"]: d for d in obs.deployments}
    svcs = {s["metadata"]["name"]: s for s in obs.services}
    for a in acts:
        if isinstance(a, Create):
            (deps if a.obj["kind"] == "Deployment" else svcs)[a.obj["metadata"]["name"]] = as_observed(a.obj)
        elif isinstance(a, Delete):
            if a.kind != "Pod":  # pods are the ReplicaSet's: their deletion changes no Deployment here
                (deps if a.kind == "Deployment" else svcs).pop(a.name)
        elif isinstance(a, Patch):
            merge((deps if a.kind == "Deployment" else svcs)[a.name]["spec"], a.body["spec"])
        elif isinstance(a, PatchStatus):
            obj = {**obj, "status": a.status}
    return obj, Observed(list(deps.values()), list(svcs.values()), obs.nodes), acts


def analysis(verdict: str, step: int, canary_ttft: float = 0.1) -> AnalysisResult:
    return AnalysisResult(
        step=step,
        verdict=verdict,
        metrics=[
            MetricVerdict(
                metric="ttft_p95_seconds",
                stable=0.1,
                canary=canary_ttft,
                threshold=0.12,
                samples=60,
                verdict=verdict,
            )
        ],
    )


def stable_then_change() -> tuple[dict[str, Any], Observed, str, str]:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()))
    obj, obs = converge(obj, obs)
    old = obj["status"]["stable"]["bundle"]
    obj = copy.deepcopy(obj)
    obj["spec"]["bundle"]["config"]["maxNumSeqs"] = 4
    obj["spec"]["rollout"] = {
        "steps": [{"weight": 25, "pauseSeconds": 30}, {"weight": 50, "pauseSeconds": 30}]
    }
    obj["metadata"]["generation"] = 2
    return obj, obs, old, ""


def selector(obs: Observed, name: str) -> dict[str, str]:
    return next(s for s in obs.services if s["metadata"]["name"] == name)["spec"]["selector"]


def sizes(obs: Observed) -> dict[str, int]:
    return {d["metadata"]["labels"]["modeldeploy.dev/bundle"]: d["spec"]["replicas"] for d in obs.deployments}
