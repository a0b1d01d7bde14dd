"""Canary I/O against real `modeldeploy serve` processes on 127.0.0.1 (tiny llama made at test time).

Two processes with the same bundle id stand for a two-pod cohort: scrape_cohort must sum
their real counters, Baselines must give per-pod deltas (also across a pod restart on the
same address), and ConformanceRunner must pass on a healthy server and fail, naming the
checks, on one whose contract the client cannot meet (API key required) or that is absent.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from support.canary_server import BUNDLE, Serve, _free_port

from modeldeploy.conformance.prom import Metrics
from modeldeploy.operator.analysis.gate import ConformanceRunner
from modeldeploy.operator.analysis.scrape import Baselines, PodScrape, scrape_cohort
from modeldeploy.operator.analysis.sources import analyze_interval
from modeldeploy.operator.analysis.window import AnalysisWindow
from modeldeploy.operator.api.v1alpha1.analysis import Analysis

KEY = ("uid-canary-io", BUNDLE)


@pytest.fixture(scope="module")
def pods(tmp_path_factory, llama_dir):
    tmp = tmp_path_factory.mktemp("canary-io")
    a, b = Serve(tmp, llama_dir), Serve(tmp, llama_dir)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.stop()
        b.stop()


def _direct(url: str, name: str, **labels: str) -> float:
    """The same figure read straight from the server's exposition, for comparison."""
    return Metrics(httpx.get(url + "/metrics", timeout=5).text).get(name, bundle=BUNDLE, **labels) or 0.0


def test_scrape_sums_real_counts_and_baselines_give_the_window(pods) -> None:
    a, b = pods
    base = Baselines()
    first = scrape_cohort([a.target, b.target], BUNDLE)
    assert set(first.pods) == {a.target, b.target} and not first.errors and first.problems() == ""
    assert base.delta(KEY[0], BUNDLE, ("step", 0), first).finished == 0  # window opens here

    assert a.complete(3) == [200] * 3 and b.complete(2) == [200] * 2
    bad = httpx.post(
        a.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "bogus_field": 1}, timeout=30
    )
    assert bad.status_code == 400

    dead = f"127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    now = scrape_cohort([a.target, b.target, dead], BUNDLE, timeout=1.0)
    assert time.monotonic() - t0 < 5
    assert (
        "unreachable" in now.errors[dead] and dead in now.problems() and set(now.pods) == {a.target, b.target}
    )
    # cumulative totals are exactly what the two servers export
    for outcome in ("completed", "invalid"):
        want = sum(_direct(s.url, "modeldeploy_requests_total", outcome=outcome) for s in pods)
        assert now.sample.outcomes[outcome] == want
    ttft_count = sum(_direct(s.url, "modeldeploy_time_to_first_token_seconds_count") for s in pods)
    assert now.sample.ttft.count == ttft_count
    # the window holds only what was sent since it opened, per pod
    d = base.delta(KEY[0], BUNDLE, ("step", 0), now)
    assert d.outcomes["completed"] == 5 and d.outcomes["invalid"] == 1 and d.outcomes["rejected"] == 0
    assert d.ttft.count == 5 and d.itl.count >= 5  # 4 tokens each: >= 1 gap per request
    assert d.error_rate() == 0.0 and d.invalid_rate() == pytest.approx(1 / 6)  # the 400 is the client's
    assert now.pods[a.target].since(first.pods[a.target]).outcomes["completed"] == 3
    # a new mark (next step) starts a new window
    assert base.delta(KEY[0], BUNDLE, ("step", 1), now).finished == 0


def test_other_bundle_series_are_not_summed(pods) -> None:
    a, _ = pods
    s = scrape_cohort([a.target], "some-other-bundle")
    assert not s.pods and "no modeldeploy_* series labelled bundle=some-other-bundle" in s.errors[a.target]


def test_pod_bound_reports_the_rest(pods) -> None:
    a, b = pods
    s = scrape_cohort([a.target, b.target], BUNDLE, max_pods=1)
    assert list(s.pods) == [a.target] and s.skipped == (b.target,) and "1 pod(s) over" in s.problems()


def test_restarted_pod_counts_from_zero_in_the_window(pods) -> None:
    a, b = pods
    base = Baselines()
    base.delta(KEY[0], BUNDLE, "w", scrape_cohort([a.target, b.target], BUNDLE))
    assert b.complete(2) == [200, 200]
    assert (
        base.delta(KEY[0], BUNDLE, "w", scrape_cohort([a.target, b.target], BUNDLE)).outcomes["completed"]
        == 2
    )
    b.restart("--max-num-seqs", "4", "--api-key", "s3cret")  # same address, counters back to zero
    assert b.complete(1, headers={"Authorization": "Bearer s3cret"}) == [200]
    d = base.delta(KEY[0], BUNDLE, "w", scrape_cohort([a.target, b.target], BUNDLE))
    assert d.outcomes["completed"] == 1  # b's 1 since restart; a served nothing
    base.forget(KEY[0])
    assert len(base) == 0


