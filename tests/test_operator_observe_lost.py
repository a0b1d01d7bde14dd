"""Which pods sit on a lost node (controller/observe.lost_pods, rollout/topology.lost_nodes)."""

from __future__ import annotations

from typing import Any

from modeldeploy.operator.controller.observe import lost_pods
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
