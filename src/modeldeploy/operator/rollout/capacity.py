"""Replace capacity, pure: how far the stable fleet may shrink for the canary without crossing minAvailable.

Replace moves slots from stable to canary: stable scaled down by k, k canary replicas brought up on
the freed GPUs (their pods stay Pending until the stable's pods have gone). k is bounded so that the
Ready replicas of both cohorts never drop below `spec.rollout.minAvailable`; each reconcile takes the
next batch once earlier canary replicas are Ready. The figures come from the observed Deployments,
with a cohort's Ready counted at most at its desired size, so a Deployment status that lags behind a
scale-down never lets two batches go at once.
"""

from __future__ import annotations

from dataclasses import dataclass

INSUFFICIENT = "InsufficientCapacity"


@dataclass(frozen=True)
class Have:
    """One cohort's Deployment as observed: desired (spec.replicas) and Ready replicas."""

    replicas: int
    ready: int

    @property
    def available(self) -> int:
        return min(self.ready, self.replicas)


@dataclass(frozen=True)
class Move:
    stable: int
    canary: int
    blocked: str | None = None  # the InsufficientCapacity message while it cannot move


def replace_step(
    total: int, target: int, stable: Have | None, canary: Have | None, min_available: int
) -> Move:
    """The next sizes of a Replace rollout towards `target` canary replicas out of `total` slots."""
    now = total if stable is None else min(total, stable.replicas)
    floor = total - min(target, total)
    if now <= floor:  # there already (or spec.replicas grew): the stable fills the remaining slots
        return Move(floor, total - floor)
    ready = (stable.available if stable else 0) + (canary.available if canary else 0)
    k = max(0, min(now - floor, ready - min_available))
    blocked = None
    if k == 0:
        settled = (stable is None or stable.ready >= stable.replicas) and (
            canary is None or canary.ready >= canary.replicas
        )
        if settled:  # nothing in flight will raise the Ready count: moving would cross the bound
            blocked = (
                f"capacity Replace: {ready} Ready, minAvailable {min_available}: "
                "taking one more stable replica down for the canary"
                f" ({total - now}/{min(target, total)} moved) would go below it"
            )
    return Move(now - k, total - (now - k), blocked)
