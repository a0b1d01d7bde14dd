"""The pod-scrape metrics source (the default): each cohort pod's /metrics, with per-pod baselines.

No Prometheus needed: the operator reads the runtime's `modeldeploy_*` series of the cohort's
Ready pods itself, and `Baselines` turns cumulative counters into what the cohort served since
the analysis window opened. Bounded: pods per scrape, bytes per page, seconds per request; a
pod that cannot be read is reported, never summed. Reached from the operator, so httpx and the
conformance parser only, never the runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from modeldeploy.operator.analysis.pods import pod_url, read_bounded
from modeldeploy.operator.analysis.verdicts import CohortSample
from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT

if TYPE_CHECKING:
    from modeldeploy.operator.analysis.window import AnalysisWindow

MAX_PODS = 32  # pods scraped per cohort and interval (the rest reported as skipped)
MAX_PARALLEL = 8  # concurrent scrapes: worst case ceil(32/8) * timeout per cohort
MAX_BYTES = 4 * 1024 * 1024  # a /metrics page larger than this is an error, not an OOM


@dataclass(frozen=True)
class CohortScrape:
    """One scrape of a cohort: per-pod cumulative samples, and what could not be read, with why."""

    bundle: str
    pods: dict[str, CohortSample] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()  # beyond MAX_PODS

    @property
    def sample(self) -> CohortSample:
        """Cumulative totals over the pods reached (for deltas use `Baselines.delta`)."""
        total = CohortSample()
        for s in self.pods.values():
            total = total + s
        return total

    def problems(self) -> str:
        """'' when every pod was read, else a line for an Event or log. A cohort with no Ready pod to
        read says so: its analysis is Inconclusive and the step holds, and status must say why (a
        canary whose node was lost, bench/chaos.py node-lost, held for minutes with an empty message)."""
        if not self.pods and not self.errors and not self.skipped:
            return f"bundle {self.bundle}: no Ready pods to scrape"
        parts = [f"{ip}: {why}" for ip, why in sorted(self.errors.items())]
        if self.skipped:
            parts.append(f"{len(self.skipped)} pod(s) over the {MAX_PODS}-pod scrape bound not read")
        return f"bundle {self.bundle}: " + "; ".join(parts) if parts else ""


def _fetch(http: httpx.Client, url: str) -> str:
    with http.stream("GET", url) as r:
        if r.status_code != 200:
            raise ValueError(f"HTTP {r.status_code}")
        return read_bounded(r, MAX_BYTES, "/metrics").decode("utf-8", "replace")


def _one(http: httpx.Client, ip: str, bundle: str, port: int) -> tuple[str, CohortSample | None, str]:
    try:
        text = _fetch(http, pod_url(ip, port) + "/metrics")
        sample = CohortSample.from_text(text, bundle)
    except httpx.HTTPError as e:
        return ip, None, f"unreachable ({type(e).__name__})"
    except ValueError as e:  # bad status, too large, unparsable exposition
        return ip, None, f"bad /metrics: {e}"
    if not sample.ttft.buckets:  # the server creates its series at start: absent = wrong bundle
        return ip, None, f"no modeldeploy_* series labelled bundle={bundle}"
    return ip, sample, ""


def scrape_cohort(
    pod_ips: Sequence[str], bundle: str, port: int = PORT, timeout: float = 1.0, max_pods: int = MAX_PODS
) -> CohortScrape:
    """Scrape each pod's /metrics for `bundle` series, in parallel; a pod that fails is reported, not summed.

    `pod_ips`: pod IPs (the operator's case) or "host:port" targets (tests, several pods on one host).

    Bounded: at most `max_pods` pods, `timeout` seconds per connect/read, MAX_BYTES per page.
    """
    ips, skipped = list(dict.fromkeys(pod_ips))[:max_pods], tuple(list(dict.fromkeys(pod_ips))[max_pods:])
    pods: dict[str, CohortSample] = {}
    errors: dict[str, str] = {}
    if ips:
        with (
            httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=MAX_PARALLEL)) as http,
            ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(ips))) as pool,
        ):
            for ip, sample, err in pool.map(lambda ip: _one(http, ip, bundle, port), ips):
                if sample is None:
                    errors[ip] = err
                else:
                    pods[ip] = sample
    return CohortScrape(bundle, pods, errors, skipped)


class Baselines:
    """Per-pod cumulative samples at the start of an analysis window, keyed (md uid, bundle, pod).

    `delta()` is what the cohort served since the window (`mark`, e.g. the step and its start)
    began. A new mark, or a key never seen (operator restarted: memory is empty), starts a
    window at this scrape, so its delta is empty and the next interval counts. A pod first seen
    mid-window started after it, so it counts from zero; a restarted pod is handled by
    `CohortSample.since` (counters went down: count from zero).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: dict[tuple[str, str], Any] = {}
        self._pods: dict[tuple[str, str, str], CohortSample] = {}

    def delta(self, md_uid: str, bundle: str, mark: Any, scrape: CohortScrape) -> CohortSample:
        key = (md_uid, bundle)
        with self._lock:
            if self._marks.get(key, _NONE) != mark:
                self._drop(key)
                self._marks[key] = mark
                for ip, s in scrape.pods.items():
                    self._pods[(md_uid, bundle, ip)] = s
                return CohortSample()
            total = CohortSample()
            for ip, s in scrape.pods.items():
                base = self._pods.setdefault((md_uid, bundle, ip), CohortSample())
                total = total + s.since(base)
            return total

    def forget(self, md_uid: str, bundle: str | None = None) -> None:
        """Drop a bundle's windows (rolled back, promoted) or all of an MD's (deleted)."""
        with self._lock:
            for key in [k for k in self._marks if k[0] == md_uid and bundle in (None, k[1])]:
                self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        self._marks.pop(key, None)
        for k in [k for k in self._pods if k[:2] == key]:
            del self._pods[k]

    def __len__(self) -> int:
        return len(self._pods)

    def holds(self, md_uid: str) -> bool:
        """Whether any window of this ModelDeployment is kept."""
        with self._lock:
            return any(k[0] == md_uid for k in self._marks) or any(k[0] == md_uid for k in self._pods)


_NONE = object()


class PodScrape:
    """`MetricsSource` over the cohorts' pods: scrape both, take each one's delta since the window opened.

    The first read of a window (new `AnalysisWindow.mark`) has no samples yet: its verdict is
    Inconclusive, which holds the step until the next interval.
    """

    def __init__(self, baselines: Baselines, port: int = PORT, timeout: float = 1.0) -> None:
        self.baselines, self.port, self.timeout = baselines, port, timeout

    def read(self, cohorts: AnalysisWindow) -> tuple[CohortSample, CohortSample, str]:
        deltas, problems = [], []
        for bundle, ips in ((cohorts.stable, cohorts.stable_pods), (cohorts.canary, cohorts.canary_pods)):
            sc = scrape_cohort(ips, bundle, self.port, self.timeout)
            deltas.append(self.baselines.delta(cohorts.md_uid, bundle, cohorts.mark, sc))
            if sc.problems():
                problems.append(sc.problems())
        return deltas[0], deltas[1], "; ".join(problems)
