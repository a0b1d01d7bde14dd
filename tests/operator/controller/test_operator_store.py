"""The watch-fed Store and a Controller reading from it: newer copies win, our own deletes stay deleted,
children are served only once known complete, and a resync or a raced write reads fresh again."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from support.fake_kube import MD, FakeKube
from support.operator_fixtures import md

from modeldeploy.operator.controller.reconciler import Controller
from modeldeploy.operator.controller.store import Store
from modeldeploy.operator.rollout.bundle import INSTANCE_LABEL, MANAGED_BY

NS, NAME = "ns", "chat"
LABELS = {INSTANCE_LABEL: NAME, "app.kubernetes.io/managed-by": MANAGED_BY}


def _child(name: str, rv: int, uid: str = "", owner: str = "md-uid", kind: str = "Service") -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid or f"u-{name}",
            "resourceVersion": str(rv),
            "labels": dict(LABELS),
            "managedFields": [{"manager": "x"}],
            "ownerReferences": [{"kind": MD, "uid": owner, "controller": True, "name": NAME}],
        },
        "spec": {"rv": rv},
    }


def test_a_newer_copy_wins_whichever_arrives_first() -> None:
    store = Store()
    store.put(_child("a", 5))
    store.put(_child("a", 3))  # a watch event older than our write's response
    store.complete("md-uid")
    assert [o["spec"]["rv"] for o in store.children("Service", "md-uid", NAME)] == [5]
    store.put(_child("a", 7))
    kept = store.children("Service", "md-uid", NAME)[0]
    assert kept["spec"]["rv"] == 7 and "managedFields" not in kept["metadata"]
    kept["spec"]["rv"] = 99  # a handed-out copy is the caller's own
    assert store.children("Service", "md-uid", NAME)[0]["spec"]["rv"] == 7


def test_children_are_served_only_once_known_complete_and_as_the_list_would_find_them() -> None:
    store = Store()
    store.put(_child("b", 2))
    store.put(_child("a", 1))
    store.put(_child("d", 3, kind="Deployment"))
    other = _child("c", 4)
    other["metadata"]["labels"][INSTANCE_LABEL] = "someone-else"
    store.put(other)
    assert store.children("Service", "md-uid", NAME) is None  # seen only in a listing: not known complete
    store.complete("md-uid")
    assert [o["metadata"]["name"] for o in store.children("Service", "md-uid", NAME)] == ["a", "b"]
    assert [o["metadata"]["name"] for o in store.children("Deployment", "md-uid", NAME)] == ["d"]
    assert store.children("Service", "another-owner", NAME) is None


def test_our_delete_is_not_undone_by_a_late_event_and_a_stale_deleted_event_spares_the_new_object() -> None:
    store = Store()
    store.complete("md-uid")
    store.put(_child("a", 5, uid="old"))
    store.drop("Service", NS, "a")  # our delete succeeded
    store.put(_child("a", 6, uid="old"))  # the watch's MODIFIED (deletionTimestamp set) comes later
    assert store.children("Service", "md-uid", NAME) == []
    store.put(_child("a", 8, uid="new"))  # created again under the same name
    store.drop("Service", NS, "a", uid="old")  # the old object's DELETED event, late
    assert [o["metadata"]["uid"] for o in store.children("Service", "md-uid", NAME)] == ["new"]
    store.drop("Service", NS, "a", uid="new")
    assert store.children("Service", "md-uid", NAME) == []


def test_a_fresh_list_replaces_the_kept_children_and_drops_ghosts() -> None:
    store = Store()
    store.put(_child("ghost", 1))  # deleted during a watch gap: no DELETED event ever came
    store.put(_child("kept", 2))
    store.put(_child("d", 3, kind="Deployment"))
    listed = [copy.deepcopy(_child("kept", 4)), copy.deepcopy(_child("new", 5))]
    for o in listed:
        del o["kind"]  # LIST items carry no kind
    store.replace("md-uid", NS, {"Service": listed, "Deployment": []})
    assert [o["metadata"]["name"] for o in store.children("Service", "md-uid", NAME)] == ["kept", "new"]
    assert store.children("Deployment", "md-uid", NAME) == []
    store.forget(NS, NAME, "md-uid")
    assert not store.holds(NS, NAME, "md-uid") and store.children("Service", "md-uid", NAME) is None


class CountingKube(FakeKube):
    """FakeKube that counts the reads a pass makes."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    def get_md(self, ns: str, name: str) -> dict[str, Any] | None:
        self.reads["get"] += 1
        return super().get_md(ns, name)

    def list(self, kind: str, ns: str, selector: str) -> list[dict[str, Any]]:
        self.reads[kind] += 1
        return super().list(kind, ns, selector)


