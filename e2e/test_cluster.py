"""The local control plane is real: scheduling onto simulated GPU nodes, taints, Pod Security."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from modeldeploy_dev.cluster.nodes import NODE_KIND

from .conftest import E2ECluster, restricted_security_context

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def gpu_deployment(name: str, tolerate: bool) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "nodeSelector": {NODE_KIND: "kwok", "nvidia.com/gpu.product": "NVIDIA-H200"},
        "containers": [
            {
                "name": "engine",
                "image": "registry.invalid/modeldeploy-runtime@sha256:" + "0" * 64,
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "securityContext": restricted_security_context(),
            }
        ],
    }
    if tolerate:
        pod_spec["tolerations"] = [GPU_TOLERATION]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
        },
    }


def test_gpu_deployment_schedules_on_kwok_gpu_node_and_becomes_ready(
    cluster: E2ECluster, namespace: str
) -> None:
    cluster.apps.create_namespaced_deployment(namespace, gpu_deployment("gpu-ok", tolerate=True))

    def available() -> Any:
        d = cluster.apps.read_namespaced_deployment("gpu-ok", namespace)
        return d if (d.status.available_replicas or 0) == 2 else None

    cluster.wait(available, 90, "Deployment gpu-ok to have 2 available replicas")
    pods = cluster.core.list_namespaced_pod(namespace, label_selector="app=gpu-ok").items
    assert len(pods) == 2
    for p in pods:
        node = cluster.core.read_node(p.spec.node_name)
        assert node.metadata.labels[NODE_KIND] == "kwok"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert {c.type: c.status for c in p.status.conditions}["Ready"] == "True"
        assert p.status.phase == "Running"


def test_gpu_pod_without_toleration_stays_pending_with_scheduler_reason(
    cluster: E2ECluster, namespace: str
) -> None:
    cluster.apps.create_namespaced_deployment(namespace, gpu_deployment("gpu-untolerated", tolerate=False))

    def unschedulable() -> Any:
        for p in cluster.core.list_namespaced_pod(namespace, label_selector="app=gpu-untolerated").items:
            for c in p.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                    return p, c
        return None

    pod, cond = cluster.wait(unschedulable, 60, "the scheduler to report Unschedulable")
    assert pod.spec.node_name is None and pod.status.phase == "Pending"
    # the scheduler's reason names the failing filter; the only taint the GPU nodes carry is the GPU one
    assert "untolerated taint" in cond.message, cond.message
    gpu_nodes = cluster.core.list_node(label_selector="nvidia.com/gpu.product=NVIDIA-H200").items
    assert gpu_nodes and all({t.key for t in n.spec.taints} == {"nvidia.com/gpu"} for n in gpu_nodes)
    events = cluster.wait(
        lambda: [
            e
            for e in cluster.core.list_namespaced_event(namespace).items
            if e.reason == "FailedScheduling" and e.involved_object.name == pod.metadata.name
        ],
        30,
        "a FailedScheduling event",
    )
    assert "untolerated taint" in events[0].message


def test_privileged_pod_is_rejected_by_pod_security_admission(cluster: E2ECluster, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "priv"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/x@sha256:" + "1" * 64,
                    "securityContext": {"privileged": True},
                }
            ]
        },
    }
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_pod(namespace, pod)
    assert err.value.status == 403
    message = json.loads(err.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message and "privileged" in message, message
    # the same pod made restricted-compliant is admitted: the rejection was the policy, not the request
    pod["spec"]["containers"][0]["securityContext"] = restricted_security_context()
    cluster.core.create_namespaced_pod(namespace, pod)


def test_helm_talks_to_the_cluster(cluster: E2ECluster, namespace: str) -> None:
    r = cluster.helm("list", "--namespace", namespace, "--output", "json")
    assert r.stdout.strip() == "[]"
    assert cluster.helm("version", "--short").stdout.startswith("v3.")
