"""examples/autoscaling: an HPA on the runtime's queue depth through prometheus-adapter,
and a KEDA ScaledObject with a Prometheus trigger on `modeldeploy_requests_waiting`.

Checked here: both aim at the example ModelDeployment through the CRD's scale subresource, on a metric
the runtime exports; the ScaledObject against KEDA's own CRD schema (pinned module, unknown fields
refused); the adapter rule exposes the metric name the HPA asks for. e2e/test_autoscaling.py has the
real API server check both (server-side dry run, strict field validation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.chart_strict import errors, strict

from modeldeploy.conformance.measures import WAITING
from modeldeploy.operator.api import crd
from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, KIND, VERSION

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "autoscaling"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EX / name).read_text()) if d]


def target_name() -> str:
    return yaml.safe_load((ROOT / "examples" / "modeldeployment-tiny.yaml").read_text())["metadata"]["name"]


def test_the_crd_has_the_scale_subresource_the_autoscalers_use() -> None:
    doc = yaml.safe_load((ROOT / crd.CRD_PATH).read_text())
    [version] = doc["spec"]["versions"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_hpa_targets_the_model_deployment_on_the_adapter_metric() -> None:
    adapter, hpa = docs("hpa-requests-waiting.yaml")
    assert (hpa["apiVersion"], hpa["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert ref == {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": target_name()}
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == WAITING
    assert metric["pods"]["target"]["type"] == "AverageValue"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    [rule] = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["seriesQuery"].startswith(WAITING + "{") and rule["name"]["as"] == WAITING
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}  # a per-pod metric, as type Pods needs


@pytest.fixture(scope="module")
def scaledobject_schema() -> dict[str, Any]:
    upstream = pytest.importorskip("modeldeploy_dev.upstream_crds")
    if upstream.go() is None:
        pytest.skip("Go is needed to read the pinned KEDA CRDs (see .ci/run)")
    doc = yaml.safe_load(upstream.keda_scaledobject_crd_file().read_text())
    [version] = [v for v in doc["spec"]["versions"] if v["served"] and v["storage"]]
    return {
        "apiVersion": f"{doc['spec']['group']}/{version['name']}",
        "schema": strict(version["schema"]["openAPIV3Schema"]),
    }


def test_keda_scaled_object_passes_kedas_crd_and_queries_the_queue_depth(scaledobject_schema: dict) -> None:
    [so] = docs("keda-scaledobject.yaml")
    assert so["apiVersion"] == scaledobject_schema["apiVersion"] and so["kind"] == "ScaledObject"
    assert errors(scaledobject_schema["schema"], so) == []
    ref = so["spec"]["scaleTargetRef"]
    assert ref == {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": target_name()}
    [trigger] = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and WAITING + "{" in trigger["metadata"]["query"]
    assert (
        f'modeldeployment="{target_name()}"' in trigger["metadata"]["query"]
    )  # the chart PodMonitor's label
    float(trigger["metadata"]["threshold"])
    # the check can fail: a misspelt field is refused
    bad = yaml.safe_load(yaml.safe_dump(so))
    bad["spec"]["maxReplicas"] = bad["spec"].pop("maxReplicaCount")
    assert any("maxReplicas" in e for e in errors(scaledobject_schema["schema"], bad))
