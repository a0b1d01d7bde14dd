"""apply(): consecutive Creates and Events of a plan go to the API server together, everything else
alone and in plan order; a refused action does not stop the others."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from support.fake_kube import MD, FakeKube
from support.operator_fixtures import md

from modeldeploy.operator.controller.apply import ApplyError, Hooks, apply, batches
from modeldeploy.operator.rollout.actions import Create, Delete, Event, Patch, PatchStatus


def _svc(name: str) -> dict[str, Any]:
    return {"kind": "Service", "metadata": {"name": name}, "spec": {}}


def test_batches_group_consecutive_creates_and_events_and_keep_the_rest_alone_in_order() -> None:
    c1, e1, c2 = Create(_svc("a")), Event("Normal", "Created", "a"), Create(_svc("b"))
    p, d, s = Patch("Deployment", "x", {}), Delete("Service", "old"), PatchStatus({"phase": "Stable"})
    e2 = Event("Normal", "Promoted", "x")
    assert list(batches([c1, e1, c2, p, d, e2, s])) == [[c1, e1, c2], [p], [d], [e2], [s]]
    assert list(batches([s])) == [[s]] and list(batches([])) == []


def _world() -> tuple[FakeKube, dict[str, Any]]:
    kube = FakeKube()
    return kube, kube.put(md())


def test_a_batch_runs_through_the_given_together_and_status_after_it() -> None:
    kube, obj = _world()
    seen: list[list[str]] = []

    def together(fn, batch):  # what a pool's map does, recording each batch
        seen.append([type(a).__name__ for a in batch])
        return map(fn, batch)

    written: list[str] = []
    acts = [
        Create(_svc("s1")),
        Event("Normal", "Created", "s1"),
        Create(_svc("s2")),
        PatchStatus({"phase": "Deploying"}),
    ]
    apply(kube, obj, acts, "2026-12-02T00:00:00Z", Hooks(status_written=written.append), together)
    assert seen == [["Create", "Event", "Create"]]  # the status write is not part of a batch
    assert {n for (k, _, n) in kube.objects if k == "Service"} == {"s1", "s2"}
    assert (
        written
        and kube.get_md(obj["metadata"]["namespace"], obj["metadata"]["name"])["status"]["phase"]
        == "Deploying"
    )
    assert [e["reason"] for e in kube.events] == ["Created"]


def test_a_refused_create_in_a_batch_does_not_stop_the_others() -> None:
    kube, obj = _world()
    real = kube.create

    def create(ns: str, o: dict[str, Any]) -> dict[str, Any]:
        if o["metadata"]["name"] == "bad":
            raise ApiException(status=422, reason="Invalid")
        return real(ns, o)

    kube.create = create
    with pytest.raises(ApplyError, match="create Service bad"):
        apply(
            kube,
            obj,
            [Create(_svc("bad")), Create(_svc("good")), PatchStatus({"phase": "Deploying"})],
            "t",
        )
    assert ("Service", obj["metadata"]["namespace"], "good") in kube.objects
    assert (
        kube.objects[(MD, obj["metadata"]["namespace"], obj["metadata"]["name"])]["status"]["phase"]
        == "Deploying"
    )
    assert [e["reason"] for e in kube.events] == ["ApplyFailed"]
