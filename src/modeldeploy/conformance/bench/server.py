"""What the server says about itself: pins, effective config, and its own phase figures.

`probe()` reads /v1/models and, on a modeldeploy runtime, /v1/bundle (pins + effective config)
and whether /metrics exposes `modeldeploy_*`. `Watch` scrapes /metrics before and after a
rate and polls it in between (on a thread, every `interval_s`) for the peaks of the running
and waiting gauges and of KV usage; peaks are sampled, so a spike shorter than the interval
can be missed (the record states the interval and the sample count).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from modeldeploy.conformance import measures as M
from modeldeploy.conformance.prom import Metrics

PHASES = {
    "ttft": M.TTFT,
    "queue": M.QUEUE,
    "prefill": M.PREFILL,
    "decode": M.DECODE,
    "itl": M.ITL,
    "e2e": M.E2E,
    "cancel_release": M.CANCEL_RELEASE,
}


@dataclass
class Target:
    url: str
    model: str
    bundle: dict[str, Any] | None = None
    has_metrics: bool = False
    bundle_id: str | None = None

    @property
    def is_modeldeploy(self) -> bool:
        return self.bundle is not None


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def probe(url: str, api_key: str | None = None, model: str | None = None, timeout_s: float = 10.0) -> Target:
    """What the server serves; raises ValueError naming the problem when it serves nothing usable."""
    with httpx.Client(base_url=base_url(url), headers=_headers(api_key), timeout=timeout_s) as c:
        r = c.get("/v1/models")
        if r.status_code != 200:
            raise ValueError(
                f"{url}: GET /v1/models answered {r.status_code}; is it an OpenAI-compatible server?"
            )
        # a card without a string id cannot be asked for by name, so it is no candidate
        names: list[str] = [
            m["id"] for m in r.json().get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)
        ]
        if model is None:
            if not names:
                raise ValueError(f"{url}: /v1/models lists no model; pass --model")
            model = names[0]
        bundle = None
        try:
            b = c.get("/v1/bundle")
            bundle = b.json() if b.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            bundle = None
        has_metrics = False
        try:
            m = c.get("/metrics")
            has_metrics = m.status_code == 200 and M.PREFIX in m.text
        except httpx.HTTPError:
            has_metrics = False
    return Target(url, model, bundle, has_metrics, (bundle or {}).get("bundle_id"))


@dataclass
class ServerFigures:
    """The server's own account of one rate: histogram deltas, outcome deltas, sampled peaks."""

    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    outcomes: dict[str, float] = field(default_factory=dict)
    preemptions: float | None = None
    running_peak: float | None = None
    waiting_peak: float | None = None
    kv_usage_peak: float | None = None
    samples: int = 0
    interval_s: float = 0.0
    ttft_split: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class Watch:
    """Scrape before, poll for peaks during, scrape after: one rate on one server."""

    def __init__(self, target: Target, api_key: str | None = None, interval_s: float = 0.5):
        self.target, self.interval_s = target, interval_s
        self.client = httpx.Client(base_url=base_url(target.url), headers=_headers(api_key), timeout=10.0)
        self.before: Metrics | None = None
        self.peaks = {"running": 0.0, "waiting": 0.0, "kv": 0.0}
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape(self) -> Metrics | None:
        try:
            r = self.client.get("/metrics")
            return Metrics(r.text) if r.status_code == 200 else None
        except Exception:  # noqa: BLE001 - a failed scrape is a missing sample, not a failed benchmark
            return None

    def start(self) -> None:
        if not self.target.has_metrics:
            return
        self.before = self.scrape()
        self._thread = threading.Thread(target=self._poll, name="bench-scrape", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            m = self.scrape()
            if m is not None:
                self._peak(m)

    def _peak(self, m: Metrics) -> None:
        b = self._labels()
        self.samples += 1
        for key, name in (("running", M.RUNNING), ("waiting", M.WAITING), ("kv", M.KV_USAGE)):
            v = m.get(name, **b)
            if v is not None:
                self.peaks[key] = max(self.peaks[key], v)

    def _settled(self, timeout_s: float = 10.0) -> Metrics | None:
        """The scrape once running and waiting are back to 0 (a stream's cleanup, and so its last
        observations, run just after the client read [DONE]); bounded, the last scrape otherwise."""
        deadline = time.monotonic() + timeout_s
        m = self.scrape()
        while m is not None and time.monotonic() < deadline:
            if not (m.get(M.RUNNING, **self._labels()) or 0) and not (
                m.get(M.WAITING, **self._labels()) or 0
            ):
                break
            time.sleep(0.05)
            m = self.scrape()
        return m

    def _labels(self) -> dict[str, str]:
        return {"bundle": self.target.bundle_id} if self.target.bundle_id is not None else {}

    def stop(self) -> ServerFigures | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 15)
        after = self._settled() if self.target.has_metrics else None
        self.client.close()
        if self.before is None or after is None:
            return None
        self._peak(after)
        return figures(self.before, after, self._labels(), self.peaks, self.samples, self.interval_s)


