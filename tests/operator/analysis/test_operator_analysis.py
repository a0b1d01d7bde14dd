"""Canary analysis on real Prometheus text produced by the runtime server's metrics registry."""

from __future__ import annotations

import random

import pytest

from modeldeploy.operator.analysis.verdicts import CohortSample, Histogram, analyze
from modeldeploy.operator.api.v1alpha1.analysis import Analysis
from modeldeploy.runtime.server.metrics import ServerMetrics


def server(bundle: str) -> ServerMetrics:
    live = {
        "running": 0,
        "waiting": 0,
        "kv_usage": 0.0,
        "load_progress": 1.0,
        "load_seconds": 1.0,
        "prompt_tokens": 0,
        "generation_tokens": 0,
        "preemptions": 0,
        "build_info": {"bundle": bundle},
    }
    return ServerMetrics({"bundle": bundle, "engine_build": "test", "model_revision": "r1"}, lambda: live)


def serve(m: ServerMetrics, n: int, ttft: float, itl: float, errors: int = 0, seed: int = 0) -> None:
    """Record n requests with latencies jittered around ttft / itl (8 tokens each)."""
    rng = random.Random(seed)
    for i in range(n):
        if i < errors:
            m.outcome("error")
            continue
        m.hist("ttft").observe(ttft * rng.uniform(0.8, 1.2))
        for _ in range(7):
            m.hist("itl").observe(itl * rng.uniform(0.8, 1.2))
        m.outcome("completed")


def sample(m: ServerMetrics, bundle: str) -> CohortSample:
    return CohortSample.from_text(m.render().decode(), bundle)


CFG = Analysis(min_samples=20)


def test_equal_cohorts_pass():
    s, c = server("stable1"), server("canary1")
    serve(s, 100, 0.2, 0.02, seed=1)
    serve(c, 100, 0.2, 0.02, seed=2)
    r = analyze(sample(s, "stable1"), sample(c, "canary1"), CFG, step=0)
    assert r.verdict == "Pass", r
    by = {v.metric: v for v in r.metrics}
    assert by["ttft_p95_seconds"].stable == pytest.approx(0.23, rel=0.15)
    assert by["error_rate"].canary == 0.0 and by["goodput"].canary == pytest.approx(1.0)


def test_slow_canary_fails_on_ttft_with_figures():
    s, c = server("s"), server("c")
    serve(s, 100, 0.1, 0.02)
    serve(c, 100, 0.6, 0.02)
    r = analyze(sample(s, "s"), sample(c, "c"), CFG)
    by = {v.metric: v for v in r.metrics}
    assert r.verdict == "Fail" and by["ttft_p95_seconds"].verdict == "Fail"
    assert by["ttft_p95_seconds"].canary > by["ttft_p95_seconds"].threshold
    assert by["inter_token_latency_p95_seconds"].verdict == "Pass"


def test_errors_fail_and_few_samples_are_inconclusive():
    s, c = server("s"), server("c")
    serve(s, 100, 0.1, 0.02)
    serve(c, 100, 0.1, 0.02, errors=5)
    r = analyze(sample(s, "s"), sample(c, "c"), CFG)
    assert {v.metric: v.verdict for v in r.metrics}["error_rate"] == "Fail"
    few = server("c2")
    serve(few, 5, 5.0, 1.0)
    r = analyze(sample(s, "s"), sample(few, "c2"), CFG)
    assert r.verdict == "Inconclusive" and all(v.samples == 5 for v in r.metrics)


def test_client_errors_fail_a_canary_only_beyond_the_stable_share():
    """Bad requests land on both cohorts alike: they are the client's, not the canary's. A canary
    answering "invalid" to requests the stable bundle serves (e.g. a lost chat template) fails."""
    s, c = server("s"), server("c")
    serve(s, 100, 0.1, 0.02)
    serve(c, 100, 0.1, 0.02)
    for m in (s, c):
        for _ in range(10):
            m.outcome("invalid")
    r = analyze(sample(s, "s"), sample(c, "c"), CFG)
    by = {v.metric: v for v in r.metrics}
    assert r.verdict == "Pass" and by["error_rate"].canary == 0.0 and by["error_rate"].samples == 100
    for _ in range(30):
        c.outcome("invalid")  # 40/140 invalid on the canary vs 10/110 on stable
    by = {v.metric: v for v in analyze(sample(s, "s"), sample(c, "c"), CFG).metrics}
    assert by["error_rate"].verdict == "Fail"
    assert by["error_rate"].canary == pytest.approx(40 / 140 - 10 / 110) and by["error_rate"].stable == 0.0


def test_interval_delta_and_pod_restart():
    c = server("c")
    serve(c, 50, 2.0, 0.02)  # a slow past...
    before = sample(c, "c")
    serve(c, 50, 0.1, 0.02, seed=3)  # ...then a fast interval
    delta = sample(c, "c").since(before)
    assert delta.finished == 50 and delta.ttft.quantile(0.95) < 0.25
    restarted = server("c")
    serve(restarted, 10, 0.1, 0.02)
    assert sample(restarted, "c").since(before).finished == 10  # counts went down: counted from zero


def test_other_bundles_never_join():
    m = server("a")
    serve(m, 30, 0.1, 0.02)
    assert sample(m, "b").finished == 0 and sample(m, "b").ttft.quantile(0.5) is None


def test_histogram_math():
    h = Histogram(((0.1, 10.0), (0.2, 30.0), (float("inf"), 40.0)), 40.0, 5.0)
    assert h.quantile(0.25) == pytest.approx(0.1)
    assert h.quantile(0.5) == pytest.approx(0.15)
    assert h.quantile(0.99) == pytest.approx(0.2)  # +Inf bucket: highest finite bound
    assert h.share_le(0.15) == pytest.approx(0.5)
    assert h.share_le(5.0) == pytest.approx(0.75)
    assert (h + h).count == 80 and (h + h).since(h).buckets == h.buckets
