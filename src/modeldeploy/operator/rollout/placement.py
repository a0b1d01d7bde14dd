"""Where a ModelDeployment's pods may run and what they run as: the parts of the pod spec that every pod
it makes shares (the serving pods of children.py, the pre-pull pods of prefetch.py). Pure, no I/O.

One place on purpose: a pre-pull pod only warms the nodes the canary will use if it carries the same
nodeSelector and tolerations, and it only pulls a private image with the same imagePullSecrets; a copy
that drifts from the serving pod's pulls onto the wrong nodes, or not at all. Both pass Pod Security
`restricted` through the same security contexts.
"""

from __future__ import annotations

from typing import Any

from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.topology import Topology

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
RUN_AS = 65532  # the images' non-root user (distroless "nonroot")


def container_security() -> dict[str, Any]:
    """A container under Pod Security `restricted`, with a read-only root filesystem."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security(fs_group: bool) -> dict[str, Any]:
    """The pod's securityContext; `fs_group` where the pod writes volumes its user must own (serving)."""
    ctx: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS}
    if fs_group:
        ctx["fsGroup"] = RUN_AS
    return ctx | {"seccompProfile": {"type": "RuntimeDefault"}}


def node_selector(topo: Topology) -> dict[str, str]:
    """topology.nodeSelector plus the GPU product label of topology.gpuType."""
    selector = dict(topo.node_selector)
    if topo.gpu_type:
        selector[GPU_PRODUCT_LABEL] = topo.gpu_type
    return selector


def pod_placement(spec: ModelDeploymentSpec) -> dict[str, Any]:
    """`tolerations` and, when any, `nodeSelector` of a pod: the nodes a serving replica may use."""
    topo = spec.topology
    out: dict[str, Any] = {
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in topo.tolerations]
    }
    if selector := node_selector(topo):
        out["nodeSelector"] = selector
    return out


def pull_secrets(spec: ModelDeploymentSpec) -> dict[str, Any]:
    """`imagePullSecrets` from spec.imagePullSecrets; empty without them, so the pods of objects that
    set none keep the template (and desired hash) they had."""
    if not spec.image_pull_secrets:
        return {}
    return {"imagePullSecrets": [{"name": s.name} for s in spec.image_pull_secrets]}
