"""spec.bundle.adapters: validation (pydantic and the CRD's CEL rules), the bundle id, and what
the runtime pod gets (serve flags the runtime's own parser accepts, staged volumes)."""

from __future__ import annotations

import argparse
import copy
from typing import Any

import pytest
from pydantic import ValidationError
from support.operator_fixtures import DIGEST, IMAGE, md

from modeldeploy.operator.api import crd
from modeldeploy.operator.api.v1alpha1.bundle import (
    MAX_ADAPTERS,
    MSG_ADAPTER_MODEL,
    MSG_ADAPTER_NAME,
    MSG_ADAPTER_UNIQUE,
)
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.rollout import children
from modeldeploy.operator.rollout.bundle import bundle_id, canonical_json

DIGEST_A = "sha256:" + "c" * 64
DIGEST_B = "sha256:" + "d" * 64


def with_adapters(adapters: list[dict[str, Any]] | None, **config: Any) -> dict[str, Any]:
    obj = md()
    if adapters is not None:
        obj["spec"]["bundle"]["adapters"] = adapters
    obj["spec"]["bundle"]["config"].update(config)
    return obj


TWO = [
    {"name": "tenant-a", "uri": "https://models.example/tenant-a.tar", "revision": "a1", "digest": DIGEST_A},
    {"name": "tenant-b", "uri": "pvc://adapters/tenant-b", "revision": "b1", "digest": DIGEST_B},
]


def spec(obj: dict[str, Any]) -> ModelDeploymentSpec:
    return ModelDeploymentSpec.model_validate(obj["spec"])


def test_adapters_are_part_of_the_bundle_id():
    base = bundle_id(spec(md()).bundle)
    two = bundle_id(spec(with_adapters(TWO)).bundle)
    changed = copy.deepcopy(TWO)
    changed[1]["revision"] = "b2"
    assert len({base, two, bundle_id(spec(with_adapters(changed)).bundle)}) == 3
    changed[1]["revision"], changed[1]["digest"] = "b1", "sha256:" + "e" * 64
    assert bundle_id(spec(with_adapters(changed)).bundle) != two


def test_no_adapters_leaves_the_bundle_id_alone():
    """Objects written before adapters existed keep their bundle id (no surprise rollout)."""
    assert "adapters" not in canonical_json(spec(md()).bundle)
    assert bundle_id(spec(with_adapters([])).bundle) == bundle_id(spec(md()).bundle)


@pytest.mark.parametrize(
    ("adapters", "config", "needle"),
    [
        ([{**TWO[0], "name": "Tenant_A"}], {}, "adapter name must be a DNS label"),
        ([{**TWO[0], "name": "a" * 64}], {}, "at most 63"),
        ([TWO[0], {**TWO[1], "name": "tenant-a"}], {}, "every adapter name must be unique"),
        ([{k: v for k, v in TWO[0].items() if k != "digest"}], {}, "digest"),
        ([{**TWO[0], "digest": "sha256:abc"}], {}, "64 lowercase hex"),
        ([{**TWO[0], "uri": "hf://org/adapter"}], {}, "pvc://"),
        ([{**TWO[0], "name": f"t{i}"} for i in range(MAX_ADAPTERS + 1)], {}, "at most 16 items"),
        ([{**TWO[0], "name": "model"}], {}, "must differ from the served model name"),
        ([{**TWO[0], "name": "chat"}], {"servedModelName": "chat"}, "must differ from the served model name"),
        (TWO, {"maxLoras": 0}, "greater than or equal to 1"),
    ],
)
def test_invalid_adapters_rejected_with_message(adapters, config, needle):
    with pytest.raises(ValidationError) as e:
        spec(with_adapters(adapters, **config))
    assert needle in str(e.value)


def _rules(node: dict[str, Any]) -> list[str]:
    return [r["message"] for r in node.get("x-kubernetes-validations", [])]


def test_crd_carries_the_adapter_rules():
    bundle = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["bundle"]
    adapters = bundle["properties"]["adapters"]
    item = adapters["items"]
    assert adapters["maxItems"] == MAX_ADAPTERS
    assert MSG_ADAPTER_UNIQUE in _rules(adapters)
    assert set(item["required"]) == {"name", "uri", "revision", "digest"}
    assert (
        MSG_ADAPTER_NAME in _rules(item["properties"]["name"])
        and item["properties"]["name"]["maxLength"] == 63
    )
    assert "64 lowercase hex" in _rules(item["properties"]["digest"])[0]
    assert MSG_ADAPTER_MODEL in _rules(bundle)


def test_pod_gets_serve_flags_the_runtime_parses():
    s = spec(with_adapters(TWO, maxLoras=2))
    args = children.serve_args(s, "bid0")
    from modeldeploy.runtime.server import cli

    p = argparse.ArgumentParser()
    cli.configure(p)
    cfg = cli.build_config(p.parse_args(args))
    assert cfg.engine.adapters == [
        {"name": "tenant-a", "path": "/models/adapters/tenant-a", "digest": DIGEST_A, "revision": "a1"},
        {"name": "tenant-b", "path": "/models/adapters/tenant-b", "digest": DIGEST_B, "revision": "b1"},
    ]
    assert cfg.engine.max_loras == 2
    assert "--max-loras" not in children.serve_args(spec(with_adapters(TWO)), "bid0")


def test_adapters_are_staged_like_the_model():
    s = spec(with_adapters(TWO + [{**TWO[0], "name": "tenant-c", "uri": "file:///srv/adapters/c"}]))
    pod = children.pod_spec(s, "bid0")
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    inits = {c["name"]: c for c in pod.get("initContainers", [])}
    # http(s): fetched into an emptyDir by an init container that verifies the digest
    assert vols["adapter-0"] == {"name": "adapter-0", "emptyDir": {}}
    assert inits["fetch-adapter-0"]["args"] == [
        TWO[0]["uri"],
        "/models/adapters/tenant-a",
        "--digest",
        DIGEST_A,
    ]
    assert inits["fetch-adapter-0"]["image"] == IMAGE
    # pvc: read-only claim, subPath from the uri
    assert vols["adapter-1"]["persistentVolumeClaim"] == {"claimName": "adapters", "readOnly": True}
    assert mounts["adapter-1"] == {
        "name": "adapter-1",
        "mountPath": "/models/adapters/tenant-b",
        "readOnly": True,
        "subPath": "tenant-b",
    }
    # file: hostPath
    assert vols["adapter-2"]["hostPath"] == {"path": "/srv/adapters/c", "type": "Directory"}
    assert all(m["readOnly"] for n, m in mounts.items() if n.startswith("adapter-"))
    assert set(inits) == {"fetch-adapter-0"}  # the model is on a pvc: no fetch for it
    assert DIGEST  # the model pin is unchanged
