# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""Traffic by Gateway API weights, against the real Gateway API CRDs.

The CRDs come from the pinned sigs.k8s.io/gateway-api module (fetched through the Go module
proxy, like the control plane), so the API server validates every HTTPRoute the operator
writes with the upstream schema and CEL rules. There is no Gateway implementation in the
local cluster, so the test checks what a Gateway would be told: the weighted backendRefs
and the cohort-pinning rule at each phase, and how fast a failing analysis takes the
canary's weight to 0 (polled every 0.1 s next to the Events).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modeldeploy_dev import upstream_crds
from modeldeploy_dev.cluster.local import pinned_versions
from modeldeploy_dev.load import Load

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    Operator,
    condition,
    crd_installed,
    get_md,
    operator,
)
from .test_rollout import ANALYSIS, change_bundle, events, pod_ips, serve_tiny, stable_errors
from .watch import ROUTE, Watch, weights

CRDS = ("gatewayclasses", "gateways", "httproutes", "referencegrants")


@pytest.fixture
def gateway_api_crds(cluster: E2ECluster) -> Iterator[None]:
    if upstream_crds.go() is None:
        pytest.skip("Go is needed to fetch the pinned Gateway API module (see .ci/run)")
    version = pinned_versions()["GATEWAY_API_VERSION"]
    crd_dir = upstream_crds.module_dir("sigs.k8s.io/gateway-api", version) / "config" / "crd" / "standard"
    files = [a for c in CRDS for a in ("-f", str(crd_dir / f"gateway.networking.k8s.io_{c}.yaml"))]
    cluster.kubectl("apply", "--server-side", *files)
    names = [f"crd/{c}.gateway.networking.k8s.io" for c in CRDS]
    cluster.wait_established(*names)
    yield
    cluster.kubectl("delete", "--ignore-not-found", "--wait=false", *names)


def test_http_route_follows_the_rollout_and_a_failing_analysis_zeroes_the_canary(
    cluster: E2ECluster, namespace: str, gateway_api_crds: None, operator: Operator, tmp_path: Path
) -> None:
    ns, name = namespace, "gw"
    gw = {
        "gatewayAPI": {
            "parentRefs": [{"name": "inference", "sectionName": "http"}],
            "hostnames": ["llm.example.com"],
        }
    }
    _, old = serve_tiny(
        cluster,
        ns,
        tmp_path,
        name,
        trafficRouting=gw,
        analysis=ANALYSIS | {"maxTtftP95Ratio": 1.5, "minSamples": 10},
    )

    def route() -> dict[str, Any]:
        return cluster.custom.get_namespaced_custom_object(*ROUTE[:2], ns, ROUTE[2], name)

    r = cluster.wait(route, 30, "HTTPRoute written")
    assert weights(r) == {f"{name}-stable": 100} and len(r["spec"]["rules"]) == 1, r["spec"]
    assert (
        r["spec"]["hostnames"] == ["llm.example.com"]
        and r["metadata"]["ownerReferences"][0]["kind"] == "ModelDeployment"
    )
    old_ips = pod_ips(cluster, ns, old)
    with Load(cluster.api, ns, name, workers=8) as load, Watch(cluster.api, ns, name, route=True) as watch:
        change_bundle(cluster, ns, name, lambda b: b["config"].update(maxNumSeqs=1))
        split = cluster.wait(
            lambda: (lambda x: x if weights(x).get(f"{name}-canary") == 50 else None)(route()),
            240,
            "canary at 50% in the HTTPRoute",
        )
        pin = split["spec"]["rules"][0]
        assert pin["matches"][0]["headers"] == [
            {"type": "Exact", "name": "x-modeldeploy-cohort", "value": "canary"}
        ]
        assert [b["name"] for b in pin["backendRefs"]] == [f"{name}-canary"]
        done = cluster.wait(
            lambda: (lambda m: m if m["status"].get("failedBundles") else None)(get_md(cluster, ns, name)),
            300,
            "slow bundle rolled back",
        )
        cluster.wait(lambda: weights(route()) == {f"{name}-stable": 100}, 10, "route back to stable only")
        time.sleep(0.5)
    st = done["status"]
    assert st["stable"]["bundle"] == old and condition(done, "Degraded")["reason"] == "AnalysisFailed", st
    assert len(route()["spec"]["rules"]) == 1  # no pinning rule to a canary that is gone
    reasons = [r for r, _ in events(cluster, ns, name)]
    assert "ApplyFailed" not in reasons and "GatewayAPIUnavailable" not in reasons, reasons
    assert [w for _, w in watch.weights] == [0, 50, 0], watch.weights  # gate at 0, step at 50, rollback to 0
    failed_at, zero_at = watch.seen["AnalysisFailed"], watch.weights[-1][0]
    print(
        "gateway: AnalysisFailed Event seen -> canary weight 0 in the HTTPRoute seen: "
        f"{zero_at - failed_at:+.2f}s "
        f"(both polled every 0.1 s); load {load.by_ip()}"
    )
    assert not stable_errors(load, old_ips), (load.by_ip(), load.transport_errors)
