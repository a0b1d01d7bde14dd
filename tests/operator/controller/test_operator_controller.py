"""The Controller against an in-memory API server: observe -> plan -> apply, echoes, children, delete."""

from __future__ import annotations

import copy
import socket
import time
from typing import Any

from support.fake_kube import MD, FakeKube
from support.operator_fixtures import md

from modeldeploy.operator.analysis.scrape import CohortScrape
from modeldeploy.operator.analysis.verdicts import CohortSample
from modeldeploy.operator.controller.reconciler import Controller
from modeldeploy.operator.rollout.bundle import MANAGED_BY
from modeldeploy.operator.rollout.drift import DESIRED_HASH

NS, NAME = "ns", "chat"


def _node(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"gpu-{i}", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }


class CountingKube(FakeKube):
    """Counts node relists."""

    lists = 0

    def list_nodes(self) -> list[dict[str, Any]]:
        self.lists += 1
        return super().list_nodes()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _world() -> tuple[FakeKube, Controller, dict[str, Any]]:
    kube = FakeKube()
    kube.nodes = [_node(0), _node(1)]
    obj = md()
    obj["metadata"].pop("uid")
    obj = kube.put(obj)
    ctrl = Controller(kube, tick_s=3600.0)  # a tick is scheduled, never fired, in these tests
    ctrl.probe.port = _closed_port()  # the loading pod below refuses connections: counted as unreachable
    return kube, ctrl, obj


def _loading_pod(kube: FakeKube, bundle: str) -> None:
    labels = {"app.kubernetes.io/instance": NAME, "app.kubernetes.io/managed-by": MANAGED_BY}
    kube.put(
        {
            "kind": "Pod",
            "metadata": {
                "name": "chat-0",
                "namespace": NS,
                "labels": {**labels, "modeldeploy.dev/bundle": bundle},
            },
            "status": {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "False"}],
            },
        }
    )


def test_reconcile_creates_children_and_recognises_its_own_status_echo() -> None:
    kube, ctrl, obj = _world()
    assert ctrl.md_event("ADDED", NS, NAME, obj) is True
    ctrl.request(NS, NAME)
    kinds = sorted(k for (k, _, _) in kube.objects if k != MD)
    # the cohort Services come with the first canary; the NetworkPolicy (spec.network) with the object
    assert kinds == ["Deployment", "NetworkPolicy", "Service"]
    stored = kube.get_md(NS, NAME)
    assert stored["status"]["phase"] == "Deploying" and ctrl.reconciles == 1
    assert ctrl.md_event("MODIFIED", NS, NAME, stored) is False  # the echo of our own status write
    assert {e["reason"] for e in kube.events} >= {"Created", "Initial"}
    assert stored["status"]["stable"]["deployment"] in {n for (k, _, n) in kube.objects if k == "Deployment"}
    assert ctrl.reconcile(NS, NAME) == []  # converged in one pass (status named what it created): idempotent


def test_echoes_of_two_status_writes_in_a_row_are_both_recognised() -> None:
    kube, ctrl, _ = _world()
    ctrl.request(NS, NAME)
    first = kube.get_md(NS, NAME)
    dep = next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")
    dep["status"] = {"readyReplicas": dep["spec"]["replicas"]}
    ctrl.request(NS, NAME, "child")  # the Deployment turned Ready: status written again
    second = kube.get_md(NS, NAME)
    assert second["status"]["phase"] == "Stable" != first["status"]["phase"]
    # the first write's event handled only after the second write: still our own echo
    assert ctrl.md_event("MODIFIED", NS, NAME, first) is False
    assert ctrl.md_event("MODIFIED", NS, NAME, second) is False
    kube.patch(MD, NS, NAME, {"spec": {"replicas": 3}})  # someone else's write is news
    assert ctrl.md_event("MODIFIED", NS, NAME, kube.get_md(NS, NAME)) is True


