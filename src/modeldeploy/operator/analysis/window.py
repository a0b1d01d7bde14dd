"""The analysis window: the two cohorts one analysis interval compares, and the span it covers.

Its own module because both metrics sources read it (`scrape.PodScrape`, `promql.Prometheus`)
and `sources` imports both of them to choose one: with the window in `sources`, the sources and
their chooser would import each other.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class AnalysisWindow:
    """The two cohorts one analysis interval compares, and the window it covers."""

    md_uid: str
    namespace: str
    stable: str  # bundle ids
    canary: str
    stable_pods: tuple[str, ...] = ()  # Ready pod IPs (or "host:port" targets)
    canary_pods: tuple[str, ...] = ()
    mark: Hashable = None  # the window's key (canary, step, step start): a new mark opens a new window
    since: float | None = None  # when the step began, epoch seconds (sizes the Prometheus window)
