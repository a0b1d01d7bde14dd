"""Operator core against the real API server: CEL rejections, a tiny model served through a
ModelDeployment, Unschedulable, restart safety, drift, deletion GC.

The operator runs as a subprocess (`modeldeploy operator --namespace NS --standalone`) against
the test cluster's kubeconfig, exactly as a user would run it outside the cluster.
"""

from __future__ import annotations

import copy
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from modeldeploy.operator.api import crd
from modeldeploy_dev.operator_process import OperatorProcess
from modeldeploy_dev.rollout_scenario import (  # noqa: F401  (re-exported to the other e2e modules)
    FAKE_DIGEST,
    IMAGE,
    G,
    P,
    V,
    condition,
    create,
    get_md,
    manifest,
    tiny_model_pv,
)

from .conftest import E2ECluster

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def crd_installed(cluster: E2ECluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / crd.CRD_PATH))
    cluster.wait_established(f"{P}.{G}")
    # refresh kubectl's discovery cache so the short name `md` resolves
    cluster.wait(
        lambda: "md" in cluster.kubectl("api-resources", f"--api-group={G}").stdout.split(),
        30,
        "md in discovery",
    )


class Operator(OperatorProcess):
    """`modeldeploy operator` as a child process; restartable, logs kept for failure dumps."""

    def __init__(self, cluster: E2ECluster, namespace: str, log: Path) -> None:
        super().__init__(cluster.kubeconfig, namespace, log)
        self.cluster = cluster

    def get(self, path: str, port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.read().decode()


@pytest.fixture
def operator(
    cluster: E2ECluster, namespace: str, crd_installed: None, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Operator]:
    op = Operator(cluster, namespace, tmp_path / "operator.log")
    op.start()
    yield op
    op.kill(signal.SIGTERM)
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.failed:
        print("--- operator log (tail)\n" + "\n".join(op.log.read_text(errors="replace").splitlines()[-80:]))


def owned(cluster: E2ECluster, ns: str, name: str) -> tuple[list[str], list[str]]:
    sel = f"app.kubernetes.io/instance={name}"
    deps = [d.metadata.name for d in cluster.apps.list_namespaced_deployment(ns, label_selector=sel).items]
    svcs = [s.metadata.name for s in cluster.core.list_namespaced_service(ns, label_selector=sel).items]
    return sorted(deps), sorted(svcs)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["bundle"]["engine"].update(image="registry.local/runtime:latest"), "pinned by digest"),
        (lambda s: s["topology"].update(gpusPerReplica=4, tensorParallel=3), "tensorParallel must divide"),
        (lambda s: s["bundle"]["model"].update(digest="sha256:1234"), "64 lowercase hex"),
        (lambda s: s["bundle"]["tokenizer"].update(digest="sha256:" + "G" * 64), "64 lowercase hex"),
        (lambda s: s.update(rollout={"steps": [{"weight": 50}, {"weight": 20}]}), "strictly increasing"),
    ],
    ids=["tag-only-image", "tp-not-dividing", "bad-model-digest", "bad-tokenizer-digest", "steps-decreasing"],
)
def test_api_server_rejects_invalid_with_cel_message(
    cluster: E2ECluster, namespace: str, crd_installed: None, edit, message: str
) -> None:
    obj = manifest("bad")
    edit(obj["spec"])
    with pytest.raises(ApiException) as e:
        create(cluster, namespace, obj)
    assert e.value.status == 422 and message in e.value.body, e.value.body


