"""Canary analysis from a Prometheus HTTP API (`spec.rollout.analysis.prometheus`).

The other source of the same figures the operator otherwise scrapes from the pods: per cohort,
the TTFT and inter-token histogram bucket increases and the finished requests by outcome over
the analysis window, turned into the same `CohortSample`s and judged by the same `analyze()`.

Templates are rendered by plain substitution of `{bundle}`, `{namespace}`, `{selector}` (the
rendered selector) and `{window}` (a PromQL duration); PromQL's own braces are left alone. The
defaults work on any Prometheus 2.x/3.x scraping the runtime pods (every series has `bundle`)
and give exact integer increases, like the pod scrape:

    sum by (le) (S - min_over_time(S[{window}]))
    S = modeldeploy_time_to_first_token_seconds_bucket{bundle="{bundle}",{selector}}

is "now minus the first sample scraped inside the window" per series (a counter's minimum over
the range is its first sample there). The baseline is a scrape taken after the step began, as the
pod scrape's baseline is read when the step begins: `S offset {window}` would take the last scrape
before it, up to one scrape interval early, and the conformance gate's deliberate 4xx answered in
that gap would count against the canary (bench/chaos.py). A series that started inside the window
counts from its first scrape; after a counter reset (a restarted process) only the increase since
the reset counts: both undercount, never invent, requests. `increase()` would extrapolate to the
range edges and give fractions.

Window: `prometheus.window` when set, else the time since the current step began (status
rollout.phaseSince), at least 1 s and at most MAX_WINDOW_S; the interval when that is unknown.
Both cohorts are evaluated at one instant: the newest one at which each cohort has a scraped
sample (`max(timestamp(requests))` per cohort, the older of the two), never later than now. Right
after a Prometheus outage (frozen, restarted, partitioned from the pods) its newest samples are
from before it, and an instant query at `now` would read them through the 5-minute lookback: a
window that is really seconds long, judged as if it held the whole step.
Evaluated at the sample's own time the window is what Prometheus really holds, so too few samples
are Inconclusive and the step holds; a newest sample older than the step is Inconclusive at once.

Anything that keeps a figure from being read
(unreachable, HTTP error, `status: error`, a non-vector or empty result, a malformed series)
makes the interval Inconclusive with a message naming the address and the query: the step
holds, nothing raises into the reconcile and nothing passes silently.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time as _time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import httpx

from modeldeploy.operator.analysis.pods import read_bounded
from modeldeploy.operator.analysis.verdicts import ITL, REQUESTS, TTFT, CohortSample, Histogram
from modeldeploy.operator.api.v1alpha1.analysis import PrometheusSource

if TYPE_CHECKING:
    from modeldeploy.operator.analysis.window import AnalysisWindow

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0  # per HTTP phase; queries of one interval run in parallel
MAX_BYTES = 1024 * 1024  # a query answer larger than this is an error
MAX_WINDOW_S = 3600  # the default window never reaches further back than this


def _since(series: str) -> str:
    s = series + '{bundle="{bundle}",{selector}}'
    return f"{s} - min_over_time({s}[{{window}}])"


# The newest scraped sample of one cohort (seconds since the epoch): the instant the queries use.
FRESHNESS = "max(timestamp(" + REQUESTS + '{bundle="{bundle}",{selector}}))'

DEFAULT_QUERIES: Mapping[str, str] = MappingProxyType(
    {
        "ttft_buckets": f"sum by (le) ({_since(TTFT + '_bucket')})",
        "itl_buckets": f"sum by (le) ({_since(ITL + '_bucket')})",
        "outcomes": f"sum by (outcome) ({_since(REQUESTS)})",
    }
)
_PLACEHOLDER = re.compile(r"\{(bundle|namespace|selector|window)\}")


class QueryError(Exception):
    """A query whose answer cannot be used; the message names the address and the query."""


def render(template: str, **values: str) -> str:
    """Substitute the known placeholders only: `{job="x"}` and other PromQL braces stay as written."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)] if m.group(1) in values else m.group(0), template)


def window(src: PrometheusSource, since: float | None, now: float, interval_s: int) -> str:
    """The PromQL range of this interval (see the module docstring)."""
    if src.window:
        return src.window
    seconds = interval_s if since is None else math.ceil(now - since)
    return f"{min(max(seconds, 1), MAX_WINDOW_S)}s"


def _values(src: PrometheusSource, bundle: str, namespace: str, window_: str) -> dict[str, str]:
    values = {"bundle": _quote(bundle), "namespace": _quote(namespace), "window": window_}
    values["selector"] = render(src.selector, **values)
    return values


def queries(src: PrometheusSource, bundle: str, namespace: str, window_: str) -> dict[str, str]:
    """The three rendered queries of one cohort: ttft_buckets, itl_buckets, outcomes."""
    values = _values(src, bundle, namespace, window_)
    return {k: render(getattr(src.queries, k) or default, **values) for k, default in DEFAULT_QUERIES.items()}


def freshest(src: PrometheusSource, namespace: str, bundles: tuple[str, ...], now: float) -> float:
    """The instant to evaluate at: the oldest of the cohorts' newest samples, at most `now` (see the
    module docstring); QueryError when a cohort has none."""
    newest = []
    with httpx.Client(timeout=TIMEOUT_S) as http:
        for b in bundles:
            q = render(FRESHNESS, **_values(src, b, namespace, "1s"))
            newest.append(max(v for _, v in query(http, src.address, q, now)))
    return min(now, *newest)


