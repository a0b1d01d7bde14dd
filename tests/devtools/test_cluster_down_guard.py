"""`cluster down NAME` of a cluster `up` never recorded (or already down) must not tear down the default
bridge's namespaces: they may be another live cluster's (a manual `down` once broke a running CI
cluster's pod network this way). A recorded cluster's own network is still destroyed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from modeldeploy_dev.cluster import local
from modeldeploy_dev.procnode import net


@pytest.fixture
def destroyed(tmp_path, monkeypatch) -> list[tuple[str, str]]:
    monkeypatch.setenv("MODELDEPLOY_CACHE", str(tmp_path))
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(net.Network, "destroy_all", lambda self: calls.append((self.bridge, str(self.net))))
    return calls


def test_down_of_an_unrecorded_cluster_leaves_every_network_alone(destroyed) -> None:
    local.LocalCluster.existing("gone").down(log=lambda *a: None)
    assert destroyed == []


def test_down_of_a_recorded_cluster_destroys_its_own_network(destroyed) -> None:
    c = local.LocalCluster(local.Settings(name="mine", bridge="mdbr42", pod_cidr="10.244.42.0/24"))
    c.run_dir.mkdir(parents=True)
    c.settings_file.write_text(json.dumps(dataclasses.asdict(c.s)))
    local.LocalCluster.existing("mine").down(log=lambda *a: None)
    assert destroyed == [("mdbr42", "10.244.42.0/24")]