def _world() -> tuple[CountingKube, Controller, dict[str, Any]]:
    kube = CountingKube()
    kube.nodes = [
        {
            "metadata": {"name": "gpu-0", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
    ]
    obj = md()
    obj["metadata"].pop("uid")
    obj = kube.put(obj)
    return kube, Controller(kube, tick_s=3600.0, cache=True), obj


def _phase(kube: FakeKube) -> str:
    return kube.objects[(MD, NS, NAME)]["status"]["phase"]  # not get_md: that counts as a read


def _deployment(kube: FakeKube) -> dict[str, Any]:
    return next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")


def test_a_new_object_reconciles_to_stable_without_reading_itself_or_its_children() -> None:
    kube, ctrl, obj = _world()
    assert ctrl.md_event("ADDED", NS, NAME, obj)  # created while we watch
    ctrl.reconcile(NS, NAME)
    assert _phase(kube) == "Deploying"
    dep = _deployment(kube)
    n = dep["spec"]["replicas"]
    ready = kube.patch("Deployment", NS, dep["metadata"]["name"], {"status": {"readyReplicas": n}})
    assert ctrl.child_event("MODIFIED", ready) == NAME  # the watch tells the store, and asks for a pass
    ctrl.reconcile(NS, NAME)
    assert _phase(kube) == "Stable"
    assert {k: n for k, n in kube.reads.items() if k != "Pod"} == {}  # no GET, no Deployment/Service LIST
    created = [e["message"] for e in kube.events if e["reason"] == "Created"]
    assert len(created) == 1 and created[0].count("Service") == 1 and "Deployment" in created[0], created
    assert ctrl.reconcile(NS, NAME) == []  # converged on what the store holds


def test_an_object_seen_only_in_a_listing_reads_its_children_fresh_once() -> None:
    kube, ctrl, obj = _world()
    ctrl.md_event(None, NS, NAME, obj)  # kopf's initial listing: children may predate us
    ctrl.reconcile(NS, NAME)
    assert (kube.reads["Deployment"], kube.reads["Service"], kube.reads["get"]) == (1, 1, 0)
    ctrl.reconcile(NS, NAME)
    assert (kube.reads["Deployment"], kube.reads["Service"]) == (1, 1)  # the first LIST filled the store


def test_a_resync_pass_reads_fresh_and_puts_back_a_child_whose_delete_the_watch_missed() -> None:
    kube, ctrl, obj = _world()
    ctrl.md_event("ADDED", NS, NAME, obj)
    ctrl.reconcile(NS, NAME)
    dep = _deployment(kube)
    kube.remove("Deployment", NS, dep["metadata"]["name"])  # no DELETED event reaches the store
    assert ctrl.reconcile(NS, NAME) == []  # an event-driven pass trusts the store
    ctrl.request(NS, NAME, "resync")
    assert kube.reads["get"] == 1 and kube.reads["Deployment"] == 1
    assert any(k == "Deployment" for (k, _, _) in kube.objects)  # created again
    ctrl.forget((NS, NAME))
    assert ctrl.holds(NS, NAME, obj["metadata"]["uid"]) == []


def test_a_create_that_meets_409_makes_the_next_pass_read_fresh() -> None:
    kube, ctrl, obj = _world()
    ctrl.md_event("ADDED", NS, NAME, obj)
    ctrl.reconcile(NS, NAME)
    svc = next(o for (k, _, n), o in kube.objects.items() if k == "Service" and n == NAME)
    ctrl.store.drop("Service", NS, NAME, svc["metadata"]["uid"])  # a DELETED event for it, then...
    kube.put(svc)  # ...someone created it again, and its ADDED event is still on the way
    ctrl.reconcile(NS, NAME)  # plans a create from the store: 409
    assert (NS, NAME) in ctrl.doubted and ctrl.queue.holds((NS, NAME))  # asked for again, fresh
    lists = kube.reads["Service"]
    ctrl.reconcile(NS, NAME)
    assert kube.reads["Service"] == lists + 1 and (NS, NAME) not in ctrl.doubted
    assert ctrl.reconcile(NS, NAME) == []
    ctrl.forget((NS, NAME))


def test_a_changed_spec_reaches_the_pass_through_the_watch_event() -> None:
    kube, ctrl, obj = _world()
    ctrl.md_event("ADDED", NS, NAME, obj)
    ctrl.reconcile(NS, NAME)
    changed = kube.patch(MD, NS, NAME, {"spec": {"replicas": 3}})
    assert ctrl.md_event("MODIFIED", NS, NAME, changed)
    ctrl.reconcile(NS, NAME)
    assert _deployment(kube)["spec"]["replicas"] == 3 and kube.reads["get"] == 0
    ctrl.forget((NS, NAME))
