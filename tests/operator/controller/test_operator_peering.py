"""Peering (operator/controller/peering.py): the oldest replica has the highest priority, kopf's activity
rule on the peering object's status, the per-scope cache, and the Controller's standby gate."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from support.fake_kube import MD, FakeKube
from support.operator_fixtures import md

from modeldeploy.operator.controller import metrics
from modeldeploy.operator.controller.peering import CACHE_S, Peering, PeeringConfig, is_active, start_priority
from modeldeploy.operator.controller.reconciler import Controller

NOW = dt.datetime(2026, 12, 1, 20, 0, tzinfo=dt.UTC)


def peer(priority: int, seen_s_ago: float = 1, lifetime: int = 60) -> dict[str, Any]:
    return {
        "priority": priority,
        "lifetime": lifetime,
        "lastseen": (NOW - dt.timedelta(seconds=seen_s_ago)).isoformat(),
    }


def test_the_older_replica_has_the_higher_priority_and_ties_break_on_the_tail() -> None:
    assert start_priority(1000.0, 999) > start_priority(1000.001, 0)  # 1 ms older wins over any tail
    assert start_priority(1000.0, 1) > start_priority(1000.0, 2)
    assert abs(start_priority()) < 2**53  # exact as a JSON number


def test_active_unless_a_live_peer_has_a_priority_as_high() -> None:
    me = "op-a"
    assert is_active({}, me, 5, NOW)
    assert is_active({me: peer(5), "op-b": peer(4)}, me, 5, NOW)
    assert not is_active({me: peer(5), "op-b": peer(6)}, me, 5, NOW)
    assert not is_active({"op-b": peer(5)}, me, 5, NOW)  # equal priorities: kopf pauses both
    assert is_active({"op-b": peer(9, seen_s_ago=61)}, me, 5, NOW)  # dead: its lifetime is over
    assert is_active({"op-b": peer(9, seen_s_ago=2, lifetime=0)}, me, 5, NOW)  # left (SIGTERM)
    assert is_active({me: peer(1)}, me, 5, NOW)  # our own stale entry (a restarted container)


class FakeCustom:
    def __init__(self) -> None:
        self.status: dict[str, Any] | None = {}
        self.reads = 0

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
        assert (group, plural, name) == ("kopf.dev", "clusterkopfpeerings", "modeldeploy")
        self.reads += 1
        if self.status is None:
            raise ApiException(status=404)
        return {"status": self.status}


def test_peering_reads_the_object_once_per_cache_period_and_a_missing_object_is_standby() -> None:
    now = [0.0]
    custom = FakeCustom()
    p = Peering(custom, PeeringConfig("modeldeploy", "op-a", 5, clusterwide=True), clock=lambda: now[0])
    fresh = dt.datetime.now(dt.UTC).isoformat()
    custom.status = {"op-a": {"priority": 5, "lastseen": fresh}, "op-b": {"priority": 7, "lastseen": fresh}}
    assert p.active("ns1") is False and p.active("ns2") is False and custom.reads == 1  # one cluster scope
    custom.status = {"op-a": {"priority": 5, "lastseen": fresh}}  # op-b left
    assert p.active("ns1") is False  # cached
    now[0] += CACHE_S
    assert p.active("ns1") is True and custom.reads == 2
    custom.status = None
    now[0] += CACHE_S
    assert p.active("ns1") is False


def test_a_standby_controller_does_not_reconcile() -> None:
    kube = FakeKube()
    obj = md()
    obj["metadata"].pop("uid")
    kube.put(obj)
    active = [False]
    ctrl = Controller(kube, tick_s=3600.0, leader=lambda ns: active[0])
    before = metrics.STANDBY_SKIPS._value.get()
    ctrl.md_event("ADDED", obj["metadata"]["namespace"], obj["metadata"]["name"], obj)
    assert ctrl.reconcile(obj["metadata"]["namespace"], obj["metadata"]["name"]) == []
    assert [k for (k, _, _) in kube.objects if k != MD] == [] and ctrl.reconciles == 0
    assert not ctrl.queue.holds((obj["metadata"]["namespace"], obj["metadata"]["name"]))  # no tick either
    assert metrics.STANDBY_SKIPS._value.get() == before + 1
    active[0] = True
    assert ctrl.reconcile(obj["metadata"]["namespace"], obj["metadata"]["name"]) != []
    assert ctrl.reconciles == 1


@pytest.mark.parametrize("standalone", [True, False])
def test_the_cli_passes_identity_and_priority_to_kopf_only_with_peering(
    monkeypatch, standalone: bool
) -> None:
    import argparse

    import kopf

    from modeldeploy.operator import cli
    from modeldeploy.operator.controller import peering

    seen: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kw: seen.update(kw))
    monkeypatch.setattr(peering, "CONFIG", None)
    monkeypatch.setenv("POD_ID", "mdop-abc")
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    argv = ["--peering=modeldeploy", "--metrics-port=0", "--health-port=0"] + (
        ["--standalone"] if standalone else []
    )
    cli.main(parser.parse_args(argv))
    if standalone:
        assert seen["identity"] is None and seen["priority"] is None and peering.CONFIG is None
    else:
        assert seen["identity"] == "mdop-abc" and isinstance(seen["priority"], int)
        assert peering.CONFIG == PeeringConfig("modeldeploy", "mdop-abc", seen["priority"], True)
