"""What every sub-planner of `plan` reads (`Inputs`, built once per reconcile from the object and
what exists) and the cohort figures the status planners share (`CohortSummary`). Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.status import CohortStatus, ModelDeploymentStatus
from modeldeploy.operator.rollout import prefetch, progression
from modeldeploy.operator.rollout.actions import Observed
from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, bundle_id
from modeldeploy.operator.rollout.capacity import Have
from modeldeploy.operator.rollout.machine import Policy

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
            b: Have(int((d.get("spec") or {}).get("replicas") or 0), ready_of(d))
            for b, d in by_bundle.items()
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


def ready_of(dep: dict[str, Any] | None) -> int:
    return int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)
