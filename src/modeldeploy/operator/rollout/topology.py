"""Topology fit: can any node *ever* host one replica? Pure, no I/O.

Pods that can never schedule sit Pending without telling anyone why at the level a
platform team looks at (the ModelDeployment). This check names the first constraint that
no node satisfies (GPU type, node labels, GPU count, GPU memory, untolerated taints) so status
can say `Degraded/Unschedulable` instead. It uses allocatable capacity, not current usage:
a busy cluster is a Pending pod, not an impossible one.

GPU memory: with `topology.weightsMemory` set, one GPU of a replica needs
`ceil(weightsMemory / tensorParallel) + kvCachePerGpu` (each tensor-parallel rank holds 1/N of
the weights and its own KV blocks; `Topology.gpu_bytes_needed`), compared with the node label
`nvidia.com/gpu.memory` (MiB per GPU, set by NVIDIA GPU feature discovery beside
`nvidia.com/gpu.product`). A node without the label is not ruled out, and CPU ranks
(`bundle.config.device: cpu`) need no GPU memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from modeldeploy.operator.api.v1alpha1.topology import Toleration, Topology
from modeldeploy.operator.rollout.children import GPU_PRODUCT_LABEL, GPU_RESOURCE

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU (GPU feature discovery)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)
    requested: int = 0  # GPUs requested by the pods bound to the node (not Succeeded/Failed)

    @property
    def gpu_memory(self) -> int | None:
        """Bytes of memory per GPU from the GPU_MEMORY_LABEL (MiB), None when absent or malformed."""
        try:
            mib = int(self.labels.get(GPU_MEMORY_LABEL, ""))
        except ValueError:
            return None
        return mib << 20 if mib > 0 else None

    @property
    def free_gpus(self) -> int:
        return max(0, self.gpus - self.requested)

    @classmethod
    def from_node(cls, node: dict[str, Any], requested: int = 0) -> NodeInfo:
        meta, spec, status = node.get("metadata", {}), node.get("spec") or {}, node.get("status") or {}
        alloc = (status.get("allocatable") or status.get("capacity") or {}).get(GPU_RESOURCE, "0")
        try:
            gpus = int(str(alloc))
        except ValueError:
            gpus = 0
        taints = tuple(
            (t.get("key", ""), t.get("value") or "", t.get("effect", "")) for t in spec.get("taints") or []
        )
        labels = dict(meta.get("labels") or {})
        return cls(name=meta.get("name", ""), labels=labels, gpus=gpus, taints=taints, requested=requested)


# The taints the node lifecycle controller puts on a node whose kubelet stopped reporting (Unknown) or
# reports NotReady; with effect NoExecute, pods without a toleration are evicted (300 s by default)
LOST_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})


def lost_nodes(nodes: Iterable[NodeInfo]) -> frozenset[str]:
    """Nodes the node lifecycle controller has marked lost (a NoExecute unreachable/not-ready taint)."""
    return frozenset(
        n.name for n in nodes if any(k in LOST_TAINTS and e == "NoExecute" for k, _, e in n.taints)
    )


class Nodes(list[NodeInfo]):
    """A node list that remembers, per (topology, device), which of its nodes fit() accepts one replica on.

    Why: fit() runs in every pass and a rollout's spare_fit() asks it of each node alone; with
    thousands of nodes that dominates the operator's CPU (bench/results/operator.md). What fit()
    reads of a node (labels, allocatable GPUs, GPU memory, taints) is the same in the copies that
    only count more GPUs requested (claims.place), so those share the memo (`like`). A list relisted
    from the API server is a new Nodes with an empty memo."""

    def __init__(
        self, items: Iterable[NodeInfo] = (), memo: dict[tuple[str, str], frozenset[str]] | None = None
    ):
        super().__init__(items)
        self.memo = {} if memo is None else memo

    @staticmethod
    def like(nodes: list[NodeInfo], items: Iterable[NodeInfo]) -> list[NodeInfo]:
        """`items`, the same nodes as `nodes` with other GPU requests: sharing its memo if it has one."""
        return Nodes(items, nodes.memo) if isinstance(nodes, Nodes) else list(items)


def accepted(topology: Topology, nodes: list[NodeInfo], device: str = "auto") -> list[NodeInfo]:
    """The nodes fit() accepts one replica on, each alone (remembered when `nodes` is a Nodes)."""
    names = _accepted_names(topology, nodes, device)
    return [n for n in nodes if n.name in names]


def _accepted_names(topology: Topology, nodes: list[NodeInfo], device: str) -> frozenset[str]:
    memo = nodes.memo if isinstance(nodes, Nodes) else None
    key = (topology.model_dump_json(), device)
    names = memo.get(key) if memo is not None else None
    if names is None:
        names = frozenset(n.name for n in _matching(topology, nodes, device))
        if memo is not None:
            memo[key] = names
    return names


def _matching(topology: Topology, nodes: list[NodeInfo], device: str) -> list[NodeInfo]:
    """Every constraint fit() names, as one filter: selector and GPU type, GPU count, GPU memory, taints."""
    selector = dict(topology.node_selector)
    if topology.gpu_type:
        selector[GPU_PRODUCT_LABEL] = topology.gpu_type
    need = topology.gpus_per_replica
    per_gpu = topology.gpu_bytes_needed() if need and device != "cpu" else None
    tolerations = topology.tolerations
    return [
        n
        for n in nodes
        if all(n.labels.get(k) == v for k, v in selector.items())
        and (not need or n.gpus >= need)
        and (not per_gpu or n.gpu_memory is None or n.gpu_memory >= per_gpu)
        and all(tolerates(tolerations, t) for t in n.taints)
    ]


def pod_gpus(pod: dict[str, Any]) -> int:
    """GPUs a pod requests (an extended resource's request is its limit when only the limit is given)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        want = (res.get("requests") or {}).get(GPU_RESOURCE, (res.get("limits") or {}).get(GPU_RESOURCE, 0))
        try:
            total += int(str(want))
        except ValueError:
            continue
    return total


def gpu_requests(pods: Iterable[dict[str, Any]]) -> dict[str, int]:
    """GPUs requested per node by bound pods that still hold them, the way the scheduler counts them."""
    out: dict[str, int] = {}
    for p in pods:
        spec, phase = p.get("spec") or {}, (p.get("status") or {}).get("phase")
        node = spec.get("nodeName")
        if not node or phase in ("Succeeded", "Failed"):
            continue
        out[node] = out.get(node, 0) + pod_gpus(p)
    return out


# Taints the node lifecycle sets from conditions (not-ready, unreachable, pressure, cordon):
# they come and go, so they make a node busy for now, not impossible forever.
TRANSIENT_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")


def tolerates(tolerations: list[Toleration], taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    if effect == "PreferNoSchedule" or key.startswith(TRANSIENT_TAINT_PREFIXES):
        return True
    for t in tolerations:
        if t.effect is not None and t.effect != effect:
            continue
        if t.key is None and t.operator == "Exists":
            return True
        if t.key == key and (t.operator == "Exists" or (t.value or "") == value):
            return True
    return False


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}Gi"


def fit(topology: Topology, nodes: list[NodeInfo], device: str = "auto") -> str | None:
    """None when some node can host a replica, else a message naming the constraint.

    `device` is bundle.config.device: CPU ranks need no GPU memory."""
    if not nodes:
        return "the cluster has no nodes"
    if _accepted_names(topology, nodes, device):
        return None  # the common answer, remembered per node list; the walk below names the constraint
    selector = dict(topology.node_selector)
    if topology.gpu_type:
        selector[GPU_PRODUCT_LABEL] = topology.gpu_type
    candidates = nodes
    for key, value in selector.items():
        candidates = [n for n in candidates if n.labels.get(key) == value]
        if not candidates:
            seen = sorted({n.labels[key] for n in nodes if key in n.labels})
            have = f"; nodes have {key} in {seen}" if seen else f"; no node has label {key}"
            what = "gpuType" if key == GPU_PRODUCT_LABEL and topology.gpu_type == value else "nodeSelector"
            return f"{what}: no node has label {key}={value}{have}"
    need = topology.gpus_per_replica
    if need:
        most = max(n.gpus for n in candidates)
        if most < need:
            return (
                f"gpusPerReplica: {need} {GPU_RESOURCE} per replica but the largest matching node has {most}"
            )
        candidates = [n for n in candidates if n.gpus >= need]
        per_gpu = topology.gpu_bytes_needed() if device != "cpu" else None
        if per_gpu:
            roomy = [n for n in candidates if n.gpu_memory is None or n.gpu_memory >= per_gpu]
            if not roomy:
                most = max(n.gpu_memory or 0 for n in candidates)
                kv = f" + kvCachePerGpu {topology.kv_cache_per_gpu}" if topology.kv_cache_per_gpu else ""
                return (
                    f"weightsMemory: {topology.weights_memory}"
                    f" / tensorParallel {topology.tensor_parallel}{kv}"
                    f" needs {_gib(per_gpu)} per GPU but the largest matching node's GPUs have {_gib(most)}"
                    f" ({GPU_MEMORY_LABEL})"
                )
            candidates = roomy
    hard = [n for n in candidates if all(tolerates(topology.tolerations, t) for t in n.taints)]
    if not hard:
        taints = sorted(
            {
                f"{k}={v}:{e}"
                for n in candidates
                for (k, v, e) in n.taints
                if not tolerates(topology.tolerations, (k, v, e))
            }
        )
        return f"tolerations: every matching node has an untolerated taint ({', '.join(taints)})"
    return None


def spare_fit(
    topology: Topology, nodes: list[NodeInfo], replicas: int, device: str = "auto"
) -> tuple[bool, str]:
    """Whether `replicas` more replicas fit on the GPUs spare now (allocatable minus requested) of the nodes
    `fit` accepts for one replica, each replica whole on one node; with the figures that decided it."""
    need = topology.gpus_per_replica
    if replicas <= 0 or need == 0:
        return True, f"{replicas} more replicas need no GPU"
    usable = accepted(topology, nodes, device)
    slots = sum(n.free_gpus // need for n in usable)
    free, alloc = sum(n.free_gpus for n in usable), sum(n.gpus for n in usable)
    verdict = "fit" if slots >= replicas else "do not fit"
    return slots >= replicas, (
        f"{replicas} more replicas x {need} {GPU_RESOURCE} {verdict} beside stable: "
        f"{free} of {alloc} GPUs spare on {len(usable)} matching nodes ({slots} replicas' worth)"
    )
