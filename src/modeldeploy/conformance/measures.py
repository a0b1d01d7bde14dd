"""What the serving metrics mean: one definition for canary analysis and `modeldeploy bench`.

The operator's analysis (histograms scraped from pods) and the benchmark client (raw
per-request samples) must never disagree on what "TTFT p95" or "error rate" is, so both take
the metric names, the outcome classes, the quantile rule and the histogram arithmetic from
here. Pure Python: the operator image imports it, so no numpy and no torch.

- TTFT: request receipt (server) or send (client) to the first generated token.
- Inter-token latency (ITL): every gap between two consecutive generated tokens (streamed
  chunks on the client side), pooled over requests.
- Error rate: (error + rejected) / (completed + error + rejected); cancelled is the client's
  choice and invalid the request's own fault, so neither counts.
- p95 of a histogram: PromQL `histogram_quantile` (linear inside the bucket); p95 of raw samples:
  linear interpolation between order statistics (numpy's default), which the histogram
  estimate approaches as buckets narrow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from modeldeploy.conformance.prom import Metrics

PREFIX = "modeldeploy_"
TTFT = "modeldeploy_time_to_first_token_seconds"
ITL = "modeldeploy_inter_token_latency_seconds"
E2E = "modeldeploy_request_latency_seconds"
QUEUE = "modeldeploy_queue_time_seconds"
PREFILL = "modeldeploy_prefill_time_seconds"
DECODE = "modeldeploy_decode_time_seconds"
CANCEL_RELEASE = "modeldeploy_cancel_release_seconds"
REQUESTS = "modeldeploy_requests_total"
RUNNING = "modeldeploy_requests_running"
WAITING = "modeldeploy_requests_waiting"
KV_USAGE = "modeldeploy_kv_cache_usage_ratio"
PREEMPTIONS = "modeldeploy_preemptions_total"

OUTCOMES = ("completed", "cancelled", "invalid", "rejected", "error")
FAILED = ("error", "rejected")  # outcomes a user sees as failure (cancelled is the client's choice)
INVALID = "invalid"  # the request's own fault: a failure only beyond the stable bundle's rate

# Verdict names shared by status.lastAnalysis and the bench compare report.
TTFT_P95 = "ttft_p95_seconds"
ITL_P95 = "inter_token_latency_p95_seconds"
ERROR_RATE = "error_rate"
GOODPUT = "goodput"


def outcome_of_status(status: int, cancelled: bool = False) -> str:
    """The server's outcome class for an HTTP status seen by a client (0: transport failure)."""
    if cancelled:
        return "cancelled"
    if status == 200:
        return "completed"
    if status in (429, 503):
        return "rejected"
    if 400 <= status < 500:
        return INVALID
    return "error"


def error_rate(outcomes: dict[str, float]) -> float | None:
    """(error + rejected) / (completed + error + rejected), None when nothing finished."""
    failed = sum(outcomes.get(o, 0.0) for o in FAILED)
    n = outcomes.get("completed", 0.0) + failed
    return failed / n if n else None


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between order statistics (numpy's default); None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets (le, count) sorted by le, the last one +Inf."""

    buckets: tuple[tuple[float, float], ...] = ()
    count: float = 0.0
    total: float = 0.0

    @classmethod
    def from_metrics(cls, m: Metrics, name: str, bundle: str | None = None) -> Histogram:
        """The histogram `name` summed over series (of one bundle when given)."""
        want = {} if bundle is None else {"bundle": bundle}
        rows: dict[float, float] = {}
        for s in m.samples:
            if s.name == name + "_bucket" and all(s.labels.get(k) == v for k, v in want.items()):
                le = float(s.labels["le"])
                rows[le] = rows.get(le, 0.0) + s.value
        return cls(
            tuple(sorted(rows.items())),
            m.get(name + "_count", **want) or 0.0,
            m.get(name + "_sum", **want) or 0.0,
        )

    def __add__(self, other: Histogram) -> Histogram:
        if not self.buckets:
            return other
        if not other.buckets:
            return self
        b = tuple((le, c + dict(other.buckets).get(le, 0.0)) for le, c in self.buckets)
        return Histogram(b, self.count + other.count, self.total + other.total)

    def since(self, earlier: Histogram) -> Histogram:
        """This scrape minus an earlier one; a restarted pod (counts went down) counts from zero."""
        if earlier.count > self.count or not earlier.buckets:
            return self
        prev = dict(earlier.buckets)
        return Histogram(
            tuple((le, c - prev.get(le, 0.0)) for le, c in self.buckets),
            self.count - earlier.count,
            self.total - earlier.total,
        )

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """PromQL histogram_quantile: linear within the bucket; +Inf bucket -> highest finite bound."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lo_le, lo_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return lo_le
                return lo_le + (le - lo_le) * ((rank - lo_c) / (c - lo_c) if c > lo_c else 1.0)
            lo_le, lo_c = le, c
        return lo_le

    def bucket_of(self, x: float) -> tuple[float, float]:
        """The bucket bounds (lower, upper) holding x: the resolution of any estimate near x."""
        lo = 0.0
        for le, _ in self.buckets:
            if x <= le:
                return lo, le
            lo = le
        return lo, math.inf

    def share_le(self, x: float) -> float | None:
        """Share of observations <= x, interpolating linearly inside the bucket holding x."""
        if self.count <= 0 or not self.buckets:
            return None
        lo_le, lo_c = 0.0, 0.0
        for le, c in self.buckets:
            if x <= le:
                if math.isinf(le):
                    return lo_c / self.count
                return (lo_c + (c - lo_c) * (x - lo_le) / (le - lo_le)) / self.count
            lo_le, lo_c = le, c
        return 1.0
