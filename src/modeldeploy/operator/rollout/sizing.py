"""What each cohort of a rollout runs, from the state machine's state and policy: replicas per bundle
(Surge and Replace), the canary's traffic weight, and the bundles behind the main Service. Pure, like
machine.py, whose state it reads; plan() turns these into Deployments, Services and routes."""

from __future__ import annotations

import math
from collections.abc import Mapping

from modeldeploy.operator.api.v1alpha1.common import resolve_count
from modeldeploy.operator.rollout.capacity import Have, replace_step
from modeldeploy.operator.rollout.machine import DEPLOYED, TAKING_TRAFFIC, Policy, RolloutState, Step


def canary_weight(s: RolloutState, p: Policy) -> int:
    """Percent of traffic the canary should get now (0 before conformance and while rolling back)."""
    if s.phase == "Canary":
        return p.steps[s.step or 0].weight
    if s.phase == "Promoting":
        return 100 if p.gateway else p.steps[-1].weight
    return 0


def cohort_replicas(
    s: RolloutState, p: Policy, now: float, have: Mapping[str, Have] | None = None
) -> dict[str, int]:
    """Desired replicas per live bundle. Surge: stable stays at full size through the whole rollout.
    Replace: stable gives the canary its slots, within minAvailable (`have`: the Deployments observed)."""
    out = {s.stable: p.replicas} if s.stable else {}
    if s.previous and s.previous_until is not None and now < s.previous_until and p.keep_previous_replicas:
        out[s.previous] = p.keep_previous_replicas
    have = have or {}
    if s.canary and s.phase in DEPLOYED:  # Prefetching: no canary Deployment yet
        target = _canary_target(s, p)
        out[s.canary] = target
        if s.capacity == "Replace" and s.stable:
            move = replace_step(p.replicas, target, have.get(s.stable), have.get(s.canary), p.min_available)
            out[s.stable], out[s.canary] = move.stable, move.canary
    elif s.canary and s.phase == "RollingBack" and s.restore == "StableFirst" and s.canary in have:
        out[s.canary] = have[s.canary].replicas  # kept serving until stable is back at full size
    return out


def capacity_wait(s: RolloutState, p: Policy, have: Mapping[str, Have]) -> str | None:
    """The InsufficientCapacity message while a Replace rollout cannot move without crossing minAvailable."""
    if not (s.canary and s.stable and s.capacity == "Replace" and s.phase in DEPLOYED):
        return None
    target = _canary_target(s, p)
    return replace_step(p.replicas, target, have.get(s.stable), have.get(s.canary), p.min_available).blocked


def _canary_target(s: RolloutState, p: Policy) -> int:
    """The canary's replicas in this phase: the step's size, or all of them while Promoting."""
    if s.phase == "Promoting":
        return p.replicas
    return canary_size(p, p.steps[s.step or 0], s.capacity == "Replace")


def canary_size(p: Policy, step: Step, replacing: bool = False) -> int:
    """The step's canary replicas: its `replicas` (count or percentage of spec.replicas) when given, else
    ~weight% of the pods next to a full stable (replica ratio), or weight% of replicas (Gateway API)."""
    if step.replicas is not None:
        return max(1, min(p.replicas, resolve_count(step.replicas, p.replicas)))
    weight = step.weight
    if weight >= 100:
        return p.replicas
    if p.gateway or replacing:  # weight% of the slots: Replace takes them out of stable
        return max(1, math.ceil(p.replicas * weight / 100))
    return max(1, min(p.replicas, math.ceil(p.replicas * weight / (100 - weight))))


def serving_bundles(s: RolloutState) -> list[str]:
    """Bundles behind the main Service: a canary joins only after the conformance gate."""
    if s.phase in TAKING_TRAFFIC and s.canary:
        return [b for b in (s.stable, s.canary) if b]
    return [s.stable] if s.stable else []