def test_conformance_runner_passes_on_a_real_server_without_blocking(pods) -> None:
    a, _ = pods
    runner = ConformanceRunner(deadline_s=280, request_timeout_s=60)
    t0 = time.monotonic()
    assert runner.start(KEY, a.url) is True
    assert time.monotonic() - t0 < 0.5 and runner.result(KEY) is None and runner.running(KEY)
    assert runner.start(KEY, a.url) is False  # one run per (md uid, bundle)
    passed, summary = runner.wait(KEY, 290)
    assert passed, summary
    assert summary.startswith("conformance passed: 9 checks")  # 8 + adapters (skipped: none served)


def test_conformance_runner_names_failed_checks(pods) -> None:
    _, b = pods
    if "--api-key" not in b.flags:  # when run alone
        b.restart("--max-num-seqs", "4", "--api-key", "s3cret")
    runner = ConformanceRunner(deadline_s=120, request_timeout_s=30)
    runner.start(KEY, b.url, model="tiny")  # no key: every /v1 call is a 401
    passed, summary = runner.wait(KEY, 130)
    assert not passed
    assert summary.startswith("conformance failed checks: ") and "normal_response" in summary
    assert "streaming" in summary and "readiness" not in summary.split("(")[0]
    assert "401" in summary


def test_conformance_runner_nothing_listening() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    runner = ConformanceRunner(deadline_s=30, request_timeout_s=2)
    runner.start(KEY, url)
    passed, summary = runner.wait(KEY, 40)
    assert not passed and url in summary and "could not run" in summary
    runner.forget_md(KEY[0])  # finished: dropped, so a new canary can run again
    assert runner.result(KEY) is None and runner.start(KEY, url) is True
    runner.wait(KEY, 40)


def test_conformance_runner_deadline_on_a_hung_pod() -> None:
    """A socket that accepts connections and never answers: the gate reads failed at its deadline."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        runner = ConformanceRunner(deadline_s=1.0, request_timeout_s=5)
        runner.start(KEY, url)
        assert runner.result(KEY) is None
        time.sleep(1.3)
        passed, summary = runner.result(KEY)
        assert not passed and "did not finish within 1s" in summary
        runner.forget(KEY)  # thread still waiting on the socket: key stays busy
        assert runner.running(KEY) and runner.start(KEY, url) is False


def test_scraped_windows_feed_analysis_a_one_slot_canary_fails_on_ttft(tmp_path, llama_dir) -> None:
    """stable (8 running slots) vs canary (1 slot) under the same 8-way load: queueing shows up in TTFT."""
    stable = Serve(tmp_path, llama_dir, "--max-num-seqs", "8", bundle="bundle-stable-8")
    canary = Serve(tmp_path, llama_dir, "--max-num-seqs", "1", bundle="bundle-canary-1")
    try:
        stable.wait_ready()
        canary.wait_ready()
        base, cfg = Baselines(), Analysis(min_samples=20)
        dead = f"127.0.0.1:{_free_port()}"

        def interval():
            cohorts = AnalysisWindow(
                "uid-analysis",
                "ns",
                stable.bundle,
                canary.bundle,
                (stable.target,),
                (canary.target, dead),
                mark=("step", 0),
            )
            return analyze_interval(PodScrape(base), cohorts, cfg, step=0, time="t")

        opening, _ = interval()  # opens both windows: nothing counted yet
        assert opening.verdict == "Inconclusive" and all(m.samples == 0 for m in opening.metrics)
        for s in (stable, canary):
            assert s.complete(24, workers=8, max_tokens=8) == [200] * 24
        result, problems = interval()
        assert dead in problems and "unreachable" in problems
        by = {m.metric: m for m in result.metrics}
        assert result.verdict == "Fail" and result.step == 0, result
        assert by["ttft_p95_seconds"].verdict == "Fail" and by["ttft_p95_seconds"].samples == 24
        assert by["ttft_p95_seconds"].canary > 1.2 * by["ttft_p95_seconds"].stable
        assert by["error_rate"].verdict == "Pass" and by["error_rate"].canary == 0.0
    finally:
        stable.stop()
        canary.stop()
