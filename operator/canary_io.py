"""The canary's I/O for the reconcile loop: scrape cohort pods, keep per-pod baselines, run the gate.

`canary_analysis` picks the metrics source: the pods' /metrics (default) or, when
`analysis.prometheus` is set, a Prometheus HTTP API (`promql.py`); both feed `analyze()`.

Thin on purpose: the figures go to the pure `analysis.analyze()` and the decisions to the
pure `rollout.advance()`. Everything here is bounded (pods per scrape, bytes per page,
seconds per request, one conformance run per (md uid, bundle)) and never blocks the
reconcile thread beyond one interval's bounded scrapes. Reached from the operator, so: httpx and
the conformance client only, never the runtime.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from modeldeploy.conformance.suite import ConformanceConfig, Report, run_conformance
from modeldeploy.operator.analysis import CohortSample, analyze
from modeldeploy.operator.api import Analysis, AnalysisResult
from modeldeploy.operator.children import PORT
from modeldeploy.operator.promql import prometheus_analysis

log = logging.getLogger(__name__)

MAX_PODS = 32  # pods scraped per cohort and interval (the rest reported as skipped)
MAX_PARALLEL = 8  # concurrent scrapes: worst case ceil(32/8) * timeout per cohort
MAX_BYTES = 4 * 1024 * 1024  # a /metrics page larger than this is an error, not an OOM


def pod_url(target: str, port: int = PORT) -> str:
    """Base URL of a pod: a bare IPv4/IPv6 address gets `port`; "host:port" / "[v6]:port" keep theirs."""
    if target.startswith("["):
        host, _, rest = target.partition("]")
        return f"http://{host}]:{rest.removeprefix(':') or port}"
    if target.count(":") > 1:
        return f"http://[{target}]:{port}"
    return f"http://{target}" if ":" in target else f"http://{target}:{port}"


def ready_pod_ips(pods: Sequence[dict[str, Any]]) -> list[str]:
    """IPs of Ready pods with an address, by pod name (so the same pods are scraped each time)."""
    out = []
    for p in sorted(pods, key=lambda p: p.get("metadata", {}).get("name", "")):
        st = p.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []
        )
        if ready and st.get("podIP"):
            out.append(st["podIP"])
    return out


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
        """'' when every pod was read, else a line for an Event or log."""
        parts = [f"{ip}: {why}" for ip, why in sorted(self.errors.items())]
        if self.skipped:
            parts.append(f"{len(self.skipped)} pod(s) over the {MAX_PODS}-pod scrape bound not read")
        return f"bundle {self.bundle}: " + "; ".join(parts) if parts else ""


def _fetch(http: httpx.Client, url: str) -> str:
    with http.stream("GET", url) as r:
        if r.status_code != 200:
            raise ValueError(f"HTTP {r.status_code}")
        chunks, size = [], 0
        for chunk in r.iter_bytes():
            size += len(chunk)
            if size > MAX_BYTES:
                raise ValueError(f"/metrics larger than {MAX_BYTES} bytes")
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


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


_NONE = object()


def cohort_analysis(
    baselines: Baselines,
    md_uid: str,
    mark: Any,
    stable: tuple[str, Sequence[str]],
    canary: tuple[str, Sequence[str]],
    cfg: Analysis,
    step: int | None = None,
    time: str | None = None,
    port: int = PORT,
    timeout: float = 1.0,
) -> tuple[AnalysisResult, str]:
    """One analysis interval: scrape both cohorts ((bundle, pod IPs) each), take the window deltas, analyze.

    Returns the result and a line naming unreadable pods ('' if none). The first call of a
    window (new `mark`) has no samples yet: its verdict is Inconclusive, which holds the step.
    """
    deltas, problems = [], []
    for bundle, ips in (stable, canary):
        sc = scrape_cohort(ips, bundle, port, timeout)
        deltas.append(baselines.delta(md_uid, bundle, mark, sc))
        if sc.problems():
            problems.append(sc.problems())
    return analyze(deltas[0], deltas[1], cfg, step=step, time=time), "; ".join(problems)


def canary_analysis(
    baselines: Baselines,
    md_uid: str,
    namespace: str,
    mark: Any,
    since: float | None,
    stable: tuple[str, Sequence[str]],
    canary: tuple[str, Sequence[str]],
    cfg: Analysis,
    step: int | None = None,
    time: str | None = None,
) -> tuple[AnalysisResult, str]:
    """One analysis interval from the source the spec names: Prometheus if `cfg.prometheus`, else pod scrapes.

    `since` (when the step began, epoch seconds) sizes the Prometheus window; `mark` keys the
    scrape path's baselines. Returns the result and '' or a line saying what could not be read,
    which is also logged when the Prometheus source made the interval Inconclusive.
    """
    if cfg.prometheus is None:
        return cohort_analysis(baselines, md_uid, mark, stable, canary, cfg, step=step, time=time)
    result, problem = prometheus_analysis(cfg, namespace, stable[0], canary[0], since, step=step, time=time)
    if problem:
        log.warning("canary analysis Inconclusive for %s/%s: %s", namespace, canary[0], problem)
    return result, problem


def summarize(report: Report, limit: int = 1000) -> tuple[bool, str]:
    """(passed, summary) for status and Events: the failed required checks by name, with the first reason."""
    failed = [c for c in report.checks if not c.ok]
    if report.passed:
        text = f"conformance passed: {len(report.checks)} checks in {report.seconds:.1f}s"
    elif not failed:
        text = "conformance failed: no checks ran"
    else:
        names = ", ".join(c.name for c in failed)
        first = "; ".join(f"{c.name}: {c.failures[0]}" for c in failed if c.failures)
        text = f"conformance failed checks: {names} ({first})"
    return report.passed, text if len(text) <= limit else text[: limit - 1] + "…"


Key = tuple[str, str]  # (md uid, bundle id)
Runner = Callable[[ConformanceConfig], Report]


@dataclass
class _Run:
    url: str
    started: float
    thread: threading.Thread
    result: tuple[bool, str] | None = None


class ConformanceRunner:
    """Runs the conformance suite on a canary pod in a daemon thread; the reconcile loop only polls.

    At most one run per key at a time and `max_parallel` runs overall; a run still going after
    `deadline_s` reads as failed (the thread cannot be killed, so its key stays busy until it
    ends and its late result is dropped). Per-request time is bounded by `request_timeout_s`.
    """

    def __init__(
        self,
        deadline_s: float = 300.0,
        request_timeout_s: float = 30.0,
        max_parallel: int = 4,
        run: Runner = run_conformance,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline_s, self.request_timeout_s = deadline_s, request_timeout_s
        self._run, self._clock = run, clock
        self._slots = threading.BoundedSemaphore(max_parallel)
        self._lock = threading.Lock()
        self._runs: dict[Key, _Run] = {}

    def start(
        self,
        key: Key,
        url: str,
        api_key: str | None = None,
        model: str | None = None,
        structured_output: bool = False,
    ) -> bool:
        """Start a run unless one exists for this key (running or finished); True if started."""
        with self._lock:
            if key in self._runs:
                return False
            cfg = ConformanceConfig(
                url=url,
                api_key=api_key,
                model=model,
                timeout_s=self.request_timeout_s,
                structured_output=structured_output,
            )
            t = threading.Thread(
                target=self._work, args=(key, cfg), name=f"conformance-{key[1]}", daemon=True
            )
            self._runs[key] = _Run(url, self._clock(), t)
        t.start()
        return True

    def ensure(self, key: Key, url: str, **kw: Any) -> tuple[bool, str] | None:
        """Start if needed, then `result()`: the one call the Verifying phase makes per reconcile."""
        self.start(key, url, **kw)
        return self.result(key)

    def result(self, key: Key) -> tuple[bool, str] | None:
        """(passed, summary) once finished or past the deadline; None while running or never started."""
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                return None
            if run.result is None and self._clock() - run.started > self.deadline_s:
                run.result = (
                    False,
                    f"conformance against {run.url} did not finish within {self.deadline_s:.0f}s",
                )
            return run.result

    def running(self, key: Key) -> bool:
        with self._lock:
            run = self._runs.get(key)
            return run is not None and run.thread.is_alive()

    def forget(self, key: Key) -> None:
        """Drop a finished result (new canary, rollback); a thread still running keeps the key busy."""
        with self._lock:
            run = self._runs.get(key)
            if run is not None and not run.thread.is_alive():
                del self._runs[key]

    def forget_md(self, md_uid: str) -> None:
        """Drop every finished result of a deleted ModelDeployment."""
        for key in [k for k in list(self._runs) if k[0] == md_uid]:
            self.forget(key)

    def wait(self, key: Key, timeout: float) -> tuple[bool, str] | None:
        """Block up to `timeout` for a result: for tests and the CLI, never for the reconcile loop."""
        with self._lock:
            run = self._runs.get(key)
        if run is not None:
            run.thread.join(timeout)
        return self.result(key)

    def _work(self, key: Key, cfg: ConformanceConfig) -> None:
        with self._slots:
            try:
                outcome = summarize(self._run(cfg))
            except (httpx.HTTPError, ValueError, OSError) as e:
                outcome = (False, f"conformance could not run against {cfg.url}: {type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - a bug in the suite must read as a failed gate, not hang Verifying
                outcome = (False, f"conformance crashed against {cfg.url}: {type(e).__name__}: {e}")
        with self._lock:
            run = self._runs.get(key)
            if run is not None and run.result is None:
                run.result = outcome
