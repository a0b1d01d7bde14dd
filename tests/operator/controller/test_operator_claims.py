"""claims.py: the GPUs an object's plan wants that its pods do not show yet, placed on the nodes."""

from __future__ import annotations

from collections import Counter

from support.operator_fixtures import gpu_nodes, md

from modeldeploy.operator.controller.claims import Claim, claimed, place, pod_counts

TOPO = {
    "gpusPerReplica": 1,
    "gpuType": "NVIDIA-H200",
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
}


def _status(phase: str, capacity: str, canary: int) -> dict:
    return {
        "phase": phase,
        "stable": {"bundle": "s", "replicas": 4},
        "canary": {"bundle": "c", "replicas": canary},
        "rollout": {"capacity": capacity},
    }


def test_a_surge_canary_claims_the_full_size_auto_checked_and_a_replace_canary_its_step() -> None:
    obj = md("a", replicas=4)
    assert Claim.of(obj, _status("Canary", "Surge", 1)).wants == {"s": 4, "c": 4}
    assert Claim.of(obj, _status("Canary", "Replace", 1)).wants == {"s": 4, "c": 1}
    assert Claim.of(obj, _status("RollingBack", "Surge", 1)).wants == {"s": 4, "c": 1}  # being removed
    assert Claim.of(obj, {"phase": "Stable", "stable": {"bundle": "s", "replicas": 4}}).wants == {"s": 4}
    assert Claim.of(obj, {}).wants == {}


def test_a_warm_prior_claims_its_warm_replicas_within_the_gpu_budget() -> None:
    """A Replace rollout's prior bundle is scaled back up to its warm size after promotion: those GPUs
    are taken before its pods show them."""
    obj = md(
        "a",
        replicas=4,
        rollout={"keepPrior": {"replicas": 3, "maxGPUs": 4}},
        topology={"gpusPerReplica": 2, "gpuType": "NVIDIA-H200"},
    )
    warm = {
        "phase": "Stable",
        "stable": {"bundle": "c", "replicas": 4},
        "rollout": {"previous": "s", "prior": "Warm"},
    }
    assert Claim.of(obj, warm).wants == {"c": 4, "s": 2}  # 3 replicas asked, 4 GPUs / 2 per replica
    cold = {**warm, "rollout": {"prior": "Cold"}}
    assert Claim.of(obj, cold).wants == {"c": 4}
    seen = Counter({("ns", "a", "c"): 4, ("ns", "a", "s"): 1})
    assert Claim.of(obj, warm).missing(seen) == 1  # one warm replica already there, one to come


def test_place_puts_each_need_on_the_node_with_most_free_that_holds_it_whole() -> None:
    a, b = gpu_nodes(2)
    nodes = [a, b]
    out = place(nodes, [1, 1, 1, 4])
    assert [n.requested for n in out] == [4, 3]  # 4 first, on gpu-0 (a tie: by name), then the 1s on gpu-1
    assert [n.name for n in out] == ["gpu-0", "gpu-1"]
    assert [n.requested for n in place(nodes, [9])] == [0, 0]  # held whole nowhere: takes nothing
    assert [n.requested for n in place(nodes, [2, 2], usable={"gpu-1"})] == [0, 4]


def _pod(ns: str, name: str, bundle: str) -> dict:
    labels = {"modeldeploy.dev/bundle": bundle, "app.kubernetes.io/instance": name}
    return {"metadata": {"namespace": ns, "labels": labels}}


def test_a_claim_shrinks_by_its_own_objects_pods_the_list_already_shows() -> None:
    nodes = gpu_nodes(2)
    c = Claim("ns", "a", {"s": 4, "c": 4}, TOPO)
    pods = [_pod("ns", "a", b) for b in ["s"] * 4 + ["c"]]
    # another object serving the same bundle ids (the 100-rollout bench: every object one bundle) and
    # another namespace: their pods are not this claim's, or no claim would ever count
    others = [_pod("ns", "b", "c")] * 3 + [_pod("other", "a", "c")]
    seen = pod_counts(pods + others)
    assert seen == Counter(
        {("ns", "a", "s"): 4, ("ns", "a", "c"): 1, ("ns", "b", "c"): 3, ("other", "a", "c"): 1}
    )
    assert c.missing(seen) == 3
    assert sum(n.requested for n in claimed(nodes, [c], seen)) == 3
    wrong_type = Claim("ns", "a", {"c": 4}, {**TOPO, "gpuType": "NVIDIA-A100"})
    assert sum(n.requested for n in claimed(nodes, [wrong_type], seen)) == 0  # fit accepts no node
    cpu = Claim("ns", "a", {"c": 4}, {**TOPO, "gpusPerReplica": 0})
    assert claimed(nodes, [cpu], seen) == nodes
