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
    name = md["metadata"]["name"]
    match = {"app.kubernetes.io/name": APP_NAME, INSTANCE_LABEL: name, PREFETCH_LABEL: bid}
    pod = pod_spec(spec, match)
    return _idle_deployment(md, name_of(name, bid), labels(name, bid), match, replicas, pod)


def _idle_deployment(
    md: dict[str, Any],
    name: str,
    own: dict[str, str],
    match: dict[str, str],
    replicas: int,
    pod: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": md["metadata"]["namespace"],
            "labels": own,
            "ownerReferences": [owner_reference(md)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match},
            # all pods at once: a rolling update would wait for Ready pods that each hold a node
            "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": own}, "spec": pod},
        },
    }


def pod_spec(spec: ModelDeploymentSpec, match: dict[str, str]) -> dict[str, Any]:
    """The engine image idling, with every image volume of the serving pod mounted read-only."""
    return idle_pod(spec, spec.bundle.engine.image, image_volumes(spec), match, "prefetch")


def idle_pod(
    spec: ModelDeploymentSpec, image: str, refs: list[tuple[str, str]], match: dict[str, str], role: str
) -> dict[str, Any]:
    """`image` idling with the image volumes `refs` ((volume name, reference)) mounted read-only, one pod
    per node (`match`: its pods), placed and pulling as spec's serving pods do."""
    volumes = [{"name": v, "image": {"reference": ref, "pullPolicy": "IfNotPresent"}} for v, ref in refs]
    container = {
        "name": role,
        "image": image,
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


# ---- the rollback target kept warm (spec.rollout.prefetch.keepRollbackTarget) ---------------------
#
# The kubelet's image garbage collection removes only images no container uses, least recently used
# first, once the image filesystem passes imageGCHighThresholdPercent (or, with imageMaximumGCAge set,
# any image unused that long); an image volume counts as used while a container mounts it (the runtime
# reports the mount's image, KEP-4639). After a promotion the stable's pods keep the stable bundle's
# artifact in use and the warm prior's pods the prior's, until keepPrior.seconds ends; from then on no
# pod mounts the rollback target's artifact and the node may delete it. A hold Deployment mounts it on
# every node the bundle may use, one idle pod each, so it stays.

HOLD_LABEL = "modeldeploy.dev/hold"  # the bundle id whose images the pod keeps in use


def hold_name(md_name: str, bid: str) -> str:
    return f"{md_name}-hold-{bid[:10]}"


def held_images(dep: dict[str, Any]) -> tuple[str, list[tuple[str, str]]] | None:
    """(engine image, [(volume name, reference)]) of a Deployment's pod template (a serving bundle's, or a
    hold's): what a hold keeps in use; None when the template mounts no image volume (its files live in a
    claim or an emptyDir, which image garbage collection never touches)."""
    pod = ((dep.get("spec") or {}).get("template") or {}).get("spec") or {}
    refs = [(v["name"], v["image"]["reference"]) for v in pod.get("volumes") or [] if v.get("image")]
    containers = pod.get("containers") or []
    if not refs or not containers or not containers[0].get("image"):
        return None
    return containers[0]["image"], refs


def hold_deployment(
    md: dict[str, Any],
    spec: ModelDeploymentSpec,
    bid: str,
    held: tuple[str, list[tuple[str, str]]],
    replicas: int,
) -> dict[str, Any]:
    """The hold of bundle `bid`'s images: `held` (held_images of its Deployment) on `replicas` nodes."""
    name = md["metadata"]["name"]
    own = instance_labels(name) | {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/component": "hold",
        HOLD_LABEL: bid,
    }
    match = {"app.kubernetes.io/name": APP_NAME, INSTANCE_LABEL: name, HOLD_LABEL: bid}
    pod = idle_pod(spec, held[0], held[1], match, "hold")
    return _idle_deployment(md, hold_name(name, bid), own, match, replicas, pod)


def progress(dep: dict[str, Any] | None) -> tuple[int, int] | None:
    """(pods Ready, pods wanted) of an observed pre-pull Deployment; None before it exists."""
    if dep is None:
        return None
    want = int((dep.get("spec") or {}).get("replicas") or 0)
    st = dep.get("status") or {}
    # pods of an older template (a node list that changed) do not count: observedGeneration says which
    current = st.get("observedGeneration", 0) >= (dep["metadata"].get("generation") or 0)
    return (int(st.get("readyReplicas") or 0) if current else 0), want


# ---- what the pre-pull pods wait on, and which pull failures end the phase at once ----------------

# kubelet's waiting reasons of a container whose image (or image volume) did not pull
PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
NEVER_RETRIED = frozenset({"InvalidImageName", "ErrImageNeverPull"})  # kubelet itself never retries these
# Words of a pull error that another attempt can cure: the registry or the path to it failing for a
# while (a network error, a 5xx, rate limiting). Every other pull error names the artifact itself: a
# manifest or blob the registry lacks ("not found", "manifest unknown"), one whose bytes do not hash to
# their digest (containerd: "unexpected commit digest ..., expected ...", "failed size validation"),
# credentials refused ("unauthorized", "denied"). Retrying those pulls the same answer again.
TRANSIENT = (
    "timeout",
    "timed out",
    "deadline exceeded",
    "connection refused",
    "connection reset",
    "no route to host",
    "network is unreachable",
    "temporary failure",
    "tls handshake",
    "unexpected eof",
    "broken pipe",
    "too many requests",
    "toomanyrequests",
    "429 ",
    "500 internal",
    "502 bad gateway",
    "503 service unavailable",
    "504 gateway",
    "service unavailable",
    "dial tcp",
)
MAX_WAITING = 16  # status lists at most this many nodes (pull errors first)

Waiting = tuple[str, str, str]  # (node, reason, message) of a pre-pull pod that is not Ready


def waiting(pods: list[dict[str, Any]]) -> dict[str, list[Waiting]]:
    """Per bundle being pre-pulled, what its pods that are not Ready wait on, read from the pod status
    as the kubelet and scheduler write it: a container's waiting reason and message (ContainerCreating
    while the pull runs, ErrImagePull / ImagePullBackOff with the registry's or containerd's error: an
    image volume's failed pull is reported on the container that mounts it), or the scheduler's
    (Unschedulable). Pull errors first, then by node; at most MAX_WAITING per bundle."""
    out: dict[str, list[Waiting]] = {}
    for p in pods:
        meta = p.get("metadata") or {}
        bid = (meta.get("labels") or {}).get(PREFETCH_LABEL)
        if not bid or meta.get("deletionTimestamp") or _ready(p):
            continue
        node = (p.get("spec") or {}).get("nodeName") or ""
        out.setdefault(bid, []).append((node, *_waiting_on(p)))
    return {
        b: sorted(w, key=lambda x: (x[1] not in PULL_REASONS, x[0] == "", x[0]))[:MAX_WAITING]
        for b, w in out.items()
    }


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _waiting_on(pod: dict[str, Any]) -> tuple[str, str]:
    st = pod.get("status") or {}
    for cs in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        w = (cs.get("state") or {}).get("waiting")
        if w and w.get("reason"):
            return w["reason"], (w.get("message") or "")[:1024]
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return c.get("reason") or "Unschedulable", (c.get("message") or "")[:1024]
    return st.get("phase") or "Pending", ""


def terminal(reason: str, message: str) -> bool:
    """Whether a pull failure ends the Prefetching phase at once (PrefetchFailed) rather than at
    prefetch.timeoutSeconds: every failure but one whose message shows the registry or the network
    failing for a while (TRANSIENT). A back-off with no cause in its message counts as terminal: it is
    kubelet saying the attempts keep failing (ImagePullBackOff), and nothing suggests a retry helps."""
    if reason in NEVER_RETRIED:
        return True
    low = message.lower()
    return not any(t in low for t in TRANSIENT)


def failure(waits: list[Waiting]) -> str | None:
    """'node N: ImagePullBackOff: <the kubelet's message>' of the first pre-pull pod whose pull failed for
    good (`terminal`), else None."""
    for node, reason, message in waits:
        if reason in PULL_REASONS and terminal(reason, message):
            return f"node {node or '?'}: {reason}: {message}"[:1024]
    return None


def summary(waits: list[Waiting]) -> str:
    """One line naming what the pre-pull pods wait on, pull errors first (for the PrefetchTimeout
    message and the Progressing condition)."""
    if not waits:
        return ""
    parts = [
        f"{node or 'unscheduled'}: {reason}" + (f" ({message})" if message else "")
        for node, reason, message in waits[:3]
    ]
    more = f"; {len(waits) - 3} more" if len(waits) > 3 else ""
    return ("waiting on " + "; ".join(parts) + more)[:1024]
