# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""The Grafana dashboard's queries during a real canary, through a real Prometheus.

Prometheus scrapes what the chart's monitors would: the ModelDeployment's pods on the process
node (file-discovered, one target group per pod labelled `namespace`, `pod`, `modeldeployment`,
as the PodMonitor's relabeling does) and the operator's /metrics with honor_labels (as the
ServiceMonitor does). A good bundle change holds in its Canary step (long pause) under
closed-loop load; every query of dashboards/modeldeploy.json must then return series for both
cohorts, each labelled with the bundle the operator reports for it.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT
from modeldeploy_dev.load import Load
from modeldeploy_dev.prometheus import PROMETHEUS, Prom

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    Operator,
    crd_installed,
    get_md,
    operator,
)
from .test_rollout import change_bundle, serve_tiny, wait_phase

pytestmark = pytest.mark.skipif(
    not PROMETHEUS.exists(), reason=f"{PROMETHEUS} not built: run `make cluster-build`"
)
DASHBOARD = (
    Path(__file__).resolve().parents[1]
    / "charts"
    / "modeldeploy-operator"
    / "dashboards"
    / "modeldeploy.json"
)
OPERATOR_ONLY = {"Rollout phase", "Canary weight"}
# Panels with series only once a quality gate ran: this canary has none (the panel's queries are
# checked against a real Prometheus with gate figures in tests/chart/test_dashboard.py); here they must
# only be valid PromQL.
GATE_ONLY = {"Quality gate: last figures"}


def queries(ns: str, name: str) -> list[tuple[str, str, str]]:
    subs = {"$namespace": ns, "$modeldeployment": name, "$__rate_interval": "1m", "$ttft_slo": "0.5"}
    out = []
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        for t in p["targets"]:
            q = t["expr"]
            for k, v in subs.items():
                q = q.replace(k, v)
            out.append((p["title"], t["refId"], q))
    return out


class PodMonitorTargets:
    """The target file a PodMonitor would amount to: the object's pods, relabeled, twice a second."""

    def __init__(self, cluster: E2ECluster, ns: str, name: str, path: Path) -> None:
        self.cluster, self.ns, self.name, self.path = cluster, ns, name, path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._write([])

    def _write(self, pods: list[Any]) -> None:
        groups = [
            {
                "targets": [f"{p.status.pod_ip}:{PORT}"],
                "labels": {"namespace": self.ns, "pod": p.metadata.name, "modeldeployment": self.name},
            }
            for p in pods
            if p.status.pod_ip
        ]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.path)

    def _run(self) -> None:
        for _ in range(2400):  # at most 20 minutes
            if self._stop.is_set():
                return
            sel = f"app.kubernetes.io/instance={self.name}"
            self._write(self.cluster.core.list_namespaced_pod(self.ns, label_selector=sel).items)
            self._stop.wait(0.5)

    def __enter__(self) -> PodMonitorTargets:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def answers(prom: Prom, ns: str, name: str, cohorts: dict[str, str]) -> dict[tuple[str, str], list] | None:
    """Every query's result when each has both cohorts (with the operator's bundle ids); else None."""
    out = {}
    for title, ref, q in queries(ns, name):
        r = httpx.get(prom.url + "/api/v1/query", params={"query": q}, timeout=10).json()
        assert r["status"] == "success", (title, q, r)
        result = r["data"]["result"]
        if title in GATE_ONLY:
            continue
        if not result:
            return None
        if title not in OPERATOR_ONLY:
            got = {s["metric"]["cohort"]: s["metric"]["bundle"] for s in result}
            if got != cohorts:
                return None
        out[(title, ref)] = result
    if [s["metric"]["phase"] for s in out[("Rollout phase", "A")]] != ["Canary"]:
        return None  # Prometheus has not scraped the operator since the phase changed
    return out


def test_every_dashboard_query_returns_both_cohorts_during_a_canary(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    ns, name = namespace, "dash"
    targets = tmp_path / "targets.json"
    with PodMonitorTargets(cluster, ns, name, targets):
        prom = Prom(
            tmp_path,
            {"operator": (f"127.0.0.1:{operator.metrics_port}", "modeldeploy-system")},
            file_sd=targets,
            honor_labels=("operator",),
        )
        try:
            prom.wait_ready()
            _, old = serve_tiny(cluster, ns, tmp_path, name, steps=[{"weight": 50, "pauseSeconds": 900}])
            with Load(cluster.api, ns, name, workers=4):
                change_bundle(cluster, ns, name, lambda b: b["config"].update(maxNumSeqs=6))
                md = wait_phase(cluster, ns, name, ("Canary",), 300)
                cohorts = {"stable": old, "canary": md["status"]["canary"]["bundle"]}
                got = cluster.wait(
                    lambda: answers(prom, ns, name, cohorts), 180, "every query with both cohorts"
                )
        finally:
            prom.stop()
    [phase] = got[("Rollout phase", "A")]
    assert phase["metric"]["phase"] == "Canary"
    [weight] = got[("Canary weight", "A")]
    assert float(weight["value"][1]) == 50.0
    outcomes = {(s["metric"]["cohort"], s["metric"]["outcome"]) for s in got[("Requests by outcome", "A")]}
    assert {("stable", "completed"), ("canary", "completed")} <= outcomes
    print(f"dashboard: {len(got)} queries answered for both cohorts {cohorts}")
