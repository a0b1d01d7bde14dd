"""Open-loop arrival times: when each request is sent, whatever the server is doing.

Poisson (exponential gaps, the default), constant (evenly spaced) and gamma (shape =
burstiness: below 1 burstier than Poisson, 1 is Poisson, above 1 more regular; the mean
gap stays 1/rate). A schedule is bounded by a duration, a count, or both (whichever ends
first), never open-ended.
"""

from __future__ import annotations

import random

KINDS = ("poisson", "constant", "gamma")
MAX_REQUESTS = 100_000  # a hard cap on one rate's schedule, whatever the flags say


def gap(kind: str, rate: float, rng: random.Random, burstiness: float = 1.0) -> float:
    if kind == "poisson":
        return rng.expovariate(rate)
    if kind == "constant":
        return 1.0 / rate
    if kind == "gamma":
        return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    raise ValueError(f"--arrival: {kind!r} is not one of {', '.join(KINDS)}")


def schedule(
    kind: str,
    rate: float,
    rng: random.Random,
    duration_s: float | None = None,
    count: int | None = None,
    burstiness: float = 1.0,
) -> list[float]:
    """Send offsets in seconds from the start of the rate: the first at 0."""
    if rate <= 0:
        raise ValueError(f"--rates: every rate must be > 0, got {rate}")
    if duration_s is None and count is None:
        raise ValueError("a rate needs --duration or --requests (the benchmark never runs unbounded)")
    if burstiness <= 0:
        raise ValueError(f"--burstiness: must be > 0, got {burstiness}")
    limit = min(count if count is not None else MAX_REQUESTS, MAX_REQUESTS)
    t, out = 0.0, []
    while len(out) < limit and (duration_s is None or t < duration_s):
        out.append(t)
        # constant: i / rate exactly (summing 1/rate drifts, and a 1 s window would get 11 sends at 10/s)
        t = len(out) / rate if kind == "constant" else t + gap(kind, rate, rng, burstiness)
    return out
