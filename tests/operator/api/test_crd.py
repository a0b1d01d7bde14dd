"""The CRD is generated from the API types; committed copies must match, and its rules must bite."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fixtures import DIGEST, IMAGE, md
from pydantic import ValidationError

from modeldeploy.operator.api import crd
from modeldeploy.operator.api.v1alpha1.modeldeployment import (
    MSG_GRAPHS_CPU,
    MSG_GRAPHS_TP,
    MSG_TP_ADAPTERS,
    MSG_TP_CPU,
    ModelDeploymentSpec,
)
from modeldeploy.operator.api.v1alpha1.topology import MSG_TP

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("rel", list(crd.outputs()), ids=str)
def test_committed_generated_files_match(rel: Path) -> None:
    committed = (ROOT / rel).read_text()
    assert committed == crd.outputs()[rel], f"{rel} is stale: run `make crds`"


def test_rbac_has_no_wildcards_or_secrets() -> None:
    from modeldeploy.operator.api.rbac import rules

    for r in rules():
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in r[field], r
        assert "secrets" not in r["resources"]


def _walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.get("properties", {}).items():
            yield from _walk(v, f"{path}.{k}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def schema() -> dict[str, Any]:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_schema_is_structural_and_described() -> None:
    for path, node in _walk(schema()):
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "title"):
            assert banned not in node, f"{path} has {banned}"
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        if node.get("type") == "object":
            assert not ("properties" in node and "additionalProperties" in node), path
        primitive_item = path.endswith(("[]", "{}")) and node.get("type") != "object"
        if path.startswith(".spec.") and not primitive_item:
            assert node.get("description"), f"{path} has no description (kubectl explain)"


def test_defaults_are_in_schema() -> None:
    spec = schema()["properties"]["spec"]["properties"]
    assert spec["replicas"]["default"] == 1
    assert (
        spec["topology"]["default"]["gpusPerReplica"] == 1
        and spec["topology"]["default"]["tensorParallel"] == 1
    )
    assert spec["topology"]["properties"]["tolerations"]["default"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert spec["rollout"]["properties"]["steps"]["default"][0] == {
        "weight": 10,
        "pauseSeconds": 60,
        "awaitPromotion": False,
    }


def rules(path: str) -> list[dict[str, str]]:
    node = schema()
    for part in path.split("."):
        node = node["properties"][part]
    return node["x-kubernetes-validations"]


def test_cel_rules_and_messages_present() -> None:
    assert "sha256" in rules("spec.bundle.engine.image")[0]["message"]
    assert "64" in rules("spec.bundle.model.digest")[0]["message"]
    assert "divide" in rules("spec.topology")[0]["message"]
    assert "strictly increasing" in rules("spec.rollout.steps")[0]["message"]
    # the CEL regexes are the same ones pydantic enforces; RE2 has no \s-style escapes inside CEL strings
    for r in (rules("spec.bundle.engine.image")[0], rules("spec.bundle.model.digest")[0]):
        pattern = re.search(r"matches\('(.*)'\)", r["rule"]).group(1)
        assert "\\" not in pattern


def test_subresources_columns_shortname() -> None:
    c = crd.crd()["spec"]
    v = c["versions"][0]
    assert c["names"]["shortNames"] == ["md"] and v["subresources"]["status"] == {}
    assert v["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert [col["name"] for col in v["additionalPrinterColumns"]] == [
        "Phase",
        "Stable",
        "Canary",
        "Weight",
        "Ready",
        "Age",
    ]


def test_valid_spec_parses_with_defaults() -> None:
    spec = ModelDeploymentSpec.model_validate(md()["spec"])
    assert spec.topology.tolerations[0].key == "nvidia.com/gpu" and spec.rollout.steps[-1].weight == 50


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("bundle", "engine", "image"), "registry.local/modeldeploy:v1", "pinned by digest"),
        (("bundle", "engine", "image"), "registry.local/modeldeploy@sha256:abc", "pinned by digest"),
        (("bundle", "model", "digest"), "sha256:" + "Z" * 64, "64 lowercase hex"),
        (("bundle", "tokenizer", "digest"), "md5:" + "0" * 32, "64 lowercase hex"),
        (("bundle", "model", "uri"), "hf://org/model", "pvc://"),
        (("bundle", "tokenizer", "uri"), "pvc://other/tok", "tokenizer.uri must be omitted"),
        (("topology",), {"gpusPerReplica": 4, "tensorParallel": 3}, "must divide"),
        (("topology",), {"gpusPerReplica": 0, "tensorParallel": 2}, "needs bundle.config.device: cpu"),
        (("topology",), {"gpusPerReplica": 2, "tensorParallel": 4}, "must divide"),
        (("rollout", "steps"), [{"weight": 50}, {"weight": 10}], "strictly increasing"),
        (("rollout", "steps"), [{"weight": 10}, {"weight": 10}], "strictly increasing"),
        (("rollout", "steps"), [{"weight": 101}], "less than or equal to 100"),
        (("bundle", "config", "maxNumSeq"), 4, "Extra inputs are not permitted"),
        (("rollout", "steps"), [{"weight": 10, "replicas": "150%"}], "percentage of spec.replicas"),
        (("rollout", "steps"), [{"weight": 10, "replicas": "two"}], "percentage of spec.replicas"),
        (("rollout", "steps"), [{"weight": 10, "replicas": -1}], "percentage of spec.replicas"),
    ],
)
def test_invalid_specs_rejected_with_message(path: tuple[str, ...], value: Any, needle: str) -> None:
    obj = md()["spec"]
    node = obj
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(ValidationError) as e:
        ModelDeploymentSpec.model_validate(obj)
    assert needle in str(e.value)


def test_yaml_header_says_generated() -> None:
    text = crd.render()
    assert text.startswith("# Generated by `modeldeploy crd`")
    assert yaml.safe_load(text)["metadata"]["name"] == "modeldeployments.serving.modeldeploy.dev"
    assert IMAGE and DIGEST  # fixtures are valid pins
    ModelDeploymentSpec.model_validate(md()["spec"])


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples").glob("modeldeployment-*.yaml")), ids=lambda p: p.name
)
def test_examples_are_valid_modeldeployments(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "ModelDeployment":
            ModelDeploymentSpec.model_validate(doc["spec"])


def test_numeric_bounds_are_numbers() -> None:
    for path, node in _walk(schema()):
        for key in ("minimum", "maximum"):
            if key in node:
                assert type(node[key]) in (int, float), f"{path}.{key} = {node[key]!r}"
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def spec_rules() -> list[dict[str, str]]:
    return schema()["properties"]["spec"]["x-kubernetes-validations"]


def _tp_spec(gpus: int, tp: int, device: str = "auto", adapters: list | None = None) -> dict[str, Any]:
    obj = md()["spec"]
    obj["topology"] = {"gpusPerReplica": gpus, "tensorParallel": tp}
    obj["bundle"]["config"]["device"] = device
    if adapters is not None:
        obj["bundle"]["adapters"] = adapters
    return obj


ADAPTER = {"name": "tenant-a", "uri": "pvc://adapters/a", "revision": "a1", "digest": DIGEST}


def test_tensor_parallel_cel_rules_name_the_fields() -> None:
    by_message = {r["message"]: r for r in spec_rules()}
    adapters, cpu = by_message[MSG_TP_ADAPTERS], by_message[MSG_TP_CPU]
    assert "topology.tensorParallel" in MSG_TP_ADAPTERS and "bundle.adapters" in MSG_TP_ADAPTERS
    assert "topology.gpusPerReplica 0" in MSG_TP_CPU and "bundle.config.device: cpu" in MSG_TP_CPU
    assert adapters["fieldPath"] == cpu["fieldPath"] == ".topology.tensorParallel"
    # `adapters: []` is no adapters (the bundle id agrees), so the rule accepts an empty list
    assert "size(self.bundle.adapters) == 0" in adapters["rule"]
    assert (
        "self.bundle.config.device == 'cpu'" in cpu["rule"]
        and "self.topology.gpusPerReplica != 0" in cpu["rule"]
    )
    [divide] = rules("spec.topology")
    assert divide["message"] == MSG_TP and divide["rule"].startswith("self.gpusPerReplica == 0 ||")
    # the paths the rules read exist, with defaults, so `has()` is only needed for the optional list
    spec = schema()["properties"]["spec"]["properties"]
    assert spec["topology"]["default"]["tensorParallel"] == 1
    assert spec["bundle"]["properties"]["config"]["default"]["device"] == "auto"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpus": 2, "tp": 2, "adapters": [ADAPTER]}, MSG_TP_ADAPTERS),
        ({"gpus": 2, "tp": 2, "device": "cpu", "adapters": [ADAPTER]}, MSG_TP_ADAPTERS),
        ({"gpus": 0, "tp": 2, "device": "auto"}, MSG_TP_CPU),
        ({"gpus": 0, "tp": 2, "device": "cuda"}, MSG_TP_CPU),
        ({"gpus": 6, "tp": 4, "device": "cuda"}, MSG_TP),
    ],
)
def test_tensor_parallel_rejections(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as e:
        ModelDeploymentSpec.model_validate(_tp_spec(**kwargs))
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpus": 0, "tp": 2, "device": "cpu"},  # CPU ranks over gloo (the real-node lane has no GPUs)
        {"gpus": 2, "tp": 2, "device": "cpu"},  # the process node: simulated GPUs, CPU ranks
        {"gpus": 4, "tp": 2, "device": "cuda"},
        {"gpus": 0, "tp": 1, "adapters": [ADAPTER]},
        {"gpus": 2, "tp": 1, "adapters": [ADAPTER]},
        {"gpus": 2, "tp": 2, "adapters": []},
    ],
)
def test_tensor_parallel_accepted(kwargs: dict[str, Any]) -> None:
    spec = ModelDeploymentSpec.model_validate(_tp_spec(**kwargs))
    assert spec.topology.tensor_parallel == kwargs["tp"]


def test_cuda_graphs_rules_name_the_field_and_leave_old_bundle_ids_alone() -> None:
    from modeldeploy.operator.rollout.bundle import bundle_id
    from modeldeploy.operator.rollout.children import serve_args

    by_message = {r["message"]: r for r in spec_rules()}
    for msg in (MSG_GRAPHS_CPU, MSG_GRAPHS_TP):
        assert by_message[msg]["fieldPath"] == ".bundle.config.cudaGraphs" and "cudaGraphs" in msg
    for kwargs, needle in (
        ({"gpus": 1, "tp": 1, "device": "cpu"}, MSG_GRAPHS_CPU),
        ({"gpus": 2, "tp": 2, "device": "cuda"}, MSG_GRAPHS_TP),
    ):
        obj = _tp_spec(**kwargs)
        obj["bundle"]["config"]["cudaGraphs"] = True
        with pytest.raises(ValidationError) as e:
            ModelDeploymentSpec.model_validate(obj)
        assert needle in str(e.value)
    plain = _tp_spec(1, 1, "cuda")
    graphs = _tp_spec(1, 1, "cuda")
    graphs["bundle"]["config"]["cudaGraphs"] = True
    a, b = ModelDeploymentSpec.model_validate(plain), ModelDeploymentSpec.model_validate(graphs)
    assert "--cuda-graphs" in serve_args(b, "x") and "--cuda-graphs" not in serve_args(a, "x")
    assert bundle_id(a.bundle) != bundle_id(b.bundle)  # turning it on is a canaried rollout
    off = _tp_spec(1, 1, "cuda")
    off["bundle"]["config"]["cudaGraphs"] = None
    assert bundle_id(ModelDeploymentSpec.model_validate(off).bundle) == bundle_id(a.bundle)
