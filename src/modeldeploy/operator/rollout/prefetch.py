"""The pre-pull Deployment of a new bundle (rollout phase Prefetching): pure manifest builders, no I/O.

Before a canary pod waits on its images, one pod per node the canary may run on (the nodes fit()
accepts a replica on: nodeSelector, GPU type and count, taints; spec.replicas pods when the nodes are
not known) runs the bundle's engine image with its image volumes (oci:// models and adapters) mounted,
and does nothing else. A pod is Ready once the kubelet has pulled both, so "every pre-pull pod Ready" is
"the images are in those nodes' image stores"; the canary pods that follow find them there.

Why a Deployment and not a DaemonSet: a Deployment is a kind the operator already watches, owns and may
write (no new RBAC for one phase), and it pulls onto exactly the nodes the canary can use: a required
anti-affinity puts one pod per node, the canary's nodeSelector and tolerations put them where the
canary may go. The pods request no GPU (a full node still pulls), carry no serving labels (no Service
or NetworkPolicy selects them, no analysis reads them) and pass Pod Security `restricted`.
"""

from __future__ import annotations

from typing import Any

from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.rollout.bundle import INSTANCE_LABEL, instance_labels
from modeldeploy.operator.rollout.children import image_volumes, owner_reference
from modeldeploy.operator.rollout.placement import (
    container_security,
    pod_placement,
    pod_security,
    pull_secrets,
)
from modeldeploy.operator.rollout.topology import NodeInfo, accepted

PREFETCH_LABEL = "modeldeploy.dev/prefetch"  # the bundle id whose images the pod pulls
APP_NAME = "modeldeploy-prefetch"
HOSTNAME = "kubernetes.io/hostname"
# Stays up doing nothing until deleted; exits at once on SIGTERM (a plain PID 1 would ignore it).
IDLE = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); signal.pause()"


def error_key(bid: str) -> str:
    """Where observe files a pre-pull pod's image pull failure among the load errors (by bundle id)."""
    return f"prefetch:{bid}"


def name_of(md_name: str, bid: str) -> str:
    return f"{md_name}-prefetch-{bid[:10]}"


def labels(md_name: str, bid: str) -> dict[str, str]:
    return instance_labels(md_name) | {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/component": "prefetch",
        PREFETCH_LABEL: bid,
    }


def pods_wanted(spec: ModelDeploymentSpec, nodes: list[NodeInfo] | None) -> int:
    """One pre-pull pod per node a canary replica may land on; spec.replicas when nodes are unknown
    (at least 1: a bundle with no fitting node is Unschedulable, which plan() reports apart)."""
    if nodes is None:
        return max(1, spec.replicas)
    return max(1, len(accepted(spec.topology, nodes, spec.bundle.config.device)))


def deployment(md: dict[str, Any], spec: ModelDeploymentSpec, bid: str, replicas: int) -> dict[str, Any]:
    name, ns = md["metadata"]["name"], md["metadata"]["namespace"]
    own = labels(name, bid)
    match = {"app.kubernetes.io/name": APP_NAME, INSTANCE_LABEL: name, PREFETCH_LABEL: bid}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name_of(name, bid),
            "namespace": ns,
            "labels": own,
            "ownerReferences": [owner_reference(md)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match},
            # all pods at once: a rolling update would wait for Ready pods that each hold a node
            "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": own}, "spec": pod_spec(spec, match)},
        },
    }


def pod_spec(spec: ModelDeploymentSpec, match: dict[str, str]) -> dict[str, Any]:
    """The engine image idling, with every image volume of the serving pod mounted read-only."""
    volumes = [
        {"name": v, "image": {"reference": ref, "pullPolicy": "IfNotPresent"}}
        for v, ref in image_volumes(spec)
    ]
    container = {
        "name": "prefetch",
        "image": spec.bundle.engine.image,
        "command": ["python3", "-c", IDLE],
        "volumeMounts": [
            {"name": v["name"], "mountPath": f"/prefetch/{v['name']}", "readOnly": True} for v in volumes
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": container_security(),
    }
    placed = pod_placement(spec)  # the canary's nodes: its nodeSelector, GPU type and tolerations
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": pod_security(fs_group=False),  # writes nothing: no volume to own
        "containers": [container],
        "tolerations": placed.pop("tolerations"),  # (key order as before the shared helper)
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": match}, "topologyKey": HOSTNAME}
                ]
            }
        },
    }
    if volumes:
        pod["volumes"] = volumes
    return pod | placed | pull_secrets(spec)  # a private image or artifact pulls as the canary's would


def progress(dep: dict[str, Any] | None) -> tuple[int, int] | None:
    """(pods Ready, pods wanted) of an observed pre-pull Deployment; None before it exists."""
    if dep is None:
        return None
    want = int((dep.get("spec") or {}).get("replicas") or 0)
    st = dep.get("status") or {}
    # pods of an older template (a node list that changed) do not count: observedGeneration says which
    current = st.get("observedGeneration", 0) >= (dep["metadata"].get("generation") or 0)
    return (int(st.get("readyReplicas") or 0) if current else 0), want