def _quote(v: str) -> str:
    """Escape for a PromQL double-quoted string (bundle ids and namespaces never need it; be safe)."""
    return v.replace("\\", "\\\\").replace('"', '\\"')


def query(http: httpx.Client, address: str, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
    """GET /api/v1/query at time `at`: (labels, value) per series of the instant vector; else QueryError."""
    where = f"Prometheus {address} query {promql!r}"
    params = {"query": promql, "time": f"{at:.3f}", "timeout": f"{TIMEOUT_S:g}s"}
    try:
        with http.stream("GET", address.rstrip("/") + "/api/v1/query", params=params) as r:
            body = read_bounded(r, MAX_BYTES, "answer")
            status = r.status_code
    except httpx.HTTPError as e:
        raise QueryError(f"{where}: unreachable ({type(e).__name__}: {e})") from e
    except ValueError as e:  # too large
        raise QueryError(f"{where}: {e}") from None
    try:
        doc: Any = json.loads(body)
    except ValueError:
        raise QueryError(f"{where}: HTTP {status}, not JSON: {body[:200]!r}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        kind, msg = (doc.get("errorType"), doc.get("error")) if isinstance(doc, dict) else (None, None)
        raise QueryError(f"{where}: HTTP {status}, {kind or 'error'}: {msg or str(doc)[:200]}")
    data = doc.get("data") or {}
    if data.get("resultType") != "vector":
        raise QueryError(f"{where}: result type {data.get('resultType')!r}, want an instant vector")
    out = []
    for series in data.get("result") or []:
        try:
            labels, value = dict(series["metric"]), float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise QueryError(f"{where}: malformed series {str(series)[:200]}") from e
        if not math.isfinite(value):
            raise QueryError(f"{where}: non-finite value {value} for {labels}")
        out.append((labels, value))
    if not out:
        raise QueryError(
            f"{where}: no series (is Prometheus scraping the pods, and does the selector match?)"
        )
    return out


def histogram(rows: list[tuple[dict[str, str], float]], where: str) -> Histogram:
    """Bucket increases by `le` -> Histogram; count is the +Inf bucket (the sum is not queried)."""
    buckets: dict[float, float] = {}
    for labels, value in rows:
        if "le" not in labels:
            raise QueryError(f"{where}: series {labels} has no le label (group the query by le)")
        le = float(labels["le"])
        buckets[le] = buckets.get(le, 0.0) + value
    if math.inf not in buckets:
        raise QueryError(f'{where}: no le="+Inf" bucket')
    return Histogram(tuple(sorted(buckets.items())), buckets[math.inf], 0.0)


def outcomes(rows: list[tuple[dict[str, str], float]], where: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in rows:
        if "outcome" not in labels:
            raise QueryError(f"{where}: series {labels} has no outcome label (group the query by outcome)")
        out[labels["outcome"]] = out.get(labels["outcome"], 0.0) + value
    return out


def cohort_samples(
    src: PrometheusSource, namespace: str, bundles: tuple[str, ...], window_: str, at: float
) -> list[CohortSample]:
    """One CohortSample per bundle, all queries in parallel at instant `at`; QueryError on the first bad."""
    jobs = [(b, k, q) for b in bundles for k, q in queries(src, b, namespace, window_).items()]
    with httpx.Client(timeout=TIMEOUT_S) as http, ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        answers = list(pool.map(lambda j: _answer(http, src.address, j[2], at), jobs))
    got: dict[tuple[str, str], Any] = {}
    for (b, k, q), rows in zip(jobs, answers, strict=True):
        if isinstance(rows, QueryError):
            raise rows
        where = f"Prometheus {src.address} query {q!r}"
        got[(b, k)] = outcomes(rows, where) if k == "outcomes" else histogram(rows, where)
    return [
        CohortSample(got[(b, "ttft_buckets")], got[(b, "itl_buckets")], got[(b, "outcomes")]) for b in bundles
    ]


def _answer(http: httpx.Client, address: str, promql: str, at: float) -> Any:
    try:
        return query(http, address, promql, at)
    except QueryError as e:
        return e


class Prometheus:
    """`MetricsSource` over a Prometheus HTTP API (`spec.rollout.analysis.prometheus`).

    Never raises QueryError: an unreadable figure gives empty samples and the reason, logged,
    so the interval is Inconclusive and the step holds.
    """

    def __init__(
        self, src: PrometheusSource, interval_s: int, clock: Callable[[], float] = _time.time
    ) -> None:
        self.src, self.interval_s, self.clock = src, interval_s, clock

    def read(self, cohorts: AnalysisWindow) -> tuple[CohortSample, CohortSample, str]:
        now = self.clock()
        bundles = (cohorts.stable, cohorts.canary)
        try:
            at = freshest(self.src, cohorts.namespace, bundles, now)
            if cohorts.since is not None and at <= cohorts.since:
                raise QueryError(
                    f"Prometheus {self.src.address}: newest sample of a cohort is {now - at:.0f}s old, "
                    "from before the step began (scrapes stopped?)"
                )
            span = window(self.src, cohorts.since, at, self.interval_s)
            s, c = cohort_samples(self.src, cohorts.namespace, bundles, span, at)
        except QueryError as e:
            log.warning("canary analysis Inconclusive for %s/%s: %s", cohorts.namespace, cohorts.canary, e)
            return CohortSample(), CohortSample(), str(e)
        return s, c, ""
