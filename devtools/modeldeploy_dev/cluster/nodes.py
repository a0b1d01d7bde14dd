"""Node objects of the local cluster: simulated GPU nodes (kwok) and the process node.

Both kinds carry the labels, capacity and taint of a real 8-GPU H200 node, so scheduling of GPU
pods is exercised for real; `modeldeploy.dev/node-kind` tells them apart (kwok | process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.wait import wait_until

if TYPE_CHECKING:
    from modeldeploy_dev.cluster.local import Settings

GPU_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-H200",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.present": "true",
}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODE_KIND = "modeldeploy.dev/node-kind"
CAPACITY = {"cpu": "64", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "1Ti"}


def gpu_node(name: str, kind: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": kind,
                NODE_KIND: kind,
                **GPU_LABELS,
            },
        },
        "spec": {"taints": [GPU_TAINT]},
        "status": {"capacity": CAPACITY, "allocatable": CAPACITY},
    }


def kwok_node(name: str) -> dict[str, Any]:
    """kwok manages nodes carrying this annotation (kwokctl's default selector)."""
    return gpu_node(name, "kwok", {"kwok.x-k8s.io/node": "fake"})


def api(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config(config_file=kubeconfig)


def apply_nodes(kubeconfig: str, s: Settings) -> None:
    """Create the kwok GPU nodes that do not exist yet (the process node registers itself)."""
    core = client.CoreV1Api(api(kubeconfig))
    for i in range(s.gpu_nodes):
        body = kwok_node(f"gpu-{i}")
        try:
            core.create_node(K.body(body))
        except ApiException as e:
            if e.status != 409:
                raise


def node_ready(node: client.V1Node) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (K.node_status(node).conditions or []))


def wait_ready(kubeconfig: str, s: Settings, timeout: float) -> None:
    """Wait until all expected nodes are Ready and the default ServiceAccount exists (pods need it)."""
    c = api(kubeconfig)
    core = client.CoreV1Api(c)
    want = {f"gpu-{i}" for i in range(s.gpu_nodes)} | ({s.process_node} if s.process_node else set())

    def ready() -> bool:
        nodes = {K.name(n): n for n in core.list_node().items}
        missing = sorted(n for n in want if n not in nodes or not node_ready(nodes[n]))
        sa = core.list_namespaced_service_account("default").items
        if missing or not any(K.name(a) == "default" for a in sa):
            raise NotYet(f"nodes not Ready: {missing}" if missing else "no default ServiceAccount yet")
        return True

    wait_until(
        ready,
        timeout,
        0.5,
        "the nodes and the default ServiceAccount",
        ignore=(ApiException, OSError, NotYet),
    )


class NotYet(Exception):
    """What is still missing, carried to the TimeoutError."""
