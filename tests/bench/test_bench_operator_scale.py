"""bench/operator_scale.py applies the ModelDeployment CRD itself: a cluster without it,
or with a stale copy, gets the generated one and the bench waits for Established."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes.client.exceptions import ApiException

from modeldeploy.operator.api.crd import crd

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("operator_scale", ROOT / "bench/operator_scale.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
NAME = crd()["metadata"]["name"]


class FakeExt:
    """ApiextensionsV1Api: a CRD store; Established after `ready_after` reads."""

    def __init__(self, have: bool, ready_after: int = 1, fail: int | None = None) -> None:
        self.have, self.ready_after, self.fail, self.reads = have, ready_after, fail, 0
        self.created: list[dict] = []
        self.replaced: list[dict] = []

    def create_custom_resource_definition(self, body: dict) -> None:
        if self.fail:
            raise ApiException(status=self.fail)
        if self.have:
            raise ApiException(status=409)
        self.created.append(body)
        self.have = True

    def read_custom_resource_definition(self, name: str) -> SimpleNamespace:
        if not self.have:
            raise ApiException(status=404)
        assert name == NAME
        self.reads += 1
        ok = self.reads > self.ready_after
        conds = [SimpleNamespace(type="Established", status="True" if ok else "False")]
        return SimpleNamespace(
            metadata=SimpleNamespace(resource_version="7"), status=SimpleNamespace(conditions=conds)
        )

    def replace_custom_resource_definition(self, name: str, body: dict) -> None:
        self.replaced.append(body)


def test_a_cluster_without_the_crd_gets_it_created_and_established() -> None:
    ext = FakeExt(have=False)
    bench.apply_crd(ext, timeout=5)
    assert [b["metadata"]["name"] for b in ext.created] == [NAME] and ext.replaced == []
    assert ext.created[0]["spec"] == crd()["spec"]  # the one generated from the API types


def test_an_existing_crd_is_replaced_with_the_generated_one() -> None:
    ext = FakeExt(have=True, ready_after=0)
    bench.apply_crd(ext, timeout=5)
    assert ext.created == [] and len(ext.replaced) == 1
    assert ext.replaced[0]["metadata"]["resourceVersion"] == "7"


def test_other_api_errors_are_not_swallowed() -> None:
    with pytest.raises(ApiException):
        bench.apply_crd(FakeExt(have=False, fail=403), timeout=1)


def test_main_applies_the_crd_before_creating_any_object() -> None:
    src = (ROOT / "bench/operator_scale.py").read_text()
    body = src[src.index("def main(") :]
    assert (
        body.index("apply_crd(") < body.index("create_node") < body.index("create_namespaced_custom_object")
    )
