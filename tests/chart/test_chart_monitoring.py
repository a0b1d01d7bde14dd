"""The chart's monitoring objects: off by default; when enabled, valid against
the real prometheus-operator CRDs (pinned module) and aimed at the pods the operator labels.

The CRD check is structural: each rendered object is validated against its CRD's
openAPIV3Schema, with unknown fields refused (the API server would prune them silently, so a
typo such as `podMetricEndpoints` would ship a monitor that scrapes nothing).
e2e/test_operator_chart.py applies the same objects to a real API server holding those CRDs.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml
from support.chart import CHART, helm
from support.chart_strict import errors, strict
from support.operator_fixtures import md

from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.rollout import children
from modeldeploy.operator.rollout.bundle import bundle_id

MONITORING = (
    "monitoring.podMonitor.enabled=true",
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
    "monitoring.podMonitor.labels.release=kube-prometheus-stack",
)
needs_helm = pytest.mark.skipif(helm() is None, reason="helm not built yet: run `make cluster-build`")


def render(*sets: str) -> list[dict[str, Any]]:
    args = [helm(), "template", "md", str(CHART), "--kube-version", "1.36.3", "-n", "modeldeploy-system"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module")
def crd_schemas() -> dict[str, Any]:
    upstream = pytest.importorskip("modeldeploy_dev.upstream_crds")
    if upstream.go() is None:
        pytest.skip("Go is needed to read the pinned prometheus-operator CRDs (see .ci/run)")
    out = {}
    for kind, crd in upstream.monitoring_crds().items():
        [version] = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
        out[kind] = (
            f"{crd['spec']['group']}/{version['name']}",
            strict(version["schema"]["openAPIV3Schema"]),
        )
    return out


@needs_helm
def test_monitoring_is_off_by_default() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap"}, kinds


@needs_helm
def test_enabled_objects_pass_the_prometheus_operator_crds(crd_schemas: dict[str, Any]) -> None:
    docs = {d["kind"]: d for d in render(*MONITORING)}
    for kind, (api_version, schema) in crd_schemas.items():
        obj = docs[kind]
        assert obj["apiVersion"] == api_version
        assert errors(schema, obj) == [], kind
    # the check can fail: a misspelt field and a wrong type are refused
    bad = yaml.safe_load(yaml.safe_dump(docs["PodMonitor"]))
    bad["spec"]["podMetricEndpoints"] = bad["spec"].pop("podMetricsEndpoints")
    assert any("podMetricEndpoints" in e for e in errors(crd_schemas["PodMonitor"][1], bad))
    bad = yaml.safe_load(yaml.safe_dump(docs["PrometheusRule"]))
    bad["spec"]["groups"][1]["rules"][0]["for"] = 5
    assert errors(crd_schemas["PrometheusRule"][1], bad)


@needs_helm
def test_pod_monitor_selects_the_pods_the_operator_makes() -> None:
    obj = md()
    spec = ModelDeploymentSpec.model_validate(obj["spec"])
    bid = bundle_id(spec.bundle)
    obj["metadata"]["uid"] = "u"
    pod = children.deployment(obj, spec, bid, 1)["spec"]["template"]
    pm = next(d for d in render(*MONITORING) if d["kind"] == "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
    [ep] = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] in ports and ep["path"] == "/metrics"
    # the ModelDeployment's name becomes the `modeldeployment` target label, from the pod label holding it
    [rl] = ep["relabelings"]
    label = rl["sourceLabels"][0].removeprefix("__meta_kubernetes_pod_label_")
    assert rl["targetLabel"] == "modeldeployment"
    assert {
        k.replace(".", "_").replace("/", "_").replace("-", "_"): v
        for k, v in pod["metadata"]["labels"].items()
    }[label] == obj["metadata"]["name"]
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    scoped = next(
        d for d in render(*MONITORING, "watchNamespaces={team-a,team-b}") if d["kind"] == "PodMonitor"
    )
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


@needs_helm
def test_service_monitor_scrapes_the_operator_metrics_port() -> None:
    docs = render(*MONITORING)
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor")
    svc = next(d for d in docs if d["kind"] == "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    [ep] = sm["spec"]["endpoints"]
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]} and ep["honorLabels"] is True


@needs_helm
def test_prometheus_rule_carries_the_rules_file_and_every_alert() -> None:
    rule = next(d for d in render(*MONITORING) if d["kind"] == "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert alerts == {
        "ModelDeploymentRolloutStuck",
        "ModelDeploymentDegraded",
        "ModelDeploymentLoadTimeout",
        "ModelDeploymentCanaryErrorRateHigh",
        "ModelDeploymentQualityRegression",
        "ModelDeploymentKVCacheFull",
        "ModelDeploymentQueueFull",
    }


@needs_helm
def test_helm_rejects_unknown_monitoring_value() -> None:
    r = subprocess.run(
        [helm(), "template", "md", str(CHART), "--set", "monitoring.podMonitor.enable=true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "enable" in r.stderr


@needs_helm
def test_dashboard_config_map_carries_the_dashboard_for_the_grafana_sidecar() -> None:
    import json

    docs = render(*MONITORING, "monitoring.dashboard.annotations.grafana_folder=LLM")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    shipped = (CHART / "dashboards" / "modeldeploy.json").read_text()
    assert json.loads(cm["data"]["modeldeploy.json"]) == json.loads(shipped)
