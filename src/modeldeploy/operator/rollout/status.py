"""Status construction: conditions with stable lastTransitionTime, cohort figures. Pure.

A condition's lastTransitionTime changes only when its status flips, so an idempotent
reconcile writes nothing and GitOps tools see a steady object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modeldeploy.operator.api.v1alpha1.status import CohortStatus, Condition


def condition(
    ctype: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    previous: list[Condition],
    now: str,
) -> Condition:
    value = "True" if status else "False"
    old = next((c for c in previous if c.type == ctype), None)
    since = (
        old.last_transition_time
        if old is not None and old.status == value and old.last_transition_time
        else now
    )
    return Condition(
        type=ctype,
        status=value,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since,
    )


def cohort(
    bid: str,
    revision: str | None,
    deployment: dict[str, Any] | None,
    desired: int,
    loading: Sequence[float] = (),
) -> CohortStatus:
    """Figures for one cohort from its Deployment (None: not created yet).

    loadProgress counts a Ready replica as 1 and a loading one by the fraction its
    /health/ready reports, so a human sees weights loading rather than a flat 0/N.
    """
    ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    name = (deployment or {}).get("metadata", {}).get("name")
    partial = sum(min(1.0, max(0.0, p)) for p in loading[: max(0, desired - ready)])
    progress = 1.0 if desired == 0 else min(1.0, (min(ready, desired) + partial) / desired)
    return CohortStatus(
        bundle=bid,
        revision=revision,
        deployment=name,
        replicas=desired,
        ready_replicas=ready,
        load_progress=round(progress, 3),
    )


def replica_failure(deployment: dict[str, Any] | None) -> str | None:
    """The Deployment's ReplicaFailure message (e.g. pods rejected by admission), if any."""
    for c in ((deployment or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return c.get("message") or c.get("reason") or "ReplicaFailure"
    return None
