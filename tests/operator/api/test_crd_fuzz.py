"""The CRD fuzz (bench/crd_fuzz.py), CI-sized, and the regressions it found.

Each regression is a spec the API server used to accept and the operator then failed on at every reconcile
(its Deployment refused by the API server, or urllib raising): now the API types refuse it, pydantic with a
message and the CRD (CEL rule or pattern) with the field path. The pydantic half runs everywhere; the API
server half and the fuzz need etcd and kube-apiserver from `make cluster-build`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from pydantic import ValidationError

from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy_dev.control_plane import missing

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("crd_fuzz", ROOT / "bench/crd_fuzz.py")
assert _spec and _spec.loader
fuzz = importlib.util.module_from_spec(_spec)
sys.modules["crd_fuzz"] = fuzz  # its dataclasses look their module up
_spec.loader.exec_module(fuzz)

NEEDS_BINS = pytest.mark.skipif(
    bool(missing()), reason="needs etcd and kube-apiserver: run `make cluster-build`"
)
DIGEST = "sha256:" + "b" * 64
BASE: dict[str, Any] = {
    "bundle": {
        "engine": {"image": "registry.local/modeldeploy-runtime@sha256:" + "5" * 64},
        "model": {"uri": "file:///models/m", "revision": "r1", "digest": DIGEST},
        "tokenizer": {"revision": "r1", "digest": DIGEST},
    },
}


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    node = spec
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return spec


# (spec path, value, pydantic's message, the field path the API server names)
FOUND = [
    (("bundle", "model", "uri"), "file://x", "file:// uri needs a path", "spec.bundle.model.uri"),
    (("bundle", "model", "uri"), "http://[", "http(s):// uri needs a host", "spec.bundle.model.uri"),
    (("bundle", "model", "uri"), "file://x]/m", "file:// uri needs a path", "spec.bundle.model.uri"),
    (("bundle", "model", "uri"), "pvc://Bad_Claim/x", "pvc:// uri is", "spec.bundle.model.uri"),
    (("bundle", "model", "uri"), "pvc://claim/../etc", "'..' element", "spec.bundle.model.uri"),
    (("bundle", "model", "uri"), "file:///models/..", "'..' element", "spec.bundle.model.uri"),
    (
        ("bundle", "config", "apiKeySecretRef"),
        {"name": "Not A Name", "key": "k"},
        "String should match pattern",
        "spec.bundle.config.apiKeySecretRef.name",
    ),
    (
        ("bundle", "config", "apiKeySecretRef"),
        {"name": "api-key", "key": "a key"},
        "String should match pattern",
        "spec.bundle.config.apiKeySecretRef.key",
    ),
    (("topology", "tolerations"), [{"operator": "Equal"}], "empty key", "spec.topology.tolerations[0]"),
    (
        ("topology", "tolerations"),
        [{"key": "a", "operator": "Exists", "value": "v"}],
        "Exists takes no value",
        "spec.topology.tolerations[0]",
    ),
    (
        ("topology", "tolerations"),
        [{"key": "a", "tolerationSeconds": 5}],
        "only to effect NoExecute",
        "spec.topology.tolerations[0]",
    ),
    (
        ("topology", "tolerations"),
        [{"key": "bad key", "operator": "Exists"}],
        "String should match pattern",
        "spec.topology.tolerations[0].key",
    ),
    (("resources", "requests"), {"cpu": "abc"}, "non-negative Kubernetes", "spec.resources.requests"),
    (("resources", "limits"), {"memory": "-1Gi"}, "non-negative Kubernetes", "spec.resources.limits"),
    (
        ("rollout", "trafficRouting"),
        {"gatewayAPI": {"parentRefs": [{"name": "gw", "namespace": "Not_A_Namespace"}]}},
        "String should match pattern",
        "spec.rollout.trafficRouting.gatewayAPI.parentRefs[0].namespace",
    ),
]


@pytest.mark.parametrize(("path", "value", "needle", "field"), FOUND)
def test_found_specs_refused_by_the_api_types(path: tuple, value: Any, needle: str, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        ModelDeploymentSpec.model_validate(_with(path, value))
    assert needle in str(e.value)


@pytest.mark.parametrize(
    ("resources", "needle"),
    [
        ({"requests": {"bad name": "1"}}, "resources: a name is"),
        ({"requests": {"memory": "8Gi"}, "limits": {"memory": "4Gi"}}, "must not exceed limits.memory"),
    ],
)
def test_resources_the_pod_would_refuse_are_invalid_specs(resources: dict, needle: str) -> None:
    """Not in the CRD (names and requests <= limits are pydantic's): the operator reports InvalidSpec."""
    with pytest.raises(ValidationError) as e:
        ModelDeploymentSpec.model_validate(_with(("resources",), resources))
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "uri",
    ["file:///models/m", "file://node/models/m", "pvc://models", "pvc://models/sub/dir", "https://h.example/m",
     "http://[::1]:8080/m", "http://10.0.0.1/m?x=1"],
)  # fmt: skip
def test_uris_still_accepted(uri: str) -> None:
    ModelDeploymentSpec.model_validate(_with(("bundle", "model", "uri"), uri))


