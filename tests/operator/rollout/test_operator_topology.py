"""The fit check with tensor parallelism: one GPU needs weights/N + its KV cache, not the whole model."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from support.operator_fixtures import md

from modeldeploy.operator.api.v1alpha1.common import quantity_bytes, quantity_value
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.topology import Topology
from modeldeploy.operator.rollout.drift import subset
from modeldeploy.operator.rollout.plan import Create, Observed, PatchStatus, plan
from modeldeploy.operator.rollout.topology import GPU_MEMORY_LABEL, NodeInfo, fit

GPU_TAINT = (("nvidia.com/gpu", "present", "NoSchedule"),)
H100 = "NVIDIA-H100-80GB-HBM3"  # 81559 MiB = 79.6Gi per GPU, as GPU feature discovery labels it
H200 = "NVIDIA-H200"  # 143771 MiB = 140.4Gi
MIB = {H100: "81559", H200: "143771"}
# A 70B-class model in bfloat16 (70.6e9 parameters x 2 bytes = 131.5Gi) with 8Gi of KV cache per GPU.
WEIGHTS, KV = "132Gi", "8Gi"


def node(product: str = H100, gpus: int = 8, memory: str | None = "default", name: str = "gpu-0") -> NodeInfo:
    labels = {"nvidia.com/gpu.product": product}
    if memory is not None:
        labels[GPU_MEMORY_LABEL] = MIB[product] if memory == "default" else memory
    return NodeInfo(name, labels, gpus, GPU_TAINT)


def topo(tp: int, gpus: int | None = None, product: str = H100, **extra: Any) -> Topology:
    fields = {"gpusPerReplica": tp if gpus is None else gpus, "tensorParallel": tp, "gpuType": product}
    return Topology.model_validate(fields | {"weightsMemory": WEIGHTS, "kvCachePerGpu": KV} | extra)


def test_per_gpu_need_is_weights_over_tp_plus_kv() -> None:
    gi = 2**30
    assert topo(1).gpu_bytes_needed() == 132 * gi + 8 * gi
    assert topo(2).gpu_bytes_needed() == 66 * gi + 8 * gi
    assert topo(4).gpu_bytes_needed() == 33 * gi + 8 * gi
    assert topo(2, gpus=4).gpu_bytes_needed() == 66 * gi + 8 * gi  # divided by ranks, not GPUs
    assert topo(3, kvCachePerGpu=None).gpu_bytes_needed() == 44 * gi  # no KV figure: weights only
    assert topo(3, weightsMemory=100).gpu_bytes_needed() == 34 + 8 * gi  # a shard rounds up
    assert Topology(gpus_per_replica=2, tensor_parallel=2).gpu_bytes_needed() is None


def test_model_that_fits_only_with_tp2_is_rejected_with_tp1_and_accepted_with_tp2() -> None:
    nodes = [node(H100)]
    msg = fit(topo(1), nodes)
    assert msg is not None
    assert msg == (
        "weightsMemory: 132Gi / tensorParallel 1 + kvCachePerGpu 8Gi needs 140.0Gi per GPU "
        f"but the largest matching node's GPUs have 79.6Gi ({GPU_MEMORY_LABEL})"
    )
    assert fit(topo(2), nodes) is None  # 66 + 8 = 74.0Gi <= 79.6Gi
    assert fit(topo(4), nodes) is None


def test_the_same_model_fits_one_larger_gpu() -> None:
    assert fit(topo(1, product=H200), [node(H200)]) is None  # 140.0Gi <= 140.4Gi


def test_kv_cache_per_gpu_can_tip_the_balance() -> None:
    nodes = [node(H100)]
    assert fit(topo(2, kvCachePerGpu="13Gi"), nodes) is None  # 79.0Gi
    msg = fit(topo(2, kvCachePerGpu="14Gi"), nodes)  # 80.0Gi
    assert msg is not None and "tensorParallel 2 + kvCachePerGpu 14Gi needs 80.0Gi per GPU" in msg


def test_exactly_full_fits_and_one_byte_more_does_not() -> None:
    per_gpu = 81559 << 20
    exact = {"weightsMemory": 2 * per_gpu, "kvCachePerGpu": None}
    assert fit(topo(2, **exact), [node(H100)]) is None
    assert fit(topo(2, **exact | {"kvCachePerGpu": 1}), [node(H100)]) is not None


def test_largest_node_is_reported_and_any_roomy_node_is_enough() -> None:
    small = node(H100, memory="40960", name="gpu-small")
    big = node(H100, name="gpu-big")
    msg = fit(topo(1), [small, big])
    assert msg is not None and "have 79.6Gi" in msg
    assert fit(topo(2), [small, big]) is None  # gpu-small cannot, gpu-big can


def test_memory_is_checked_among_nodes_with_enough_gpus() -> None:
    one_large_gpu = node(H100, gpus=1, memory="143771", name="one-big-gpu")
    eight_h100 = node(H100, name="eight-small-gpus")
    msg = fit(topo(2), [one_large_gpu, eight_h100])
    assert msg is None  # the 8-GPU node hosts TP=2; the single large GPU cannot (1 GPU < 2)
    msg = fit(topo(2), [one_large_gpu])
    assert msg is not None and msg.startswith("gpusPerReplica: 2")


def test_unknown_gpu_memory_never_makes_a_replica_impossible() -> None:
    for labels in (None, "", "many", "0"):
        assert fit(topo(1), [node(H100, memory=labels)]) is None


def test_cpu_ranks_and_unset_weights_skip_the_memory_check() -> None:
    nodes = [node(H100)]
    assert fit(topo(1), nodes, device="cpu") is None  # simulated GPUs, CPU ranks (the process node)
    assert fit(topo(1, weightsMemory=None), nodes) is None  # GPU count only
    cpu = Topology.model_validate({"gpusPerReplica": 0, "weightsMemory": WEIGHTS, "tolerations": []})
    assert fit(cpu, [NodeInfo("cpu-0", {}, 0)]) is None


@pytest.mark.parametrize(
    ("q", "n"),
    [("132Gi", 132 * 2**30), ("80G", 80 * 10**9), ("1.5Ti", 3 * 2**39), (4096, 4096), ("512Mi", 2**29),
     ("1e9", 10**9), ("0.5Ki", 512), ("100k", 100_000), ("1.1", 2)],
)  # fmt: skip
def test_quantity_bytes(q: Any, n: int) -> None:
    assert quantity_bytes(q) == n


@pytest.mark.parametrize(
    ("a", "b"), [("500m", "0.5"), ("1Gi", 2**30), ("1k", "1000"), ("1e3", "1k"), ("250u", "0.25m")]
)
def test_two_spellings_of_one_quantity_are_the_same_value(a: Any, b: Any) -> None:
    assert quantity_value(a) == quantity_value(b)
    assert subset({"cpu": a}, {"cpu": b})  # drift: the API server's spelling is not a change


def test_quantity_value_is_exact_and_rejects_non_quantities() -> None:
    assert quantity_value("100m") != quantity_value("200m")  # no rounding up to whole units
    for bad in ("lots", "1 Gi", "Gi", True):
        with pytest.raises(ValueError):
            quantity_value(bad)


@pytest.mark.parametrize("bad", ["lots", "8GB", "-1Gi", "1 Gi", "Gi", "500m", -1])
def test_bad_memory_quantities_are_rejected(bad: Any) -> None:
    with pytest.raises(ValidationError, match="quantity"):
        Topology.model_validate({"weightsMemory": bad})


def _plan(topology: dict[str, Any]) -> list:
    obj = md(topology=topology)
    ModelDeploymentSpec.model_validate(obj["spec"])
    return plan(obj, Observed(nodes=[node(H100)]), "2026-01-01T00:00:00Z")


def _degraded(acts: list) -> dict[str, Any]:
    [st] = [a.status for a in acts if isinstance(a, PatchStatus)]
    return next(c for c in st["conditions"] if c["type"] == "Degraded")


def test_plan_degrades_tp1_and_deploys_tp2() -> None:
    base = {"gpuType": H100, "weightsMemory": WEIGHTS, "kvCachePerGpu": KV}
    acts = _plan(base | {"gpusPerReplica": 1, "tensorParallel": 1})
    assert not any(isinstance(a, Create) and a.obj["kind"] == "Deployment" for a in acts)
    deg = _degraded(acts)
    assert deg["status"] == "True" and deg["reason"] == "Unschedulable"
    assert "weightsMemory: 132Gi / tensorParallel 1" in deg["message"]

    acts = _plan(base | {"gpusPerReplica": 2, "tensorParallel": 2})
    [dep] = [a.obj for a in acts if isinstance(a, Create) and a.obj["kind"] == "Deployment"]
    assert "--tensor-parallel-size" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _degraded(acts)["status"] == "False"


def test_accepted_is_fit_asked_of_each_node_alone_and_remembered_per_list() -> None:
    """fit() per node was the operator's largest CPU cost at 2,000 nodes: `accepted` answers for the whole
    list at once, the same nodes, and a Nodes list keeps the answer for its copies (claims.place)."""
    from modeldeploy.operator.controller.claims import place
    from modeldeploy.operator.rollout.topology import Nodes, accepted

    nodes = Nodes(
        [
            node(name="ok"),
            node(name="few-gpus", gpus=1),
            node(H200, name="other-product"),
            node(name="small-memory", memory="1024"),
            node(name="no-memory-label", memory=None),
            NodeInfo("untolerated", {"nvidia.com/gpu.product": H100}, 8, (("team", "a", "NoSchedule"),)),
        ]
    )
    t = topo(2, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    alone = [n.name for n in nodes if fit(t, [n]) is None]
    assert alone == ["ok", "no-memory-label"]
    assert [n.name for n in accepted(t, nodes)] == alone
    assert [n.name for n in accepted(t, list(nodes))] == alone  # a plain list: same answer, nothing kept
    assert len(nodes.memo) == 1 and fit(t, nodes) is None
    busy = place(nodes, [2, 2], {"ok"})
    assert isinstance(busy, Nodes) and busy.memo is nodes.memo  # more GPUs requested: the same nodes
    assert [n.requested for n in busy if n.name == "ok"] == [4]
    assert [n.name for n in accepted(t, busy)] == alone and len(nodes.memo) == 1
    # a relist is a new Nodes: a node that changed is judged again
    relisted = Nodes([NodeInfo("ok", {"nvidia.com/gpu.product": H200}, 8, GPU_TAINT)])
    assert accepted(t, relisted) == [] and fit(t, relisted).startswith("gpuType")
