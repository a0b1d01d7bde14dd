"""Which pods sit on a lost node (controller/observe.lost_pods, rollout/topology.lost_nodes)."""

from __future__ import annotations

from typing import Any

from modeldeploy.operator.controller.observe import MAX_NODE_READS, NodeReads, lost_pods, suspect_nodes
from modeldeploy.operator.rollout.actions import LostPod
from modeldeploy.operator.rollout.topology import NodeInfo, lost_nodes


def pod(
    name: str, node: str, ready: bool, bundle: str = "b1", deleting: bool = False, phase: str = "Running"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"modeldeploy.dev/bundle": bundle}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cond = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"conditions": cond, "phase": phase}}


def test_lost_nodes_are_those_with_a_noexecute_unreachable_or_not_ready_taint() -> None:
    nodes = [
        NodeInfo("a", taints=(("node.kubernetes.io/unreachable", "", "NoExecute"),)),
        NodeInfo("b", taints=(("node.kubernetes.io/not-ready", "", "NoExecute"),)),
        NodeInfo("c", taints=(("node.kubernetes.io/unreachable", "", "NoSchedule"),)),  # not yet evicting
        NodeInfo("d", taints=(("nvidia.com/gpu", "present", "NoSchedule"),)),
        NodeInfo("e"),
    ]
    assert lost_nodes(nodes) == {"a", "b"}


def test_lost_pods_are_the_not_ready_ones_not_being_deleted_on_a_lost_node() -> None:
    pods = [
        pod("p1", "a", ready=False),
        pod("p2", "a", ready=True),  # the node controller has not marked it yet: it still serves
        pod("p3", "a", ready=False, deleting=True),  # already on its way out
        pod("p4", "e", ready=False),  # loading on a live node
        pod("p5", "a", ready=False, bundle="b2", phase="Pending"),  # bound there, never started
    ]
    assert lost_pods(pods, frozenset({"a"})) == {
        "b1": [LostPod("p1", "a", True)],
        "b2": [LostPod("p5", "a", False)],
    }
    assert lost_pods(pods, frozenset()) == {}


class FakeKube:
    """get_node only: a Node per name (None: 404), counting reads; `broken` raises like a dead API."""

    def __init__(self, nodes: dict[str, dict[str, Any] | None], broken: bool = False) -> None:
        self.nodes, self.broken, self.reads = nodes, broken, 0

    def get_node(self, name: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.broken:
            raise OSError("connection refused")
        return self.nodes.get(name)


def node(name: str, *taints: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"taints": [{"key": k, "effect": e} for k, e in taints]}}


def test_suspect_nodes_are_where_our_pods_sit_not_ready() -> None:
    pods = [
        pod("p1", "a", ready=False),
        pod("p2", "b", ready=True),
        pod("p3", "c", ready=False, deleting=True),
        pod("p4", "d", ready=False, phase="Pending"),
    ]
    assert suspect_nodes(pods) == {"a", "d"}


def test_node_reads_see_a_lost_node_in_seconds_and_keep_each_read_a_while() -> None:
    """The node list may be a minute old; the nodes of not-Ready pods are read fresh, each read kept
    NODE_READ_TTL_S. A node that cannot be read, or is gone, is not called lost."""
    now = [0.0]
    kube = FakeKube(
        {
            "a": node("a", ("node.kubernetes.io/unreachable", "NoExecute")),
            "b": node("b", ("node.kubernetes.io/unreachable", "NoSchedule")),
            "gone": None,
        }
    )
    reads = NodeReads(kube, ttl_s=10.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert reads.lost({"a", "b", "gone"}) == {"a"} and kube.reads == 3
    assert reads.lost({"a", "b"}) == {"a"} and kube.reads == 3  # kept
    kube.nodes["b"] = node("b", ("node.kubernetes.io/not-ready", "NoExecute"))
    now[0] = 11.0
    assert reads.lost({"a", "b"}) == {"a", "b"} and kube.reads == 5
    assert NodeReads(FakeKube({}, broken=True)).lost({"a"}) == frozenset()  # type: ignore[arg-type]


def test_node_reads_are_bounded_per_pass() -> None:
    kube = FakeKube(
        {f"n{i:02d}": node(f"n{i:02d}", ("node.kubernetes.io/unreachable", "NoExecute")) for i in range(40)}
    )
    reads = NodeReads(kube, clock=lambda: 0.0)  # type: ignore[arg-type]
    assert len(reads.lost({f"n{i:02d}" for i in range(40)})) == MAX_NODE_READS == kube.reads
    assert len(reads.lost({f"n{i:02d}" for i in range(40)})) == 40  # the rest on the next pass
