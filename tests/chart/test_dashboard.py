"""The Grafana dashboard: Grafana's schema, promtool, and a real Prometheus.

1. Schema: the JSON goes through the dashboard model of grafana-foundation-sdk (Grafana's own
   schema, generated into Python); a field that model does not know is dropped on the way, so
   the round trip losing nothing is the check. Plus the fields Grafana needs to draw a panel.
2. promtool parses every query (as recording rules of a generated rules file).
3. Every query runs against a real Prometheus scraping two real `modeldeploy serve` processes (a
   stable and a canary bundle, target labels as the chart's PodMonitor sets them) and the
   operator's per-object gauges (served by prometheus_client from this process, scraped with
   honor_labels as the chart's ServiceMonitor does), and returns series for both cohorts.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "modeldeploy-operator" / "dashboards" / "modeldeploy.json"
NS, MD = "team-a", "chat"
VARS = {"$namespace": NS, "$modeldeployment": MD, "$__rate_interval": "5m", "$ttft_slo": "0.5"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queries(d: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL with the dashboard variables substituted)."""
    out = []
    for p in (d or dashboard())["panels"]:
        for t in p["targets"]:
            expr = t["expr"]
            for k, v in VARS.items():
                expr = expr.replace(k, v)
            out.append((p["title"], t["refId"], expr))
    return out


# ---- 1. Grafana's schema ----------------------------------------------------------------------