def _summary(h: M.Histogram) -> dict[str, Any]:
    return {
        "count": h.count,
        "sum": h.total,
        "mean": h.mean,
        "p50": h.quantile(0.5),
        "p95": h.quantile(0.95),
        "p99": h.quantile(0.99),
    }


def figures(
    before: Metrics,
    after: Metrics,
    labels: dict[str, str],
    peaks: dict[str, float],
    samples: int,
    interval_s: float,
) -> ServerFigures:
    bundle = labels.get("bundle")
    hist = {
        k: M.Histogram.from_metrics(after, n, bundle).since(M.Histogram.from_metrics(before, n, bundle))
        for k, n in PHASES.items()
    }
    outcomes = {
        o: (after.get(M.REQUESTS, outcome=o, **labels) or 0.0)
        - (before.get(M.REQUESTS, outcome=o, **labels) or 0.0)
        for o in M.OUTCOMES
    }
    pre_a, pre_b = after.get(M.PREEMPTIONS, **labels), before.get(M.PREEMPTIONS, **labels)
    return ServerFigures(
        phases={k: _summary(h) for k, h in hist.items() if h.buckets},
        outcomes=outcomes,
        preemptions=None if pre_a is None or pre_b is None else pre_a - pre_b,
        running_peak=peaks["running"],
        waiting_peak=peaks["waiting"],
        kv_usage_peak=peaks["kv"],
        samples=samples,
        interval_s=interval_s,
        ttft_split=ttft_split(hist["ttft"], hist["queue"], hist["prefill"]),
    )


def ttft_split(ttft: M.Histogram, queue: M.Histogram, prefill: M.Histogram) -> dict[str, Any]:
    """TTFT against queue + prefill from the server's histograms.

    Counts and sums must agree exactly (the server observes the three together, queue + prefill =
    TTFT per request), so mean TTFT = mean queue + mean prefill. Quantiles of a sum are not sums of
    quantiles, so the p50s are only reported against the bucket widths they are estimated within.
    """
    if not ttft.buckets or not queue.buckets or not prefill.buckets or ttft.count == 0:
        return {}
    t50, q50, p50 = ttft.quantile(0.5), queue.quantile(0.5), prefill.quantile(0.5)
    if t50 is None or q50 is None or p50 is None:  # a histogram with buckets but no observation
        return {}
    width = sum(hi - lo for lo, hi in (ttft.bucket_of(t50), queue.bucket_of(q50), prefill.bucket_of(p50)))
    return {
        "count_ttft": ttft.count,
        "count_queue": queue.count,
        "count_prefill": prefill.count,
        "sum_ttft": ttft.total,
        "sum_queue_plus_prefill": queue.total + prefill.total,
        "p50_ttft": t50,
        "p50_queue_plus_p50_prefill": q50 + p50,
        "bucket_error": width,
        "p50_within_bucket_error": abs(t50 - q50 - p50) <= width,
        # The exact identity: every request observed in all three, and the sums add up.
        "consistent": ttft.count == queue.count == prefill.count
        and abs(ttft.total - queue.total - prefill.total) <= 1e-6 * max(1.0, ttft.total),
    }