def test_child_events_name_the_owner_only_when_plan_reads_the_change() -> None:
    kube, ctrl, _ = _world()
    ctrl.request(NS, NAME)
    dep = next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")
    assert ctrl.child_event("ADDED", dep) is None  # our own create
    # the Deployment controller's first writes after our create: nothing plan() reads changed
    revised = copy.deepcopy(dep)
    revised["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
    assert ctrl.child_event("MODIFIED", revised) is None
    assert (
        ctrl.child_event("MODIFIED", {**revised, "status": {"observedGeneration": 1, "replicas": 2}}) is None
    )
    hashed = copy.deepcopy(revised)
    hashed["metadata"]["annotations"][DESIRED_HASH] = "edited"  # someone changed what we applied
    assert ctrl.child_event("MODIFIED", hashed) == NAME
    assert ctrl.child_event("MODIFIED", revised) == NAME  # and back
    dep["status"] = {"readyReplicas": 2}
    assert ctrl.child_event("MODIFIED", dep) == NAME
    assert ctrl.child_event("DELETED", dep) == NAME and dep["metadata"]["uid"] not in ctrl.children


def test_delete_leaves_no_state_for_the_object() -> None:
    kube, ctrl, obj = _world()
    ctrl.md_event("ADDED", NS, NAME, obj)
    ctrl.request(NS, NAME)
    bundle = kube.get_md(NS, NAME)["status"]["stable"]["bundle"]
    _loading_pod(kube, bundle)
    ctrl.request(NS, NAME)  # probes the loading pod: it refuses, so it is remembered as unreachable
    uid = obj["metadata"]["uid"]
    ctrl.queue.tick((NS, NAME))
    ctrl.baselines.delta(uid, bundle, "mark", CohortScrape(bundle, {"p": CohortSample()}))
    ctrl.gate.ensure((uid, bundle), f"http://127.0.0.1:{_closed_port()}")
    assert ctrl.gate.wait((uid, bundle), 60) is not None
    dep = next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")
    assert ctrl.children[dep["metadata"]["uid"]][0] == (NS, NAME)  # remembered when it was created
    assert ctrl.child_event("MODIFIED", {**dep, "status": {"readyReplicas": 1}}) == NAME
    other = {**dep, "metadata": {**dep["metadata"], "uid": "u-other", "ownerReferences": []}}
    assert ctrl.child_event("MODIFIED", other) is None  # owned by no ModelDeployment: kept regardless
    held = ctrl.holds(NS, NAME, uid)
    assert set(held) == {
        "known",
        "uids",
        "own_writes",
        "last_done",
        "_locks",
        "children",
        "object_metrics",
        "queue",
        "probe",
        "nodes",
        "gate",
        "baselines",
    }

    deleted = kube.get_md(NS, NAME)
    kube.remove(MD, NS, NAME)
    assert ctrl.md_event("DELETED", NS, NAME, deleted) is False
    assert ctrl.holds(NS, NAME, uid) == []  # the child's entry too: its own DELETED event may be missed
    assert "u-other" in ctrl.children
    assert (
        ctrl.reconcile(NS, NAME) == [] and ctrl.holds(NS, NAME, uid) == []
    )  # a late tick keeps nothing either


def test_a_reconcile_that_finds_the_object_gone_forgets_it() -> None:
    kube, ctrl, obj = _world()
    ctrl.md_event("ADDED", NS, NAME, obj)
    ctrl.request(NS, NAME)
    kube.remove(MD, NS, NAME)  # the DELETED event has not arrived yet
    assert ctrl.reconcile(NS, NAME) == []
    assert ctrl.holds(NS, NAME, obj["metadata"]["uid"]) == []


def test_an_auto_capacity_choice_reads_fresh_gpu_usage_not_the_cached_node_list() -> None:
    """The node cache (15 s) was filled before the stable's pods were bound: Auto must not take its
    16 spare GPUs for real when the bundle changes (it chose Surge on a full cluster, e2e showed)."""
    kube, ctrl, _ = _world()
    kube.patch(MD, NS, NAME, {"spec": {"replicas": 16}})
    ctrl.reconcile(NS, NAME)  # caches the nodes: nothing bound yet
    dep = next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")
    kube.patch("Deployment", NS, dep["metadata"]["name"], {"status": {"readyReplicas": 16}})
    for i in range(16):  # the stable's pods, bound after the cache was filled: the cluster is full
        kube.put(
            {
                "kind": "Pod",
                "metadata": {"name": f"p{i}", "namespace": "other"},
                "spec": {
                    "nodeName": f"gpu-{i % 2}",
                    "containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}],
                },
            }
        )
    ctrl.reconcile(NS, NAME)
    assert kube.get_md(NS, NAME)["status"]["phase"] == "Stable"
    assert ctrl.nodes.get()[0].requested == 0  # still the stale list
    kube.patch(MD, NS, NAME, {"spec": {"bundle": {"config": {"maxNumSeqs": 2}}}})
    ctrl.reconcile(NS, NAME)
    new = [e["message"] for e in kube.events if e["reason"] == "NewBundle"]
    assert len(new) == 1 and "capacity Replace (Auto:" in new[0] and "0 of 16 GPUs spare" in new[0], new
    assert kube.get_md(NS, NAME)["status"]["rollout"]["capacity"] == "Replace"
    assert ctrl.nodes.get()[0].requested == 8  # relisted for the decision
    ctrl.forget((NS, NAME))  # its per-object gauges live in the process-wide registry other tests read


def test_node_cache_relists_for_a_decision_once_per_wave() -> None:
    from modeldeploy.operator.controller.observe import NodeCache

    kube, now = CountingKube(), [0.0]
    kube.nodes = [_node(0)]
    cache = NodeCache(kube, ttl_s=15.0, clock=lambda: now[0])
    cache.get()
    now[0] = 1.0
    cache.get()
    assert kube.lists == 1  # within the TTL: the cached list
    cache.get(since=0.5)  # a decision whose reconcile began after that list was: relisted
    cache.get(since=0.5)  # another one of the same wave: the list begun at 1.0 serves it too
    cache.get(since=1.0)
    assert kube.lists == 2
    now[0] = 2.0
    cache.get(since=1.5)
    assert kube.lists == 3


def test_no_node_fits_is_judged_on_a_recent_node_list() -> None:
    """Passes plan on a node list up to NODE_TTL_S (60 s) old, but Degraded/Unschedulable only on one at
    most UNFIT_TTL_S (15 s) old: a GPU node added for a new object counts within 15 s."""
    from modeldeploy.operator.controller.observe import NODE_TTL_S, UNFIT_TTL_S, NodeCache

    kube, now = CountingKube(), [100.0]
    kube.nodes = [_node(0)]
    obj = md(topology={"gpusPerReplica": 1, "gpuType": "NVIDIA-B200"})
    obj["metadata"].pop("uid")
    kube.put(obj)
    ctrl = Controller(kube, tick_s=3600.0)
    ctrl.nodes = ctrl.observer.nodes = NodeCache(kube, clock=lambda: now[0])

    def degraded() -> str | None:
        c = [c for c in kube.get_md(NS, NAME)["status"]["conditions"] if c["type"] == "Degraded"]
        return c[0]["reason"] if c and c[0]["status"] == "True" else None

    ctrl.reconcile(NS, NAME)
    assert degraded() == "Unschedulable" and kube.lists == 1
    now[0] += UNFIT_TTL_S / 2
    ctrl.reconcile(NS, NAME)  # still Unschedulable, on a list recent enough: not relisted
    assert degraded() == "Unschedulable" and kube.lists == 1
    kube.nodes.append(
        _node(1) | {"metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "NVIDIA-B200"}}}
    )
    now[0] += UNFIT_TTL_S
    assert now[0] - 100.0 < NODE_TTL_S  # the cached list is still good for every other answer
    ctrl.reconcile(NS, NAME)
    assert kube.lists == 2 and degraded() is None
    assert [n for (k, _, n) in kube.objects if k == "Deployment"]  # the replica is asked for at once


def _stable_pods(
    kube: FakeKube, name: str, bundle: str, n: int, owner: str | None = None, gpus: int = 1
) -> None:
    """`n` pods of a bundle, bound `gpus` GPUs each (the fake API server has no ReplicaSet controller)."""
    for i in range(n):
        kube.put(
            {
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{i}",
                    "namespace": NS,
                    "labels": {"modeldeploy.dev/bundle": bundle, "app.kubernetes.io/instance": owner or name},
                },
                "spec": {
                    "nodeName": f"gpu-{i % 2}",
                    "containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}}}],
                },
                "status": {"phase": "Running"},
            }
        )


def test_a_wave_of_capacity_decisions_subtracts_each_others_canaries() -> None:
    """The 100-rollout starvation: two rollouts deciding on one node list both took the same 4 spare
    GPUs as Surge. The first decision's canary, not yet a pod, is held against the second: Replace."""
    kube = FakeKube()
    kube.nodes = [_node(0), _node(1)]
    ctrl = Controller(kube, tick_s=3600.0)
    ctrl.probe.port = _closed_port()
    stable = {}
    for name in ("a", "b"):
        obj = md(name, replicas=4)
        obj["metadata"].pop("uid")
        kube.put(obj)
        ctrl.reconcile(NS, name)
        stable[name] = kube.get_md(NS, name)["status"]["stable"]["bundle"]
        dep = next(o for (k, ns, n), o in kube.objects.items() if k == "Deployment" and n.startswith(name))
        kube.patch("Deployment", NS, dep["metadata"]["name"], {"status": {"readyReplicas": 4}})
        _stable_pods(kube, name, stable[name], 4)
    kube.put(
        {
            "kind": "Pod",
            "metadata": {"name": "filler", "namespace": "other"},
            "spec": {"nodeName": "gpu-0", "containers": [{"resources": {"limits": {"nvidia.com/gpu": 4}}}]},
        }
    )
    for name in ("a", "b"):  # 12 of 16 GPUs taken: one 4-replica Surge canary fits, not two
        ctrl.reconcile(NS, name)
        assert kube.get_md(NS, name)["status"]["phase"] == "Stable"
    for name in ("a", "b"):
        kube.patch(MD, NS, name, {"spec": {"bundle": {"config": {"maxNumSeqs": 2}}}})
    ctrl.reconcile(NS, "a")
    canary = kube.get_md(NS, "a")["status"]["canary"]["bundle"]
    # another object already serves a's new bundle id (ids hash the bundle only: the 100-rollout
    # bench's objects all share one): its pods are not a's, so a's claim still holds 4 GPUs
    _stable_pods(kube, "z", canary, 4, gpus=0)
    ctrl.reconcile(NS, "b")  # a's canary Deployment has no pod yet
    modes = {n: kube.get_md(NS, n)["status"]["rollout"]["capacity"] for n in ("a", "b")}
    assert modes == {"a": "Surge", "b": "Replace"}, modes
    new = [e["message"] for e in kube.events if e["reason"] == "NewBundle" and "Replace" in e["message"]]
    assert len(new) == 1 and "0 of 16 GPUs spare" in new[0], new
    # once a's canary pods exist they are counted as pods, and a's claim no longer: nothing twice
    _stable_pods(kube, "a-canary", canary, 4, owner="a")
    ctrl.nodes.get(since=ctrl.nodes.clock())
    assert sum(n.requested for n in ctrl.nodes.for_decision((NS, "b"), ctrl.nodes.clock() - 1)) == 16
    for name in ("a", "b"):
        ctrl.forget((NS, name))


def test_the_echo_of_a_status_write_delivered_before_the_write_returns_costs_no_second_pass() -> None:
    """With the workers, a watch event can be handled while the pass that caused it still runs,
    before that pass has recorded its write: the ask is checked again once the pass ends."""
    kube, _, _ = _world()
    ctrl = Controller(kube, tick_s=3600.0, workers=2)
    ctrl.probe.port = _closed_port()
    write, asked = kube.replace_status, []

    def replace_status(namespace: str, name: str, status: dict[str, Any]) -> str:
        version = write(namespace, name, status)
        echo = kube.get_md(namespace, name)  # its watch event, handled before this call returns
        if ctrl.md_event("MODIFIED", namespace, name, echo):  # not recorded yet: it looks like news
            asked.append(version)
            ctrl.enqueue(namespace, name, "modeldeployment", echo["metadata"]["resourceVersion"])
        return version

    kube.replace_status = replace_status
    ctrl.enqueue(NS, NAME)
    deadline = time.monotonic() + 10
    while (ctrl.reconciles < 1 or ctrl.queue.holds((NS, NAME))) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert asked and ctrl.reconciles == 1  # the early echo was asked for, and ran no second pass
    assert ctrl.due((NS, NAME), 0.0)  # idle again: the resync may take it
    ctrl.queue.tick((NS, NAME))
    assert not ctrl.due((NS, NAME), 0.0)  # a tick pending: the resync leaves it to the tick
    ctrl.forget((NS, NAME))  # nothing left behind: its gauges are global