def test_default_toleration_and_exists_without_key_still_accepted() -> None:
    spec = ModelDeploymentSpec.model_validate(BASE)
    assert spec.topology.tolerations[0].key == "nvidia.com/gpu"
    ModelDeploymentSpec.model_validate(_with(("topology", "tolerations"), [{"operator": "Exists"}]))


def test_mutations_leave_the_schema() -> None:
    """Each mutation kind changes a drawn spec (where it has a place to act), so the fuzz's refusals are
    exercised, and the refusal parser finds the field path in the API server's two answer shapes."""
    schema = fuzz.crd_spec_schema()
    for kind in fuzz.MUTATIONS:
        out, what = fuzz.mutate(_with(("topology", "tolerations"), [{"key": "a"}]), schema, kind, 3)
        assert "no place" in what or out != _with(("topology", "tolerations"), [{"key": "a"}]), kind
    body = {"message": "x", "details": {"causes": [{"field": "spec.replicas", "message": "bad"}]}}
    assert fuzz.refusal_paths(422, json.dumps(body))[0] == ["spec.replicas"]
    msg = 'strict decoding error: unknown field "spec.bundle.foo"'
    assert fuzz.refusal_paths(400, json.dumps({"message": msg}))[0]
    assert fuzz.refusal_paths(400, json.dumps({"message": "json parse error"}))[0] == []


def test_schema_strategy_draws_valid_pins() -> None:
    """The drawn specs honour the CEL `matches` rules (digests, pinned image), not only the schema types."""
    drawn: list[dict[str, Any]] = []

    @seed(1)
    @settings(
        max_examples=15,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz.strategy(fuzz.crd_spec_schema()))
    def run(spec: dict[str, Any]) -> None:
        drawn.append(spec)  # fmt: skip

    run()
    assert drawn
    for spec in drawn:
        assert spec["bundle"]["model"]["digest"].startswith("sha256:")
        assert len(spec["bundle"]["model"]["digest"]) == 71
        assert "@sha256:" in spec["bundle"]["engine"]["image"]


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from modeldeploy_dev.control_plane import ControlPlane

    with ControlPlane() as cp:
        procs = list(cp.procs.values())
        fz = fuzz.Fuzzer(str(cp.kubeconfig), tmp_path_factory.mktemp("op") / "operator.log", batch=50)
        fz.start()
        try:
            yield fz
        finally:
            fz.stop()
    # no leftovers: etcd and the API server exited, their temp dir (data, certs, token) removed
    assert all(p.poll() is not None for p in procs) and not cp.dir.exists()


@NEEDS_BINS
def test_found_specs_refused_by_the_api_server_with_their_field(fuzzer: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    for i, (path, value, _, field) in enumerate(FOUND):
        body = {
            "apiVersion": f"{fuzz.GROUP}/{fuzz.VERSION}",
            "kind": fuzz.KIND,
            "metadata": {"name": f"found-{i}"},
            "spec": _with(path, value),
        }
        with pytest.raises(ApiException) as e:
            fuzzer.custom.create_namespaced_custom_object(
                fuzz.GROUP, fuzz.VERSION, fuzzer.ns, fuzz.PLURAL, body, field_validation="Strict"
            )
        assert e.value.status == 422, (path, value, e.value.body)
        fields, msg = fuzz.refusal_paths(422, e.value.body)
        assert any(f.lstrip(".").startswith(field) for f in fields), (field, fields, msg)


@NEEDS_BINS
def test_crd_fuzz_ci_sized(fuzzer: Any) -> None:
    """150 specs, fixed seed: each refused with a field path, or reconciled by the operator with no warning,
    and the operator alive throughout."""
    t0 = time.monotonic()
    counts = fuzz.fuzz(fuzzer, 150, seed_value=39)
    summary = fuzz.report(counts, time.monotonic() - t0, ["tests/operator/api/test_crd_fuzz.py"])
    assert counts.generated == 150, summary
    assert counts.refused_with_path > 0 and counts.accepted_reconciled > 0, summary  # both outcomes hit
    assert counts.clean(), summary
    assert fuzzer.operator.proc is not None and fuzzer.operator.proc.poll() is None


def test_outside_is_seeded() -> None:
    schema = fuzz.crd_spec_schema()
    a = [fuzz.outside(random.Random(5), BASE, schema, 0.5)[1] for _ in range(3)]
    b = [fuzz.outside(random.Random(5), BASE, schema, 0.5)[1] for _ in range(3)]
    assert a == b