def _lost(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths of `a` that `b` does not carry with the same value."""
    if isinstance(a, dict):
        if not isinstance(b, dict):
            return [path]
        return [
            q for k, v in a.items() for q in (_lost(v, b[k], f"{path}/{k}") if k in b else [f"{path}/{k}"])
        ]
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return [path]
        return [q for i, (x, y) in enumerate(zip(a, b, strict=True)) for q in _lost(x, y, f"{path}/{i}")]
    return [] if a == b else [path]


def roundtrip_loses(d: dict[str, Any]) -> list[str]:
    sdk = pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk (PyPI) not installed")
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    assert sdk is not None
    register_default_plugins()
    back = json.loads(json.dumps(Dashboard.from_json(d).to_json(), default=lambda o: o.to_json()))
    return _lost(d, back)


def test_dashboard_matches_grafanas_schema() -> None:
    d = dashboard()
    assert roundtrip_loses(d) == []
    bad = copy.deepcopy(d)
    bad["panels"][0]["gridPoss"] = bad["panels"][0].pop("gridPos")  # the check can fail
    assert roundtrip_loses(bad) == ["/panels/0/gridPoss"]


def test_dashboard_structure() -> None:
    d = dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "namespace", "modeldeployment", "ttft_slo"]
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids)
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in "hwxy") and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        assert p["type"] in ("timeseries", "stat", "table") and p["datasource"]["uid"] == "${datasource}"
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs) and all(t["expr"] for t in p["targets"])
    titles = " | ".join(p["title"] for p in d["panels"])
    for needed in (
        "phase",
        "weight",
        "first token",
        "Inter-token",
        "End-to-end",
        "Goodput",
        "outcome",
        "Queue",
        "KV cache",
        "Preemptions",
        "Load progress",
        "Quality gate",
    ):
        assert needed in titles, needed


# ---- 2. promtool parses every query -------------------------------------------------------------


def promtool_path() -> Path | None:
    try:
        from modeldeploy_dev.cluster.local import Binaries, cache_root, pinned_versions
    except ImportError:
        return None
    return Binaries(cache_root(), pinned_versions()).promtool


PROMTOOL = promtool_path()
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None or not PROMTOOL.exists(),
    reason=f"promtool not built ({PROMTOOL}): run `make cluster-build`",
)


def check_as_rules(tmp: Path, qs: list[tuple[str, str, str]]) -> subprocess.CompletedProcess[str]:
    rules = [{"record": f"dashboard:panel_{i}", "expr": q} for i, (_, _, q) in enumerate(qs)]
    path = tmp / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return subprocess.run(
        [str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


@needs_promtool
def test_promtool_parses_every_query(tmp_path: Path) -> None:
    qs = queries()
    r = check_as_rules(tmp_path, qs)
    assert r.returncode == 0 and f"SUCCESS: {len(qs)} rules found" in r.stdout, r.stdout + r.stderr
    r = check_as_rules(tmp_path, [("bad", "A", "sum by (cohort (modeldeploy_requests_total)")])
    assert r.returncode != 0  # the check can fail


# ---- 3. a real Prometheus answers every query for both cohorts -------------------------------


def _prometheus() -> Path | None:
    try:
        from modeldeploy_dev.prometheus import PROMETHEUS
    except ImportError:
        return None
    return PROMETHEUS


PROM_BIN = _prometheus()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, llama_dir: Path) -> Iterator[Any]:
    from prometheus_client import start_http_server
    from support.canary_server import Serve, _free_port

    from modeldeploy.operator.controller.object_metrics import ObjectMetrics
    from modeldeploy_dev.prometheus import Prom

    tmp = tmp_path_factory.mktemp("dashboard")
    stable = Serve(tmp, llama_dir, "--max-num-seqs", "4", bundle="bundle-dash-stable")
    canary = Serve(tmp, llama_dir, "--max-num-seqs", "2", bundle="bundle-dash-canary")
    op_port = _free_port()
    server, thread = start_http_server(op_port, addr="127.0.0.1")
    md = {"metadata": {"namespace": NS, "name": MD}, "spec": {}}
    status = {
        "phase": "Canary",
        "canaryWeight": 25,
        "stable": {"bundle": stable.bundle},
        "canary": {"bundle": canary.bundle},
        "conditions": [{"type": "Degraded", "status": "False", "reason": "AsExpected"}],
        "lastQuality": {
            "verdict": "Pass",
            "reason": "QualityPassed",
            "canary": canary.bundle,
            "metrics": [{"metric": "mean_logprob", "stable": -0.61, "canary": -0.62, "threshold": -0.71}],
        },
    }
    objects = ObjectMetrics()  # what the Controller keeps
    objects.record(md, status)
    pod = {"modeldeployment": MD}
    prom = Prom(
        tmp,
        {
            "stable": (stable.target, NS),
            "canary": (canary.target, NS),
            "operator": (f"127.0.0.1:{op_port}", "md-system"),
        },
        labels={"stable": pod | {"pod": "chat-stable-0"}, "canary": pod | {"pod": "chat-canary-0"}},
        honor_labels=("operator",),
    )
    try:
        stable.wait_ready()
        canary.wait_ready()
        prom.wait_ready()
        prom.scraped_after(time.time(), jobs=3)  # counters before the traffic are in, so rate() sees it
        for s in (stable, canary):
            for i in range(4):
                body = {"model": "tiny", "prompt": f"hello {i}", "max_tokens": 8, "stream": i % 2 == 0}
                assert httpx.post(s.url + "/v1/completions", json=body, timeout=120).status_code == 200
        prom.scraped_after(time.time(), jobs=3)
        time.sleep(2)  # a second scrape after the traffic, so rate() over it is non-zero
        prom.scraped_after(time.time(), jobs=3)
        yield prom
    finally:
        objects.forget(NS, MD)
        server.shutdown()
        for p in (prom, stable, canary):
            p.stop()


OPERATOR_ONLY = {"Rollout phase", "Canary weight", "Quality gate: last figures"}


@pytest.mark.slow
@pytest.mark.skipif(
    PROM_BIN is None or not PROM_BIN.exists(), reason=f"{PROM_BIN} not built: run `make cluster-build`"
)
def test_every_query_returns_series_for_both_cohorts(stack: Any) -> None:
    answered = {}
    for title, ref, q in queries():
        r = httpx.get(stack.url + "/api/v1/query", params={"query": q}, timeout=10).json()
        assert r["status"] == "success", (title, q, r)
        result = r["data"]["result"]
        assert result, f"{title} {ref}: no series for {q}"
        answered[(title, ref)] = result
        if title in OPERATOR_ONLY:
            continue
        cohorts = {s["metric"].get("cohort") for s in result}
        assert cohorts == {"stable", "canary"}, (title, ref, result)
        bundles = {s["metric"]["cohort"]: s["metric"]["bundle"] for s in result}
        assert bundles == {"stable": "bundle-dash-stable", "canary": "bundle-dash-canary"}
    [phase] = answered[("Rollout phase", "A")]
    assert phase["metric"] == {"phase": "Canary"}
    [weight] = answered[("Canary weight", "A")]
    assert float(weight["value"][1]) == 25.0
    quality = {
        s["metric"]["cohort"]: float(s["value"][1]) for s in answered[("Quality gate: last figures", "A")]
    }
    assert quality == {"stable": -0.61, "canary": -0.62, "threshold": -0.71}
    for title in ("Time to first token p50 / p95", "End-to-end latency p50 / p95"):
        for s in answered[(title, "B")]:
            assert re.fullmatch(r"[0-9.e+-]+", s["value"][1]) and float(s["value"][1]) > 0, (title, s)
    outcomes = {
        (s["metric"]["cohort"], s["metric"]["outcome"]) for s in answered[("Requests by outcome", "A")]
    }
    assert {("stable", "completed"), ("canary", "completed")} <= outcomes
