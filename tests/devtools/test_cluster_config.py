"""The kwokctl configuration `cluster up` writes: component flags that decide what the local cluster
can sustain. kube-controller-manager's and kube-scheduler's default client rate limits (20 and 50
QPS) would cap every bench with hundreds of objects, whatever the operator does."""

from __future__ import annotations

import yaml

from modeldeploy_dev.cluster import local


def patches(tmp_path, monkeypatch, **settings) -> dict[str, dict[str, str]]:
    monkeypatch.setenv("MODELDEPLOY_CACHE", str(tmp_path))
    cfg, *_stages = yaml.safe_load_all(
        local.LocalCluster(local.Settings(**settings))._config_file().read_text()
    )
    return {p["name"]: {a["key"]: a["value"] for a in p["extraArgs"]} for p in cfg["componentsPatches"]}


def test_controller_manager_and_scheduler_run_without_the_default_client_rate_limits(
    tmp_path, monkeypatch
) -> None:
    got = patches(tmp_path, monkeypatch, name="cfg")
    for component in ("kube-controller-manager", "kube-scheduler"):
        assert float(got[component]["kube-api-qps"]) >= 100, component
        assert int(got[component]["kube-api-burst"]) >= float(got[component]["kube-api-qps"]), component
    assert got["kwok-controller"]["manage-all-nodes"] == "false"  # the process node stays real
