"""The Prometheus analysis source against a real Prometheus scraping real `modeldeploy serve` processes.

A stable (8 slots) and a canary (1 slot) server on 127.0.0.1, each its own bundle; Prometheus
(built by devtools/modeldeploy_dev/cluster/build.sh) scrapes both every second with a static
namespace="team-a", and scrapes the stable server a second time as namespace="team-b" (a decoy the default
selector must leave out, or every stable figure would double). Over the same window the
Prometheus source must give exactly the counts and buckets the direct pod scrape gives, hence
the same verdict; under 8-way load the 1-slot canary must fail TTFT p95 through Prometheus too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.canary_server import Serve
from support.operator_fixtures import prometheus_analysis

from modeldeploy.operator.analysis import promql
from modeldeploy.operator.analysis.scrape import Baselines, scrape_cohort
from modeldeploy.operator.analysis.verdicts import CohortSample, analyze
from modeldeploy.operator.api.v1alpha1.analysis import Analysis, PrometheusSource
from modeldeploy_dev.lora_fixtures import make_adapters
from modeldeploy_dev.prometheus import PROMETHEUS, Prom

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not PROMETHEUS.exists(),
        reason=f"{PROMETHEUS} not built: run `make cluster-build` "
        "(devtools/modeldeploy_dev/cluster/build.sh)",
    ),
]
NS = "team-a"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, llama_dir: Path) -> Iterator[tuple[Serve, Serve, Prom]]:
    tmp = tmp_path_factory.mktemp("promql")
    stable = Serve(tmp, llama_dir, "--max-num-seqs", "8", bundle="bundle-prom-stable")
    canary = Serve(tmp, llama_dir, "--max-num-seqs", "1", bundle="bundle-prom-canary")
    prom = None
    try:
        prom = Prom(
            tmp,
            {
                "stable": (stable.target, NS),
                "canary": (canary.target, NS),
                "decoy": (stable.target, "team-b"),
            },
        )
        stable.wait_ready()
        canary.wait_ready()
        prom.wait_ready()
        prom.scraped_after(time.time(), jobs=3)
        yield stable, canary, prom
    finally:
        for p in (prom, stable, canary):
            if p is not None:
                p.stop()


class Window:
    """One analysis window read both ways: pod scrapes with Baselines, and Prometheus since `t0`."""

    def __init__(self, stable: Serve, canary: Serve, prom: Prom, cfg: Analysis) -> None:
        self.cohorts = ((stable.bundle, [stable.target]), (canary.bundle, [canary.target]))
        self.prom, self.cfg, self.base = prom, cfg, Baselines()
        prom.scraped_after(time.time(), jobs=3)  # earlier traffic is in Prometheus...
        time.sleep(1.5)  # ...before the window's range, which may reach up to 1 s before t0
        self.t0 = time.time()
        self.direct()  # opens the scrape windows: no traffic since
        # and the range's first scrape after t0 is taken before any traffic of this window
        prom.scraped_after(self.t0, jobs=3)

    def direct(self) -> list[CohortSample]:
        return [self.base.delta("uid", b, "w", scrape_cohort(ips, b)) for b, ips in self.cohorts]

    def both(self) -> tuple[list[CohortSample], list[CohortSample], float]:
        """(direct deltas, Prometheus samples, now) once Prometheus has scraped past the direct read."""
        direct, t = self.direct(), time.time()
        self.prom.scraped_after(t, jobs=3)
        # a second round: the analysis evaluates at the oldest of the cohorts' newest samples, and each
        # cohort's sample at that instant must be one taken after t
        self.prom.scraped_after(time.time(), jobs=3)
        now = time.time()
        src = self.cfg.prometheus
        assert src is not None
        w = promql.window(src, self.t0, now, self.cfg.interval_seconds)
        assert w == f"{math.ceil(now - self.t0)}s"
        return direct, promql.cohort_samples(src, NS, (self.cohorts[0][0], self.cohorts[1][0]), w, now), now


def _cfg(prom: Prom, min_samples: int) -> Analysis:
    return Analysis(min_samples=min_samples, prometheus={"address": prom.url})


def test_prometheus_counts_equal_the_pod_scrape_and_give_the_same_verdict(stack) -> None:
    stable, canary, prom = stack
    cfg = _cfg(prom, min_samples=5)
    win = Window(stable, canary, prom, cfg)
    assert stable.complete(6) == [200] * 6 and canary.complete(6) == [200] * 6
    bad = httpx.post(
        canary.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "bogus": 1}, timeout=30
    )
    assert bad.status_code == 400
    direct, via_prom, now = win.both()
    assert direct[0].outcomes["completed"] == 6 and direct[1].outcomes["completed"] == 6
    assert direct[1].outcomes["invalid"] == 1 and direct[0].ttft.count == 6
    for d, p in zip(direct, via_prom, strict=True):
        assert p.outcomes == d.outcomes  # exact: counters, no extrapolation
        assert p.ttft.buckets == d.ttft.buckets and p.ttft.count == d.ttft.count
        assert p.itl.buckets == d.itl.buckets and p.itl.count == d.itl.count > 0
    want = analyze(direct[0], direct[1], cfg, step=0, time="t")
    got, problem = prometheus_analysis(
        cfg, NS, stable.bundle, canary.bundle, since=win.t0, step=0, time="t", now=now
    )
    assert problem == "" and got == want and got.verdict != "Inconclusive"
    assert {m.samples for m in got.metrics} == {6}


def test_one_slot_canary_fails_ttft_through_prometheus(stack) -> None:
    stable, canary, prom = stack
    cfg = _cfg(prom, min_samples=20)
    win = Window(stable, canary, prom, cfg)
    for s in (stable, canary):
        assert s.complete(24, workers=8, max_tokens=8) == [200] * 24
    direct, via_prom, now = win.both()
    assert [p.outcomes for p in via_prom] == [d.outcomes for d in direct]
    result, problem = prometheus_analysis(
        cfg, NS, stable.bundle, canary.bundle, since=win.t0, step=1, time="t", now=now
    )
    by = {m.metric: m for m in result.metrics}
    assert problem == "" and result.verdict == "Fail", result
    assert by["ttft_p95_seconds"].verdict == "Fail" and by["ttft_p95_seconds"].samples == 24
    assert by["ttft_p95_seconds"].canary > 1.2 * by["ttft_p95_seconds"].stable
    assert by["error_rate"].verdict == "Pass" and by["error_rate"].canary == 0.0
    assert result == analyze(direct[0], direct[1], cfg, step=1, time="t")


def test_real_prometheus_errors_are_inconclusive_naming_the_query(stack) -> None:
    stable, canary, prom = stack
    broken = Analysis(
        min_samples=1,
        prometheus={
            "address": prom.url,
            "window": "30s",
            "queries": {
                "outcomes": 'sum by (outcome) (modeldeploy_requests_total{bundle="{bundle}"}[{window}]'
            },
        },
    )
    result, problem = prometheus_analysis(broken, NS, stable.bundle, canary.bundle, since=None)
    assert result.verdict == "Inconclusive" and prom.url in problem and "bad_data" in problem
    assert 'modeldeploy_requests_total{bundle="bundle-prom-stable"}[30s]' in problem
    elsewhere = Analysis(min_samples=1, prometheus={"address": prom.url, "selector": 'namespace="team-z"'})
    result, problem = prometheus_analysis(elsewhere, NS, stable.bundle, canary.bundle, since=None)
    assert result.verdict == "Inconclusive" and "no series" in problem and 'namespace="team-z"' in problem
    src = PrometheusSource(address=prom.url)
    assert promql.queries(src, stable.bundle, NS, "5s")["outcomes"].count('namespace="team-a"') == 2


# --- one adapter's traffic ---------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_pod(tmp_path_factory: pytest.TempPathFactory, llama_dir: Path) -> Iterator[tuple[Serve, Prom]]:
    """A server with adapters tenant-a and tenant-b (made with peft), scraped by Prometheus."""
    tmp = tmp_path_factory.mktemp("promql-lora")
    adapters = make_adapters(llama_dir, tmp / "adapters")
    flags = [f for name, path in adapters.items() for f in ("--adapter", f"{name}={path}")]
    pod = Serve(tmp, llama_dir, "--max-num-seqs", "4", *flags, bundle="bundle-prom-lora")
    prom = None
    try:
        prom = Prom(tmp, {"pod": (pod.target, NS)})
        pod.wait_ready()
        prom.wait_ready()
        prom.scraped_after(time.time(), jobs=1)
        yield pod, prom
    finally:
        for p in (prom, pod):
            if p is not None:
                p.stop()


def _by_adapter(pod: Serve) -> tuple[CohortSample, CohortSample]:
    """(all adapters, tenant-b's series alone) from the pod's own /metrics."""
    text = httpx.get(pod.url + "/metrics", timeout=10).text
    only_b = "\n".join(
        line for line in text.splitlines() if line.startswith("#") or 'adapter="tenant-b"' in line
    )
    return CohortSample.from_text(text, pod.bundle), CohortSample.from_text(only_b, pod.bundle)


def test_adapter_selector_reads_only_that_adapters_series(lora_pod) -> None:
    """As the README documents: `selector: 'namespace="{namespace}",adapter="tenant-b"'` scopes the
    Prometheus source to tenant-b's traffic: equal to tenant-b's own series read from the pod, while
    the default selector (and the pod scrape, which sums all adapters) counts every request."""
    pod, prom = lora_pod
    prom.scraped_after(time.time(), jobs=1)
    time.sleep(1.5)  # the window's range (up to 1 s before t0) sees no earlier traffic
    t0 = time.time()
    all0, b0 = _by_adapter(pod)
    prom.scraped_after(t0, jobs=1)  # and a scrape after t0, before this window's traffic
    for model, n in (("tiny", 2), ("tenant-a", 3), ("tenant-b", 4)):
        for i in range(n):
            r = httpx.post(
                pod.url + "/v1/completions",
                json={"model": model, "prompt": f"hello {i}", "max_tokens": 4, "temperature": 0},
                timeout=120,
            )
            assert r.status_code == 200, r.text
    all1, b1 = _by_adapter(pod)
    direct_all, direct_b = all1.since(all0), b1.since(b0)
    assert direct_b.outcomes["completed"] == 4 and direct_all.outcomes["completed"] == 9
    t = time.time()
    prom.scraped_after(t, jobs=1)
    now = time.time()
    scoped = PrometheusSource(address=prom.url, selector='namespace="{namespace}",adapter="tenant-b"')
    w = promql.window(scoped, t0, now, 30)
    (only_b,) = promql.cohort_samples(scoped, NS, (pod.bundle,), w, now)
    (everyone,) = promql.cohort_samples(PrometheusSource(address=prom.url), NS, (pod.bundle,), w, now)
    for got, want in ((only_b, direct_b), (everyone, direct_all)):
        assert {k: v for k, v in got.outcomes.items() if v} == {k: v for k, v in want.outcomes.items() if v}
        assert got.ttft.buckets == want.ttft.buckets and got.ttft.count == want.ttft.count
        assert got.itl.buckets == want.itl.buckets and got.itl.count == want.itl.count
    assert only_b.ttft.count == 4 and everyone.ttft.count == 9
