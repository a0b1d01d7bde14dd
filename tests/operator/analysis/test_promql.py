"""The Prometheus analysis source without Prometheus: API validation, query rendering, answer parsing.

Answers come from a real HTTP server on 127.0.0.1 that returns chosen bodies, so every error
path goes through httpx and the JSON parsing exactly as against Prometheus. Agreement with a
real Prometheus scraping real servers is tests/operator/analysis/test_promql_prometheus.py.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from pydantic import ValidationError
from support.operator_fixtures import md, prometheus_analysis

from modeldeploy.operator.analysis import promql
from modeldeploy.operator.analysis.scrape import Baselines, PodScrape
from modeldeploy.operator.analysis.sources import analyze_interval, source_for
from modeldeploy.operator.analysis.window import AnalysisWindow
from modeldeploy.operator.api.v1alpha1.analysis import Analysis, PrometheusSource
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec

# --- API -------------------------------------------------------------------------------------


def _spec(prometheus: dict) -> dict:
    spec = md()["spec"]
    spec.setdefault("rollout", {})["analysis"] = {"prometheus": prometheus}
    return spec


def test_prometheus_block_parses_with_defaults() -> None:
    spec = ModelDeploymentSpec.model_validate(_spec({"address": "http://prometheus.monitoring.svc:9090"}))
    src = spec.rollout.analysis.prometheus
    assert src is not None and src.selector == 'namespace="{namespace}"' and src.window is None
    assert src.queries.ttft_buckets is None and ModelDeploymentSpec.model_validate(
        _spec({"address": "https://[fd00::1]/p"})
    )
    assert ModelDeploymentSpec.model_validate(md()["spec"]).rollout.analysis.prometheus is None


@pytest.mark.parametrize(
    ("block", "field", "needle"),
    [
        ({"address": "prometheus:9090"}, "address", "http:// or https:// URL"),
        ({"address": "ftp://prometheus:9090"}, "address", "http:// or https:// URL"),
        ({"address": "http://user:secret@prometheus:9090"}, "address", "no credentials"),
        ({"address": "http://prometheus:9090/?x=1"}, "address", "http:// or https:// URL"),
        ({"address": "http://prometheus:9090\n"}, "address", "http:// or https:// URL"),
        ({"address": "http://p", "selector": "namespace={namespace}"}, "selector", "label matchers"),
        ({"address": "http://p", "selector": 'namespace="{ns}"'}, "selector", "placeholders: {bundle}"),
        ({"address": "http://p", "selector": '{job="x"}'}, "selector", "label matchers"),
        ({"address": "http://p", "window": "5"}, "window", "PromQL duration"),
        ({"address": "http://p", "window": "0s"}, "window", "PromQL duration"),
        (
            {"address": "http://p", "queries": {"ttftBuckets": 'sum(x{job="a"})'}},
            "queries.ttftBuckets",
            "must contain {bundle}",
        ),
        (
            {"address": "http://p", "queries": {"outcomes": 'x{bundle="{bundle}"}[{Window}]'}},
            "queries.outcomes",
            "no placeholders other than",
        ),
        (
            {"address": "http://p", "queries": {"latency": 'x{bundle="{bundle}"}'}},
            "queries.latency",
            "Extra inputs are not permitted",
        ),
        ({"selector": 'namespace="x"'}, "address", "Field required"),
    ],
)
def test_bad_prometheus_block_is_an_error_naming_the_field(block: dict, field: str, needle: str) -> None:
    with pytest.raises(ValidationError) as e:
        ModelDeploymentSpec.model_validate(_spec(block))
    text = str(e.value)
    assert f"rollout.analysis.prometheus.{field}" in text and needle in text, text


def test_the_old_bare_address_field_is_rejected_not_ignored() -> None:
    spec = md()["spec"]
    spec.setdefault("rollout", {})["analysis"] = {"prometheusAddress": "http://prometheus:9090"}
    with pytest.raises(ValidationError, match="prometheusAddress"):
        ModelDeploymentSpec.model_validate(spec)


def test_crd_carries_the_same_rules() -> None:
    from modeldeploy.operator.api import crd

    node = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in ("spec", "rollout", "analysis", "prometheus"):
        node = node["properties"][part]
    assert node["required"] == ["address"] and "prometheusAddress" not in str(crd.crd())
    rule = node["properties"]["address"]["x-kubernetes-validations"][0]
    assert rule["rule"].startswith("self.matches('^https?://") and "prometheus.address" in rule["message"]
    assert node["properties"]["selector"]["default"] == 'namespace="{namespace}"'
    q = node["properties"]["queries"]["properties"]["ttftBuckets"]["x-kubernetes-validations"][0]["rule"]
    assert "self.contains('{bundle}')" in q


# --- rendering -------------------------------------------------------------------------------


def test_render_substitutes_known_placeholders_only() -> None:
    assert (
        promql.render(
            'x{a="{bundle}",{selector}}[{window}] {other}', bundle="b1", selector='ns="n"', window="30s"
        )
        == 'x{a="b1",ns="n"}[30s] {other}'
    )


def test_default_queries_are_exact_window_differences() -> None:
    src = PrometheusSource(address="http://p:9090")
    q = promql.queries(src, "bundle-abc", "team-a", "42s")
    s = 'modeldeploy_time_to_first_token_seconds_bucket{bundle="bundle-abc",namespace="team-a"}'
    assert q["ttft_buckets"] == f"sum by (le) ({s} - min_over_time({s}[42s]))"
    assert q["itl_buckets"].startswith("sum by (le) (modeldeploy_inter_token_latency_seconds_bucket{")
    assert q["outcomes"].startswith(
        'sum by (outcome) (modeldeploy_requests_total{bundle="bundle-abc",namespace='
    )
    assert all(
        "{" + p + "}" not in v for v in q.values() for p in ("bundle", "namespace", "selector", "window")
    )


def test_selector_and_overrides_are_rendered_per_cohort() -> None:
    src = PrometheusSource(
        address="http://p",
        selector='namespace="{namespace}",pod=~"md-{bundle}-.*"',
        queries={
            "outcomes": 'sum by (outcome) (increase(r{bundle="{bundle}",{selector}}[{window}] anchored))'
        },
    )
    q = promql.queries(src, "b2", "ns", "5m")
    assert (
        q["outcomes"]
        == 'sum by (outcome) (increase(r{bundle="b2",namespace="ns",pod=~"md-b2-.*"}[5m] anchored))'
    )
    assert (
        promql.queries(PrometheusSource(address="http://p", selector=""), "b", "n", "1s")["outcomes"].count(
            'modeldeploy_requests_total{bundle="b",}'
        )
        == 2
    )


def test_window_since_step_start_bounded_or_fixed() -> None:
    src = PrometheusSource(address="http://p")
    assert promql.window(src, since=1000.0, now=1041.2, interval_s=30) == "42s"
    assert promql.window(src, since=1000.0, now=1000.0, interval_s=30) == "1s"
    assert promql.window(src, since=0.0, now=10_000.0, interval_s=30) == f"{promql.MAX_WINDOW_S}s"
    assert promql.window(src, since=None, now=10_000.0, interval_s=30) == "30s"
    assert promql.window(PrometheusSource(address="http://p", window="5m"), 0.0, 99.0, 30) == "5m"


# --- answers from a real HTTP server ------------------------------------------------------------


class FakeProm:
    """Answers /api/v1/query by the first key contained in the query: (HTTP status, body bytes)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, bytes]] = {}
        self.answer: Callable[[str], tuple[int, bytes]] | None = None  # instead of routes, when set
        self.seen: list[dict[str, list[str]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                params = parse_qs(urlparse(self.path).query)
                owner.seen.append(params)
                q = params.get("query", [""])[0]
                status, body = (
                    owner.answer(q)
                    if owner.answer
                    else next((v for k, v in owner.routes.items() if k in q), (404, b"no route"))
                )
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def vector(self, key: str, series: list[tuple[dict[str, str], str]]) -> None:
        self.routes[key] = (200, self.body([{"metric": m, "value": [1700000000.0, v]} for m, v in series]))

    def healthy(self, bundle: str, fast: int, slow: int, completed: int, error: int = 0) -> None:
        """One cohort's answers: `fast` observations under 0.1 s, `slow` up to 5 s (both histograms)."""
        n = fast + slow
        self.fresh(bundle)
        self.vector(
            f'seconds_bucket{{bundle="{bundle}"',
            [({"le": "0.1"}, str(fast)), ({"le": "5.0"}, str(n)), ({"le": "+Inf"}, str(n))],
        )
        self.vector(
            f'requests_total{{bundle="{bundle}"',
            [
                ({"outcome": "completed"}, str(completed)),
                ({"outcome": "error"}, str(error)),
                ({"outcome": "rejected"}, "0"),
                ({"outcome": "cancelled"}, "0"),
            ],
        )

    def fresh(self, bundle: str, at: float = 1700000000.0) -> None:
        """The cohort's newest sample is at `at` (the instant the source then evaluates at)."""
        self.vector(f'timestamp(modeldeploy_requests_total{{bundle="{bundle}"', [({}, str(at))])

    @staticmethod
    def body(result: list[dict]) -> bytes:
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prom() -> Iterator[FakeProm]:
    p = FakeProm()
    yield p
    p.close()


def _cfg(address: str, **kw: object) -> Analysis:
    return Analysis(min_samples=10, prometheus={"address": address, **kw})


def test_answers_become_cohort_samples_and_the_same_verdicts(prom: FakeProm) -> None:
    prom.healthy("stable", fast=95, slow=5, completed=100)
    prom.healthy("canary", fast=60, slow=40, completed=99, error=1)
    result, problem = prometheus_analysis(
        _cfg(prom.address), "ns", "stable", "canary", since=None, step=1, time="t", now=1700000000.0
    )
    assert problem == ""
    by = {m.metric: m for m in result.metrics}
    assert result.verdict == "Fail" and result.step == 1 and by["ttft_p95_seconds"].verdict == "Fail"
    assert by["error_rate"].canary == pytest.approx(0.01) and by["error_rate"].samples == 100
    # the queries went out at one instant, with the window and a server-side timeout
    assert {p["time"][0] for p in prom.seen} == {"1700000000.000"} and len(prom.seen) == 8
    fresh = [p for p in prom.seen if p["query"][0].startswith("max(timestamp(")]
    assert len(fresh) == 2  # one freshness query per cohort, then six at the instant it gave
    assert all(p["timeout"] == ["5s"] and "[30s]" in p["query"][0] for p in prom.seen if p not in fresh)

    src = PrometheusSource(address=prom.address)
    (stable,) = promql.cohort_samples(src, "ns", ("stable",), "30s", 1700000000.0)
    assert stable.ttft.buckets == ((0.1, 95.0), (5.0, 100.0), (math.inf, 100.0)) and stable.ttft.count == 100
    assert stable.outcomes == {"completed": 100.0, "error": 0.0, "rejected": 0.0, "cancelled": 0.0}


def _problem(prom: FakeProm, **kw: object) -> str:
    result, problem = prometheus_analysis(_cfg(prom.address, **kw), "ns", "stable", "canary", since=None)
    assert result.verdict == "Inconclusive" and all(m.verdict == "Inconclusive" for m in result.metrics)
    assert prom.address in problem and "query '" in problem, problem
    return problem


def test_status_error_names_address_query_and_prometheus_error(prom: FakeProm) -> None:
    prom.healthy("stable", 10, 0, 10)
    prom.healthy("canary", 10, 0, 10)
    prom.routes['requests_total{bundle="canary"'] = (
        400,
        json.dumps(
            {"status": "error", "errorType": "bad_data", "error": "1:10: parse error: unexpected <by>"}
        ).encode(),
    )
    p = _problem(prom)
    assert "HTTP 400, bad_data: 1:10: parse error" in p and 'modeldeploy_requests_total{bundle="canary"' in p


def test_status_error_with_http_200_is_still_an_error(prom: FakeProm) -> None:
    prom.healthy("stable", 10, 0, 10)
    prom.healthy("canary", 10, 0, 10)
    prom.routes['seconds_bucket{bundle="stable"'] = (
        200,
        b'{"status":"error","errorType":"timeout","error":"query timed out"}',
    )
    assert "timeout: query timed out" in _problem(prom)


def test_not_json_non_vector_empty_malformed(prom: FakeProm) -> None:
    prom.healthy("stable", 10, 0, 10)
    prom.healthy("canary", 10, 0, 10)
    key = 'requests_total{bundle="stable"'
    prom.routes[key] = (502, b"<html>bad gateway</html>")
    assert "HTTP 502, not JSON" in _problem(prom)
    prom.routes[key] = (200, b'{"status":"success","data":{"resultType":"matrix","result":[]}}')
    assert "result type 'matrix', want an instant vector" in _problem(prom)
    prom.routes[key] = (200, b'{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}')
    assert "result type 'scalar'" in _problem(prom)
    prom.vector(key, [])
    assert "no series (is Prometheus scraping the pods" in _problem(prom)
    prom.routes[key] = (200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}')
    assert "malformed series" in _problem(prom)
    prom.vector(key, [({"outcome": "completed"}, "NaN")])
    assert "non-finite value nan" in _problem(prom)
    prom.vector(key, [({"job": "x"}, "3")])
    assert "has no outcome label" in _problem(prom)


def test_histogram_answers_need_le_and_inf(prom: FakeProm) -> None:
    prom.healthy("stable", 10, 0, 10)
    prom.healthy("canary", 10, 0, 10)
    key = 'seconds_bucket{bundle="canary"'
    prom.vector(key, [({"le": "0.1"}, "3"), ({"le": "5.0"}, "4")])
    assert 'no le="+Inf" bucket' in _problem(prom)
    prom.vector(key, [({}, "3")])
    assert "has no le label" in _problem(prom)


def test_oversized_answer(prom: FakeProm) -> None:
    prom.healthy("stable", 10, 0, 10)
    prom.healthy("canary", 10, 0, 10)
    prom.routes['requests_total{bundle="canary"'] = (200, b" " * (promql.MAX_BYTES + 10))
    assert "answer larger than" in _problem(prom)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_and_hung_prometheus_are_inconclusive_in_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    dead = f"http://127.0.0.1:{_free_port()}"
    result, problem = prometheus_analysis(_cfg(dead), "ns", "s", "c", since=None)
    assert (
        result.verdict == "Inconclusive"
        and f"Prometheus {dead} query" in problem
        and "unreachable" in problem
    )
    monkeypatch.setattr(promql, "TIMEOUT_S", 0.5)
    with socket.socket() as hung:  # accepts, never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        t0 = time.monotonic()
        result, problem = prometheus_analysis(
            _cfg(f"http://127.0.0.1:{hung.getsockname()[1]}"), "ns", "s", "c", since=None
        )
        assert time.monotonic() - t0 < 3 and result.verdict == "Inconclusive" and "ReadTimeout" in problem


def test_canary_analysis_picks_the_source_from_spec(prom: FakeProm, caplog: pytest.LogCaptureFixture) -> None:
    prom.healthy("stable", 20, 0, 20)
    prom.healthy("canary", 20, 0, 20)
    cfg = _cfg(prom.address)
    result, problem = analyze_interval(
        source_for(cfg, Baselines()),
        AnalysisWindow("uid", "ns", "stable", "canary", mark=("canary", 0, None)),
        cfg,
        step=0,
        time="t",
    )
    assert result.verdict == "Pass" and problem == "" and len(prom.seen) == 8  # 2 freshness + 6
    prom.vector('requests_total{bundle="canary"', [])
    result, problem = analyze_interval(
        source_for(cfg, Baselines()),
        AnalysisWindow("uid", "ns", "stable", "canary", mark=("canary", 0, None)),
        cfg,
        step=0,
        time="t",
    )
    assert result.verdict == "Inconclusive" and "no series" in problem and "no series" in caplog.text
    # without analysis.prometheus the pods are scraped (none here: nothing to count, no query sent)
    seen = len(prom.seen)
    result, problem = analyze_interval(
        source_for(Analysis(min_samples=10), Baselines()),
        AnalysisWindow("uid", "ns", "stable", "canary", mark=("canary", 0, None)),
        Analysis(min_samples=10),
        step=0,
        time="t",
    )
    assert result.verdict == "Inconclusive" and len(prom.seen) == seen
    assert isinstance(source_for(Analysis(), Baselines()), PodScrape)
    assert isinstance(source_for(cfg, Baselines()), promql.Prometheus)


# --- analysis scoped to one adapter's traffic ----------------------------------------

ADAPTER_SELECTOR = 'namespace="{namespace}",adapter="tenant-b"'  # as the README documents it
_SERIES = re.compile(r"(modeldeploy_\w+)\{([^{}]*)\}")


def _selectors(promql_text: str) -> list[tuple[str, frozenset[tuple[str, str]]]]:
    """(metric, equality matchers) of every series selector in a query; any other matcher fails."""
    out = []
    for name, body in _SERIES.findall(promql_text):
        pairs = re.findall(r'(\w+)="([^"]*)"', body)
        assert ",".join(f'{k}="{v}"' for k, v in pairs) == body.rstrip(","), body  # equality only
        out.append((name, frozenset(pairs)))
    return out


def test_adapter_selector_scopes_every_series_of_every_query() -> None:
    """Each default query names its series twice (S - min_over_time(S[w])): both carry
    the adapter matcher, so no part of the figure can come from the base or another adapter."""
    src = PrometheusSource(address="http://p", selector=ADAPTER_SELECTOR)
    for bundle in ("bundle-stable", "bundle-canary"):
        qs = promql.queries(src, bundle, "team-a", "60s")
        assert set(qs) == {"ttft_buckets", "itl_buckets", "outcomes"}
        for key, text in qs.items():
            found = _selectors(text)
            assert len(found) == 2 == text.count("{"), (key, text)
            want = {("bundle", bundle), ("namespace", "team-a"), ("adapter", "tenant-b")}
            assert all(m == want for _, m in found), (key, text)
    unscoped = promql.queries(PrometheusSource(address="http://p"), "b", "team-a", "60s")
    assert all("adapter" not in dict(m) for t in unscoped.values() for _, m in _selectors(t))


# Per (bundle, adapter): (TTFT/ITL observations under 0.1 s, over 0.1 s, completed) over the window.
# The canary's tenant-b is slow; the base model's traffic, fast on both, outnumbers it 50:1.
TRAFFIC = {
    ("stable", ""): (1000, 0, 1000),
    ("stable", "tenant-a"): (40, 0, 40),
    ("stable", "tenant-b"): (20, 0, 20),
    ("canary", ""): (1000, 0, 1000),
    ("canary", "tenant-a"): (40, 0, 40),
    ("canary", "tenant-b"): (2, 18, 20),
}


def _series() -> dict[str, list[tuple[dict[str, str], float]]]:
    """What Prometheus holds as window increases: every runtime series, with its adapter label."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for (bundle, adapter), (fast, slow, done) in TRAFFIC.items():
        base = {"bundle": bundle, "namespace": "team-a", "adapter": adapter}
        for metric in (
            "modeldeploy_time_to_first_token_seconds_bucket",
            "modeldeploy_inter_token_latency_seconds_bucket",
        ):
            for le, v in (("0.1", fast), ("5.0", fast + slow), ("+Inf", fast + slow)):
                out.setdefault(metric, []).append(({**base, "le": le}, float(v)))
        for outcome, v in (("completed", done), ("error", 0)):
            out.setdefault("modeldeploy_requests_total", []).append(({**base, "outcome": outcome}, float(v)))
    return out


def _evaluate(series: dict[str, list[tuple[dict[str, str], float]]], q: str) -> tuple[int, bytes]:
    """The default queries' shape, `sum by (G) (...)` over one selector used throughout: sum the
    series whose labels include every matcher, by G (the increases are given, so the window is too)."""
    if q.startswith("max(timestamp("):  # the freshness query: every series was scraped just now
        assert len(set(_selectors(q))) == 1, q
        return 200, FakeProm.body([{"metric": {}, "value": [1700000000.0, "1700000000.0"]}])
    group = re.match(r"sum by \((\w+)\) ", q)
    selectors = set(_selectors(q))
    assert group and len(selectors) == 1, q  # one series set, as the unit test above shows
    ((metric, matchers),) = selectors
    sums: dict[str, float] = {}
    for labels, v in series[metric]:
        if matchers <= labels.items():
            sums[labels[group[1]]] = sums.get(labels[group[1]], 0.0) + v
    result = [{"metric": {group[1]: g}, "value": [1700000000.0, str(v)]} for g, v in sums.items()]
    return 200, FakeProm.body(result)


def test_with_the_adapter_selector_the_figures_are_that_adapters_alone(prom: FakeProm) -> None:
    series = _series()
    prom.answer = lambda q: _evaluate(series, q)
    scoped = PrometheusSource(address=prom.address, selector=ADAPTER_SELECTOR)
    stable, canary = promql.cohort_samples(scoped, "team-a", ("stable", "canary"), "60s", 1700000000.0)
    assert stable.outcomes == {"completed": 20.0, "error": 0.0} and stable.ttft.count == 20
    assert canary.outcomes == {"completed": 20.0, "error": 0.0}
    assert canary.ttft.buckets == ((0.1, 2.0), (5.0, 20.0), (math.inf, 20.0)) and canary.itl.count == 20
    # All adapters together (the default selector, and what the pod scrape sums): 1060 per cohort.
    everything = PrometheusSource(address=prom.address)
    s_all, c_all = promql.cohort_samples(everything, "team-a", ("stable", "canary"), "60s", 1700000000.0)
    assert s_all.ttft.count == c_all.ttft.count == 1060 and c_all.outcomes["completed"] == 1060
    # So the verdict is about tenant-b: its slow canary fails TTFT, hidden in the whole traffic.
    whole, problem = prometheus_analysis(
        _cfg(prom.address), "team-a", "stable", "canary", since=None, now=1700000000.0
    )
    assert problem == "" and whole.verdict == "Pass", whole
    only_b, problem = prometheus_analysis(
        _cfg(prom.address, selector=ADAPTER_SELECTOR),
        "team-a",
        "stable",
        "canary",
        since=None,
        now=1700000000.0,
    )
    by = {m.metric: m for m in only_b.metrics}
    assert problem == "" and only_b.verdict == "Fail" and by["ttft_p95_seconds"].verdict == "Fail"
    assert by["ttft_p95_seconds"].samples == 20
    assert all('adapter="tenant-b"' in p["query"][0] for p in prom.seen[-8:])  # freshness queries too


def test_queries_run_at_the_newest_scraped_instant_and_a_stale_prometheus_is_inconclusive(
    prom: FakeProm,
) -> None:
    """After a Prometheus outage its newest samples are old: the queries must run at that instant (a
    window Prometheus really holds), never at `now` through the lookback; a newest sample from before
    the step began is Inconclusive at once (bench/chaos.py's metrics-hold case)."""
    now = 1700000000.0
    prom.healthy("stable", 20, 0, 20)
    prom.healthy("canary", 20, 0, 20)
    prom.fresh("canary", at=now - 40)  # the canary's newest sample is 40 s old
    result, problem = prometheus_analysis(
        _cfg(prom.address), "ns", "stable", "canary", since=now - 60, now=now
    )
    assert problem == "" and result.verdict == "Pass"
    main = [p for p in prom.seen if not p["query"][0].startswith("max(timestamp(")]
    assert {p["time"][0] for p in main} == {f"{now - 40:.3f}"}  # the older of the two newest samples
    assert all("[20s]" in p["query"][0] for p in main)  # the window ends there: 60 - 40 s
    result, problem = prometheus_analysis(
        _cfg(prom.address), "ns", "stable", "canary", since=now - 30, now=now
    )
    assert result.verdict == "Inconclusive" and "40s old, from before the step began" in problem
