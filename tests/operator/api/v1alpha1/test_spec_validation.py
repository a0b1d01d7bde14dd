"""The ModelDeployment API types refuse what cannot run, with a message naming the field, and
default the rest (pydantic; the CRD's schema and CEL rules say the same to the API server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from support.operator_fixtures import DIGEST, md, tp_spec

from modeldeploy.operator.api.v1alpha1.modeldeployment import (
    MSG_TP_ADAPTERS,
    MSG_TP_CPU,
    ModelDeploymentSpec,
)
from modeldeploy.operator.api.v1alpha1.topology import MSG_TP

ROOT = Path(__file__).resolve().parents[4]


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


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples").glob("modeldeployment-*.yaml")), ids=lambda p: p.name
)
def test_examples_are_valid_modeldeployments(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "ModelDeployment":
            ModelDeploymentSpec.model_validate(doc["spec"])


ADAPTER = {"name": "tenant-a", "uri": "pvc://adapters/a", "revision": "a1", "digest": DIGEST}


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
        ModelDeploymentSpec.model_validate(tp_spec(**kwargs))
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
    spec = ModelDeploymentSpec.model_validate(tp_spec(**kwargs))
    assert spec.topology.tensor_parallel == kwargs["tp"]