def test_api_server_applies_defaults_and_examples_validate(
    cluster: E2ECluster, namespace: str, crd_installed: None
) -> None:
    out = create(cluster, namespace, manifest("defaults"))
    assert out["spec"]["topology"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert (
        out["spec"]["rollout"]["steps"][0]["weight"] == 10
        and out["spec"]["bundle"]["config"]["maxQueue"] == 64
    )
    for path in sorted((ROOT / "examples").glob("modeldeployment-*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]  # a ConfigMap may come along
        assert [d["kind"] for d in docs].count("ModelDeployment") == 1, path
        for doc in docs:
            doc["metadata"]["namespace"] = namespace
            if doc["kind"] == "ConfigMap":
                cluster.core.create_namespaced_config_map(namespace, doc, dry_run="All")
            else:
                cluster.custom.create_namespaced_custom_object(G, V, namespace, P, doc, dry_run="All")
    explain = cluster.kubectl("explain", "md.spec.bundle.engine.image").stdout
    assert "pinned by digest" in explain


def test_tiny_model_served_in_restricted_namespace(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    if cluster.process_node is None:
        pytest.skip("external $KUBECONFIG cluster: no process node")
    digest = tiny_model_pv(cluster, namespace, tmp_path)
    try:
        spec = manifest("tiny")["spec"]
        spec["bundle"]["model"] = {"uri": "pvc://models/tiny-llama", "revision": "seed0", "digest": digest}
        spec["bundle"]["tokenizer"] = {"revision": "seed0", "digest": digest}
        spec["topology"]["nodeSelector"] = {"modeldeploy.dev/node-kind": "process"}
        spec["readiness"] = {"loadTimeoutSeconds": 180}
        created = create(cluster, namespace, manifest("tiny", **spec))
        seen_progressing = cluster.wait(
            lambda: condition(get_md(cluster, namespace, "tiny"), "Progressing").get("status") == "True",
            60,
            "Progressing=True",
        )
        assert seen_progressing
        md = cluster.wait(
            lambda: (lambda m: m if condition(m, "Ready").get("status") == "True" else None)(
                get_md(cluster, namespace, "tiny")
            ),
            300,
            "Ready=True",
        )
        st = md["status"]
        assert st["observedGeneration"] == created["metadata"]["generation"] and st["phase"] == "Stable"
        assert (
            condition(md, "Progressing")["status"] == "False"
            and condition(md, "Degraded")["status"] == "False"
        )
        bid = st["stable"]["bundle"]
        assert st["stable"]["readyReplicas"] == 1 and st["stable"]["loadProgress"] == 1.0
        deps, svcs = owned(cluster, namespace, "tiny")
        assert deps == [f"tiny-{bid[:10]}"] and svcs == ["tiny"]  # -stable, -canary: with the first canary
        pods = cluster.core.list_namespaced_pod(
            namespace, label_selector=f"modeldeploy.dev/bundle={bid}"
        ).items
        assert (
            len(pods) == 1 and pods[0].spec.node_name == cluster.process_node
        )  # admitted under `restricted`
        disc = client.DiscoveryV1Api(cluster.api)
        eps = cluster.wait(
            lambda: [
                e
                for sl in disc.list_namespaced_endpoint_slice(
                    namespace, label_selector="kubernetes.io/service-name=tiny"
                ).items
                for e in sl.endpoints or []
            ],
            30,
            "tiny endpoints",
        )
        assert eps[0].addresses == [pods[0].status.pod_ip]
        table = cluster.kubectl("get", "md", "-n", namespace).stdout
        assert table.split()[:7] == ["NAME", "PHASE", "STABLE", "CANARY", "WEIGHT", "READY", "AGE"], table
        assert "Stable" in table and bid in table
        events = [
            e.reason
            for e in cluster.core.list_namespaced_event(namespace).items
            if e.involved_object.name == "tiny"
        ]
        assert "Created" in events
        metrics = operator.get("/metrics", operator.metrics_port)
        assert (
            "modeldeploy_operator_reconciles_total" in metrics
            and "modeldeploy_operator_decisions_total" in metrics
        )
        asked = {  # what asked for reconciles: the create, then the Deployment turning Ready
            src: float(n)
            for src, n in re.findall(
                r'^modeldeploy_operator_reconcile_requests_total\{outcome="run",source="(\w+)"\} (\S+)$',
                metrics,
                re.M,
            )
        }
        assert asked.get("modeldeployment", 0) >= 1 and asked.get("child", 0) >= 1, asked
        assert operator.get("/healthz", operator.health_port)
    finally:
        cluster.core.delete_persistent_volume(f"{namespace}-models")


def test_impossible_gpu_type_is_degraded_unschedulable(
    cluster: E2ECluster, namespace: str, operator: Operator
) -> None:
    spec = manifest("nogpu")["spec"]
    spec["topology"] = {"gpusPerReplica": 1, "gpuType": "NVIDIA-B300"}
    create(cluster, namespace, manifest("nogpu", **spec))
    md = cluster.wait(
        lambda: (lambda m: m if condition(m, "Degraded").get("status") == "True" else None)(
            get_md(cluster, namespace, "nogpu")
        ),
        60,
        "Degraded=True",
    )
    deg = condition(md, "Degraded")
    assert deg["reason"] == "Unschedulable" and "nvidia.com/gpu.product=NVIDIA-B300" in deg["message"]
    assert md["status"]["phase"] == "Degraded"
    assert owned(cluster, namespace, "nogpu")[0] == []  # no pods left Pending silently
    warnings = [e for e in cluster.core.list_namespaced_event(namespace).items if e.reason == "Unschedulable"]
    assert warnings and warnings[0].type == "Warning"


def _ready(cluster: E2ECluster, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    return cluster.wait(
        lambda: (lambda m: m if m.get("status", {}).get("phase") == "Stable" else None)(
            get_md(cluster, ns, name)
        ),
        timeout,
        f"{name} Stable",
    )


def test_restart_mid_reconcile_no_duplicates_drift_and_gc(
    cluster: E2ECluster, namespace: str, operator: Operator
) -> None:
    create(cluster, namespace, manifest("web", replicas=2))
    cluster.wait(lambda: owned(cluster, namespace, "web")[0], 60, "first child Deployment")
    operator.kill()  # mid-reconcile: children partly created, status maybe unwritten
    operator.start()
    md = _ready(cluster, namespace, "web")
    deps, svcs = owned(cluster, namespace, "web")
    assert deps == [f"web-{md['status']['stable']['bundle'][:10]}"] and svcs == ["web"]
    operator.kill()
    operator.start()
    _ready(cluster, namespace, "web")
    assert owned(cluster, namespace, "web") == (deps, svcs)  # a second restart changes nothing

    # drift: someone edits the child Deployment -> reverted
    dep = cluster.apps.read_namespaced_deployment(deps[0], namespace)
    cluster.apps.patch_namespaced_deployment(
        deps[0],
        namespace,
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [{"name": "serve", "image": "registry.local/evil@sha256:" + "e" * 64}]
                    }
                }
            }
        },
        _content_type="application/strategic-merge-patch+json",
    )
    cluster.wait(
        lambda: (
            cluster.apps.read_namespaced_deployment(deps[0], namespace).spec.template.spec.containers[0].image
            == IMAGE
        ),
        60,
        "image drift reverted",
    )
    assert dep.metadata.owner_references[0].kind == "ModelDeployment"

    # a bundle change goes through the rollout: these kwok pods serve nothing, so no gate and no
    # analysis can pass; the canary is promoted by hand (modeldeploy.dev/promote), then the prior
    # bundle stays warm for keepPrevious.seconds (0 here: deleted at once)
    spec = copy.deepcopy(md["spec"])
    spec["bundle"]["config"]["maxNumSeqs"] = 2
    spec["rollout"] = {
        "conformanceGate": False,
        "steps": [{"weight": 50, "pauseSeconds": 0}],
        "keepPrevious": {"replicas": 0, "seconds": 0},
    }
    cluster.custom.patch_namespaced_custom_object(G, V, namespace, P, "web", {"spec": spec})
    cluster.wait(
        lambda: get_md(cluster, namespace, "web")["status"].get("phase") == "Canary", 120, "canary step"
    )
    cluster.custom.patch_namespaced_custom_object(
        G, V, namespace, P, "web", {"metadata": {"annotations": {"modeldeploy.dev/promote": "e2e"}}}
    )
    new = cluster.wait(
        lambda: (
            lambda m: (
                m
                if m["status"].get("observedGeneration") == m["metadata"]["generation"]
                and m["status"]["phase"] == "Stable"
                else None
            )
        )(get_md(cluster, namespace, "web")),
        120,
        "new bundle promoted",
    )
    assert new["status"]["stable"]["bundle"] != md["status"]["stable"]["bundle"]
    assert new["status"]["history"][-1]["bundle"] == md["status"]["stable"]["bundle"]
    cluster.wait(
        lambda: owned(cluster, namespace, "web")[0] == [f"web-{new['status']['stable']['bundle'][:10]}"],
        60,
        "old bundle Deployment deleted",
    )

    # deletion: the garbage collector removes every child through ownerReferences
    cluster.custom.delete_namespaced_custom_object(G, V, namespace, P, "web")
    cluster.wait(lambda: owned(cluster, namespace, "web") == ([], []), 90, "children garbage-collected")


def test_wrong_model_digest_is_degraded_load_failed(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    if cluster.process_node is None:
        pytest.skip("external $KUBECONFIG cluster: no process node")
    tiny_model_pv(cluster, namespace, tmp_path)
    try:
        wrong = "sha256:" + "0" * 64
        spec = manifest("broken")["spec"]
        spec["bundle"]["model"] = {"uri": "pvc://models/tiny-llama", "revision": "seed0", "digest": wrong}
        spec["bundle"]["tokenizer"] = {"revision": "seed0", "digest": wrong}
        spec["topology"]["nodeSelector"] = {"modeldeploy.dev/node-kind": "process"}
        create(cluster, namespace, manifest("broken", **spec))
        md = cluster.wait(
            lambda: (lambda m: m if condition(m, "Degraded").get("reason") == "LoadFailed" else None)(
                get_md(cluster, namespace, "broken")
            ),
            180,
            "Degraded/LoadFailed",
        )
        deg = condition(md, "Degraded")
        assert deg["status"] == "True" and "DigestMismatch" in deg["message"] and wrong in deg["message"]
        assert md["status"]["phase"] == "Degraded" and condition(md, "Ready")["status"] == "False"
    finally:
        cluster.core.delete_persistent_volume(f"{namespace}-models")
