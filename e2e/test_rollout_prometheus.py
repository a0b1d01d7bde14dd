# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""Canary analysis through a real Prometheus, end to end (the optional analysis source).

Prometheus scrapes the ModelDeployment's pods on the process node every second; the test keeps
its file-discovered target list equal to the pods of the object (what kubernetes_sd would do).
The ModelDeployment names Prometheus in `spec.rollout.analysis.prometheus`, so the operator asks
Prometheus, not the pods, and must still catch the slow canary and roll it back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modeldeploy_dev.load import Load
from modeldeploy_dev.prometheus import PROMETHEUS, PodTargets, Prom

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    Operator,
    condition,
    crd_installed,
    get_md,
    operator,
)
from .test_rollout import ANALYSIS, change_bundle, events, pod_ips, serve_tiny, stable_errors

pytestmark = pytest.mark.skipif(
    not PROMETHEUS.exists(), reason=f"{PROMETHEUS} not built: run `make cluster-build`"
)


def test_slow_canary_caught_through_prometheus(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    ns, name = namespace, "prom"
    targets = tmp_path / "targets.json"
    with PodTargets(cluster, ns, name, targets):
        prom = Prom(tmp_path, {}, file_sd=targets)
        try:
            prom.wait_ready()
            analysis = ANALYSIS | {
                "maxTtftP95Ratio": 1.5,
                "minSamples": 10,
                "prometheus": {"address": prom.url},
            }
            _, old = serve_tiny(cluster, ns, tmp_path, name, analysis=analysis)
            old_ips = pod_ips(cluster, ns, old)
            asked = prom.queries_served()
            with Load(cluster.api, ns, name, workers=8) as load:
                change_bundle(cluster, ns, name, lambda b: b["config"].update(maxNumSeqs=1))
                done = cluster.wait(
                    lambda: (lambda m: m if m["status"].get("failedBundles") else None)(
                        get_md(cluster, ns, name)
                    ),
                    300,
                    "slow bundle rolled back",
                )
            served = prom.queries_served() - asked
        finally:
            prom.stop()
    st = done["status"]
    assert st["stable"]["bundle"] == old and condition(done, "Degraded")["reason"] == "AnalysisFailed", st
    ttft = next(m for m in st["lastAnalysis"]["metrics"] if m["metric"] == "ttft_p95_seconds")
    assert ttft["verdict"] == "Fail" and ttft["samples"] >= 10 and ttft["canary"] > ttft["threshold"], ttft
    analyses = [m for r, m in events(cluster, ns, name) if r == "Analysis"]
    print(f"prometheus answered {served:.0f} queries; analyses: {analyses}; load {load.by_ip()}")
    assert (
        served >= 6 and analyses and "ttft_p95_seconds Fail" in analyses[-1]
    )  # 3 queries per cohort per analysis
    assert not stable_errors(load, old_ips), (load.by_ip(), load.transport_errors)
