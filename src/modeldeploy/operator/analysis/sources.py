"""Where canary analysis gets its figures: one `MetricsSource` protocol, two implementations.

As Argo Rollouts' metric providers: the analysis does not care where samples come from.
`PodScrape` (scrape.py, the default) reads each cohort pod's /metrics and keeps per-pod
baselines; `Prometheus` (promql.py, when `spec.rollout.analysis.prometheus` is set) queries
a Prometheus HTTP API. Both return this interval's stable and canary `CohortSample`s, which
the pure `analysis.analyze()` judges. A source never raises for unreadable figures: it
returns what it could read and a line saying what it could not, and the interval is then
Inconclusive (the step holds).
"""

from __future__ import annotations

from typing import Protocol

from modeldeploy.operator.analysis.promql import Prometheus
from modeldeploy.operator.analysis.scrape import Baselines, PodScrape
from modeldeploy.operator.analysis.verdicts import CohortSample, analyze
from modeldeploy.operator.analysis.window import AnalysisWindow
from modeldeploy.operator.api.v1alpha1.analysis import Analysis
from modeldeploy.operator.api.v1alpha1.status import AnalysisResult


class MetricsSource(Protocol):
    def read(self, cohorts: AnalysisWindow) -> tuple[CohortSample, CohortSample, str]:
        """This window's (stable, canary) samples, and '' or a line naming what could not be read."""
        ...


def source_for(cfg: Analysis, baselines: Baselines) -> MetricsSource:
    """The source `spec.rollout.analysis` names: Prometheus when `prometheus` is set, else the pods."""
    if cfg.prometheus is not None:
        return Prometheus(cfg.prometheus, cfg.interval_seconds)
    return PodScrape(baselines)


def analyze_interval(
    source: MetricsSource,
    cohorts: AnalysisWindow,
    cfg: Analysis,
    step: int | None = None,
    time: str | None = None,
) -> tuple[AnalysisResult, str]:
    """One analysis interval: read both cohorts from `source`, judge them; (result, '' or problems)."""
    stable, canary, problems = source.read(cohorts)
    return analyze(stable, canary, cfg, step=step, time=time), problems
