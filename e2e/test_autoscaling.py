# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""Autoscaling a ModelDeployment against the real API server.

- examples/autoscaling: the HPA and, with KEDA's CRD from its pinned module installed, the ScaledObject
  pass server-side validation with unknown fields refused (tests/examples/test_autoscaling_examples.py checks
  what they aim at).
- A real HPA (kube-controller-manager's controller) scales a ModelDeployment of the tiny model on the
  process node on `modeldeploy_requests_waiting` from its runtime pods, up under load and back down
  after it, through the CRD's scale subresource. The custom metrics API is the custom-metrics-apiserver
  library's sample adapter, registered with the aggregation layer; a relay in the test reads each pod's
  /metrics and writes the value to it, in place of Prometheus + prometheus-adapter (whose module the
  Go module proxy does not serve). See devtools/modeldeploy_dev/custom_metrics.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from modeldeploy.conformance.measures import WAITING
from modeldeploy_dev.custom_metrics import ADAPTER, WRITE_PORT, Adapter, Relay, port_free
from modeldeploy_dev.load import Load

from .conftest import E2ECluster
from .test_operator import G, Operator, P, V, crd_installed, get_md, operator  # noqa: F401  (fixtures)
from .test_rollout import serve_tiny

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples" / "autoscaling"


def dry_run(cluster: E2ECluster, ns: str, path: Path) -> str:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for d in docs:
        d["metadata"]["namespace"] = ns
    r = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-n",
        ns,
        "-f",
        "-",
        input=yaml.safe_dump_all(docs),
        check=False,
    )
    assert r.returncode == 0, f"{path.name}: {r.stdout}\n{r.stderr}"
    return r.stdout


def test_hpa_example_passes_the_api_server(cluster: E2ECluster, namespace: str, crd_installed: None) -> None:
    out = dry_run(cluster, namespace, EX / "hpa-requests-waiting.yaml")
    assert "horizontalpodautoscaler.autoscaling/tiny created (server dry run)" in out, out


def test_keda_scaled_object_example_passes_the_api_server_with_kedas_crd(
    cluster: E2ECluster, namespace: str, crd_installed: None
) -> None:
    upstream = pytest.importorskip("modeldeploy_dev.upstream_crds")
    if upstream.go() is None:
        pytest.skip("Go is needed to read the pinned KEDA CRDs (see .ci/run)")
    crd = upstream.keda_scaledobject_crd_file()
    name = yaml.safe_load(crd.read_text())["metadata"]["name"]
    cluster.kubectl("apply", "--server-side", "-f", str(crd))
    try:
        cluster.wait_established(name)
        out = dry_run(cluster, namespace, EX / "keda-scaledobject.yaml")
        assert "scaledobject.keda.sh/tiny created (server dry run)" in out, out
        # the check can fail: the API server refuses a misspelt field
        bad = yaml.safe_load((EX / "keda-scaledobject.yaml").read_text())
        bad["metadata"]["namespace"] = namespace
        bad["spec"]["maxReplicas"] = bad["spec"].pop("maxReplicaCount")
        r = cluster.kubectl(
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
            input=yaml.safe_dump(bad),
            check=False,
        )
        assert r.returncode != 0 and "maxReplicas" in r.stderr, (r.stdout, r.stderr)
    finally:
        cluster.kubectl("delete", f"crd/{name}", "--wait=false", check=False)


def test_hpa_scales_a_model_deployment_on_its_runtime_queue_depth_and_back(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    if not ADAPTER.exists():
        pytest.skip(f"{ADAPTER} not built: run `make cluster-build`")
    if not port_free(WRITE_PORT):
        pytest.skip(f"port {WRITE_PORT} (the sample adapter's fixed write port) is in use on this machine")
    ns, name = namespace, "auto"
    # one running slot and no wait budget: load queues up in the pod instead of being refused
    serve_tiny(cluster, ns, tmp_path, name, config={"maxNumSeqs": 1, "queueBudgetSeconds": 0})
    adapter = Adapter(cluster.api, cluster.kubeconfig, tmp_path)
    try:
        adapter.start()
        hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name},
            "spec": {
                "scaleTargetRef": {"apiVersion": f"{G}/{V}", "kind": "ModelDeployment", "name": name},
                "minReplicas": 1,
                "maxReplicas": 2,
                "metrics": [
                    {
                        "type": "Pods",
                        "pods": {
                            "metric": {"name": WAITING},
                            "target": {"type": "AverageValue", "averageValue": "2"},
                        },
                    }
                ],
                "behavior": {
                    "scaleUp": {"stabilizationWindowSeconds": 0},
                    "scaleDown": {"stabilizationWindowSeconds": 0},
                },
            },
        }
        client_v2 = client.AutoscalingV2Api(cluster.api)
        client_v2.create_namespaced_horizontal_pod_autoscaler(ns, hpa)
        sel = f"app.kubernetes.io/instance={name}"
        with Relay(cluster.api, ns, sel, WAITING) as relay:
            with Load(cluster.api, ns, name, workers=8, max_seconds=300) as load:
                t0 = time.monotonic()
                up = cluster.wait(
                    lambda: (lambda m: m if m["spec"]["replicas"] == 2 else None)(get_md(cluster, ns, name)),
                    180,
                    "the HPA to scale the ModelDeployment to 2",
                )
                scaled_up = time.monotonic() - t0
                done = cluster.wait(
                    lambda: (
                        lambda m: m if (m["status"].get("stable") or {}).get("readyReplicas") == 2 else None
                    )(get_md(cluster, ns, name)),
                    240,
                    "2 Ready replicas",
                )
            t1 = time.monotonic()
            down = cluster.wait(
                lambda: (lambda m: m if m["spec"]["replicas"] == 1 else None)(get_md(cluster, ns, name)),
                180,
                "the HPA to scale back to 1 once the queue is empty",
            )
            scaled_down = time.monotonic() - t1
        peak = max((v for _, _, v in relay.seen), default=0.0)
        status = client_v2.read_namespaced_horizontal_pod_autoscaler(name, ns).status
        print(
            f"[timing] HPA: load -> spec.replicas 2 in {scaled_up:.1f}s, "
            f"load stopped -> 1 in {scaled_down:.1f}s; "
            f"{WAITING} peak {peak:g} per pod; relay errors {relay.errors[:3]}; load {load.by_ip()}"
        )
        assert peak > 2, relay.seen
        assert up["status"]["replicas"] in (1, 2) and done["status"]["phase"] == "Stable", done["status"]
        assert down["status"]["phase"] in ("Stable", "Deploying"), down["status"]
        rescales = [
            e.message
            for e in cluster.core.list_namespaced_event(ns).items
            if e.involved_object.kind == "HorizontalPodAutoscaler" and e.reason == "SuccessfulRescale"
        ]
        print("HPA rescales:", rescales)
        assert any(m.startswith("New size: 2") and f"{WAITING} above target" in m for m in rescales), rescales
        assert any(m.startswith("New size: 1") and "below target" in m for m in rescales), rescales
        assert status.current_metrics and status.current_metrics[0].pods.metric.name == WAITING, status
        cluster.wait(
            lambda: (
                len(
                    [
                        p
                        for p in cluster.core.list_namespaced_pod(ns, label_selector=sel).items
                        if p.metadata.deletion_timestamp is None
                    ]
                )
                == 1
            ),
            120,
            "one pod left",
        )
    finally:
        adapter.close()
