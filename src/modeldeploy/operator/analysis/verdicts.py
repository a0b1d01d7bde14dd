"""Canary analysis: compare the canary cohort with the stable one on what users feel.

Pure functions over Prometheus samples scraped from the cohorts' pods (no Prometheus
server needed): histogram deltas between two scrapes give this interval's TTFT and
inter-token latency distributions, counters give outcomes. `analyze()` turns two cohort
deltas and `spec.rollout.analysis` into an `AnalysisResult` with one verdict per metric.

Goodput is estimated from the histograms: the share of requests that completed, times
the share of first tokens within the TTFT SLO, times the share of token gaps within the
inter-token SLO (independence assumed; the server exports no per-request joint SLO flag).
Error rate counts errors and capacity refusals; requests refused as the client's own fault
("invalid") count only where the canary's share of them exceeds the stable bundle's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Metric names, outcome classes and histogram arithmetic are shared with `modeldeploy bench`
# (conformance/measures.py), so the canary analysis and the offline compare mean the same thing.
from modeldeploy.conformance import measures
from modeldeploy.conformance.measures import FAILED, INVALID, ITL, REQUESTS, TTFT, Histogram
from modeldeploy.conformance.prom import Metrics
from modeldeploy.operator.api.v1alpha1.analysis import Analysis
from modeldeploy.operator.api.v1alpha1.status import AnalysisResult, MetricVerdict


@dataclass(frozen=True)
class CohortSample:
    """What one cohort (or one pod) served, cumulative or over an interval."""

    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    outcomes: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_text(cls, text: str, bundle: str) -> CohortSample:
        m = Metrics(text)
        outcomes = {
            o: m.get(REQUESTS, bundle=bundle, outcome=o) or 0.0 for o in m.label_values(REQUESTS, "outcome")
        }
        return cls(Histogram.from_metrics(m, TTFT, bundle), Histogram.from_metrics(m, ITL, bundle), outcomes)

    def __add__(self, other: CohortSample) -> CohortSample:
        keys = set(self.outcomes) | set(other.outcomes)
        return CohortSample(
            self.ttft + other.ttft,
            self.itl + other.itl,
            {k: self.outcomes.get(k, 0.0) + other.outcomes.get(k, 0.0) for k in keys},
        )

    def since(self, earlier: CohortSample) -> CohortSample:
        reset = any(self.outcomes.get(k, 0.0) < v for k, v in earlier.outcomes.items())
        if reset:
            return self
        return CohortSample(
            self.ttft.since(earlier.ttft),
            self.itl.since(earlier.itl),
            {k: v - earlier.outcomes.get(k, 0.0) for k, v in self.outcomes.items()},
        )

    @property
    def finished(self) -> float:
        return self.outcomes.get("completed", 0.0) + sum(self.outcomes.get(o, 0.0) for o in FAILED)

    def error_rate(self) -> float | None:
        return measures.error_rate(self.outcomes)

    def invalid_rate(self) -> float | None:
        n = self.finished + self.outcomes.get(INVALID, 0.0)
        return self.outcomes.get(INVALID, 0.0) / n if n else None

    def goodput(self, ttft_slo: float, itl_slo: float) -> float | None:
        n = self.finished
        if not n:
            return None
        ok = self.outcomes.get("completed", 0.0) / n
        ttft_ok = self.ttft.share_le(ttft_slo)
        itl_ok = self.itl.share_le(itl_slo)
        return ok * (1.0 if ttft_ok is None else ttft_ok) * (1.0 if itl_ok is None else itl_ok)


def _ratio_check(
    metric: str,
    stable: float | None,
    canary: float | None,
    ratio: float,
    samples: int,
    enough: bool,
    higher_is_worse: bool = True,
) -> MetricVerdict:
    if not enough or stable is None or canary is None:
        return MetricVerdict(
            metric=metric, stable=stable, canary=canary, samples=samples, verdict="Inconclusive"
        )
    threshold = ratio * stable
    bad = canary > threshold if higher_is_worse else canary < threshold
    return MetricVerdict(
        metric=metric,
        stable=stable,
        canary=canary,
        threshold=threshold,
        samples=samples,
        verdict="Fail" if bad else "Pass",
    )


def analyze(
    stable: CohortSample,
    canary: CohortSample,
    cfg: Analysis,
    step: int | None = None,
    time: str | None = None,
) -> AnalysisResult:
    """Per-metric verdicts and the overall one: any Fail fails; else any Inconclusive holds."""
    samples = int(min(stable.finished, canary.finished))
    enough = samples >= cfg.min_samples
    err = canary.error_rate()
    # Bad requests are split between the cohorts like the rest, so a canary answering "invalid"
    # more often than stable refuses valid requests: that excess counts as canary errors.
    inv_c, inv_s = canary.invalid_rate(), stable.invalid_rate()
    if err is not None and inv_c is not None:
        err += max(0.0, inv_c - (inv_s or 0.0))
    verdicts = [
        _ratio_check(
            measures.TTFT_P95,
            stable.ttft.quantile(0.95),
            canary.ttft.quantile(0.95),
            cfg.max_ttft_p95_ratio,
            samples,
            enough,
        ),
        _ratio_check(
            measures.ITL_P95,
            stable.itl.quantile(0.95),
            canary.itl.quantile(0.95),
            cfg.max_inter_token_p95_ratio,
            samples,
            enough,
        ),
        MetricVerdict(
            metric=measures.ERROR_RATE,
            stable=stable.error_rate(),
            canary=err,
            threshold=cfg.max_error_rate,
            samples=samples,
            verdict="Inconclusive"
            if not enough or err is None
            else ("Fail" if err > cfg.max_error_rate else "Pass"),
        ),
        _ratio_check(
            measures.GOODPUT,
            stable.goodput(cfg.slo.ttft_seconds, cfg.slo.inter_token_seconds),
            canary.goodput(cfg.slo.ttft_seconds, cfg.slo.inter_token_seconds),
            cfg.min_goodput_ratio,
            samples,
            enough,
            higher_is_worse=False,
        ),
    ]
    kinds = {v.verdict for v in verdicts}
    overall = "Fail" if "Fail" in kinds else "Inconclusive" if "Inconclusive" in kinds else "Pass"
    return AnalysisResult(time=time, step=step, verdict=overall, metrics=verdicts)


def fmt(x: float | None) -> str:
    """A figure in Events and status messages: 4 significant digits, n/a when unknown."""
    return "n/a" if x is None else f"{x:.4g}"


def describe(r: AnalysisResult) -> str:
    """One line for the Event each analysis posts: the verdict and every metric's figures."""
    step = f"step {r.step + 1}: " if r.step is not None else ""
    figures = "; ".join(
        f"{m.metric} {m.verdict} canary={fmt(m.canary)} stable={fmt(m.stable)} threshold={fmt(m.threshold)}"
        f" samples={m.samples}"
        for m in r.metrics
    )
    why = f" ({r.message})" if r.message else ""
    return f"{step}{r.verdict}{why}: {figures}" if figures else f"{step}{r.verdict}{why}"
