"""spec.network: the NetworkPolicy each ModelDeployment owns (content, lifecycle, selectors, CRD rules)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support.fake_kube import MD, FakeKube
from support.operator_fixtures import md

from modeldeploy.operator.api import crd
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.network import (
    LABEL_KEY_RE,
    LABEL_VALUE_RE,
    MSG_LABEL_KEY,
    MSG_PEER,
    MSG_VALUES,
)
from modeldeploy.operator.controller.observe import OPERATOR_NAMESPACE_ENV, operator_namespace
from modeldeploy.operator.controller.reconciler import Controller
from modeldeploy.operator.rollout import children
from modeldeploy.operator.rollout.bundle import bundle_id
from modeldeploy.operator.rollout.drift import DESIRED_HASH, subset
from modeldeploy.operator.rollout.network import KIND, network_policy
from modeldeploy.operator.rollout.plan import Delete, Event, Observed, plan

NS, NAME = "ns", "chat"
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
PORTS = [{"protocol": "TCP", "port": children.PORT}]
GATEWAY = {"gatewayAPI": {"parentRefs": [{"name": "gw", "namespace": "gateways"}, {"name": "local"}]}}


def _policy(operator_ns: str | None = "modeldeploy-system", **spec: Any) -> dict[str, Any]:
    obj = md(**spec)
    pol = network_policy(obj, ModelDeploymentSpec.model_validate(obj["spec"]), operator_ns)
    assert pol is not None
    return pol


def _ns_peer(ns: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}


def test_default_policy_admits_own_namespace_to_serving_and_monitoring_and_operator_to_metrics() -> None:
    pol = _policy()
    assert pol["apiVersion"] == "networking.k8s.io/v1" and pol["kind"] == KIND
    assert pol["metadata"]["name"] == NAME and pol["metadata"]["namespace"] == NS
    assert pol["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # deleted with the ModelDeployment
    assert pol["spec"]["policyTypes"] == ["Ingress"]  # ingress only: egress stays the cluster's default
    assert pol["spec"]["ingress"] == [
        {"from": [{"podSelector": {}}], "ports": PORTS},
        {"from": [MONITORING, _ns_peer("modeldeploy-system")], "ports": PORTS},
    ]


def test_policy_selects_exactly_the_serving_pods_of_every_bundle() -> None:
    obj = md()
    spec = ModelDeploymentSpec.model_validate(obj["spec"])
    pol = network_policy(obj, spec, None)
    assert pol is not None
    selected = pol["spec"]["podSelector"]["matchLabels"]
    for bid in (bundle_id(spec.bundle), "0" * 16):  # the stable's, a canary's, a warm prior's pods alike
        pod_labels = children.deployment(obj, spec, bid, 1)["spec"]["template"]["metadata"]["labels"]
        assert selected.items() <= pod_labels.items()
    assert selected == children.service(obj, "", None)["spec"]["selector"]  # what `<name>` routes to
    other = children.deployment(md(name="other"), spec, bundle_id(spec.bundle), 1)
    assert not selected.items() <= other["spec"]["template"]["metadata"]["labels"].items()
    container = children.pod_spec(spec, bundle_id(spec.bundle))["containers"][0]
    assert [p["containerPort"] for p in container["ports"]] == [p["port"] for p in PORTS]


def test_allow_from_replaces_the_namespace_default_and_gateway_namespaces_are_added() -> None:
    peers = [
        {"namespaceSelector": {"matchLabels": {"team": "search"}}},
        {
            "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
            "podSelector": {"matchLabels": {"app": "frontend"}},
        },
    ]
    pol = _policy(network={"allowFrom": peers}, rollout={"trafficRouting": GATEWAY})
    serving = pol["spec"]["ingress"][0]["from"]
    # parentRef "local" has no namespace: the route's own, the ModelDeployment's
    assert serving == [*peers, _ns_peer("gateways"), _ns_peer(NS)]
    assert {"podSelector": {}} not in serving


def test_gateway_namespace_joins_the_default() -> None:
    serving = _policy(rollout={"trafficRouting": GATEWAY})["spec"]["ingress"][0]["from"]
    assert serving == [{"podSelector": {}}, _ns_peer("gateways"), _ns_peer(NS)]


def test_empty_source_lists_leave_no_rule_rather_than_an_open_one() -> None:
    pol = _policy(None, network={"allowFrom": [], "metricsFrom": []})
    assert pol["spec"]["ingress"] == []  # deny all: a rule without `from` would admit every source
    pol = _policy(None, network={"allowFrom": []})
    assert pol["spec"]["ingress"] == [{"from": [MONITORING], "ports": PORTS}]
    assert all(r.get("from") for r in _policy(network={"metricsFrom": []})["spec"]["ingress"])


def test_metrics_from_is_a_field_and_duplicates_collapse() -> None:
    pol = _policy(
        "monitoring", network={"metricsFrom": [MONITORING, {"podSelector": {"matchLabels": {"a": "b"}}}]}
    )
    assert pol["spec"]["ingress"][1]["from"] == [MONITORING, {"podSelector": {"matchLabels": {"a": "b"}}}]


def test_opt_out_writes_none_and_plan_deletes_an_existing_one() -> None:
    obj = md(network={"policy": False})
    assert network_policy(obj, ModelDeploymentSpec.model_validate(obj["spec"]), "op") is None
    existing = _policy()
    actions = plan(obj, Observed(policies=[existing]), "2026-01-01T00:00:00Z")
    assert Delete(KIND, NAME) in actions
    assert any(
        isinstance(a, Event) and a.reason == "Deleted" and "spec.network.policy is false" in a.message
        for a in actions
    )


def test_network_is_not_part_of_the_bundle() -> None:
    """A policy change is applied in place: it never starts a canary."""
    a = ModelDeploymentSpec.model_validate(md()["spec"])
    b = ModelDeploymentSpec.model_validate(md(network={"policy": False, "allowFrom": []})["spec"])
    assert bundle_id(a.bundle) == bundle_id(b.bundle)


def test_a_stored_policy_without_empty_fields_is_not_drift() -> None:
    want = _policy(None, network={"allowFrom": [], "metricsFrom": []})
    stored = copy.deepcopy(want)
    del stored["spec"]["ingress"]  # the API server omits an empty ingress list
    assert subset(want["spec"], stored["spec"])
    assert not subset(want["spec"], _policy()["spec"])  # but open rules where none are wanted are


# --- lifecycle through the Controller (observe -> plan -> apply) against the in-memory API server ---


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeKube, Controller]]:
    """An in-memory API server holding one ModelDeployment, and a Controller; the object is forgotten
    after the test, so the per-object metrics it published do not leak into other tests."""
    monkeypatch.setenv(OPERATOR_NAMESPACE_ENV, "modeldeploy-system")
    kube = FakeKube()
    kube.nodes = [
        {
            "metadata": {"name": "gpu-0", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
    ]
    obj = md()
    obj["metadata"].pop("uid")
    kube.put(obj)
    ctrl = Controller(kube, tick_s=3600.0)
    yield kube, ctrl
    ctrl.forget((NS, NAME))


def _stored_policy(kube: FakeKube) -> dict[str, Any] | None:
    return kube.objects.get((KIND, NS, NAME))


def _edit_spec(kube: FakeKube, network: dict[str, Any]) -> None:
    obj = kube.objects[(MD, NS, NAME)]
    obj["spec"]["network"] = network
    obj["metadata"]["generation"] += 1
    kube.put(obj)


def test_controller_creates_updates_reverts_and_deletes_the_policy(
    world: tuple[FakeKube, Controller],
) -> None:
    kube, ctrl = world
    ctrl.reconcile(NS, NAME)
    pol = _stored_policy(kube)
    assert pol is not None and pol["spec"]["ingress"][1]["from"][-1] == _ns_peer("modeldeploy-system")
    assert ctrl.reconcile(NS, NAME) == []  # converged: nothing to do a second time

    _edit_spec(kube, {"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]})
    actions = ctrl.reconcile(NS, NAME)
    assert any(getattr(a, "kind", "") == KIND for a in actions)
    pol = _stored_policy(kube)
    assert pol is not None and pol["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"team": "a"}}}
    ]

    pol["spec"]["ingress"] = []  # someone edits it outside the operator
    kube.put(pol)
    ctrl.reconcile(NS, NAME)
    pol = _stored_policy(kube)
    assert pol is not None and pol["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "team": "a"
    }
    assert (pol["metadata"].get("annotations") or {}).get(DESIRED_HASH)
    assert "DriftReverted" in {e["reason"] for e in kube.events}

    _edit_spec(kube, {"policy": False})
    ctrl.reconcile(NS, NAME)
    assert _stored_policy(kube) is None
    assert ctrl.reconcile(NS, NAME) == []


def test_invalid_network_spec_touches_no_policy(world: tuple[FakeKube, Controller]) -> None:
    kube, ctrl = world
    ctrl.reconcile(NS, NAME)
    before = copy.deepcopy(_stored_policy(kube))
    _edit_spec(kube, {"allowFrom": [{"podSelector": {"matchLabels": {"bad key!": "x"}}}]})
    ctrl.reconcile(NS, NAME)
    assert _stored_policy(kube) == before  # a refused spec leaves the last good policy in place
    status = kube.objects[(MD, NS, NAME)]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (
        degraded["reason"] == "InvalidSpec"
        and "network.allowFrom.0.podSelector.matchLabels" in degraded["message"]
    )


def test_operator_namespace_from_env_then_serviceaccount_then_none(tmp_path: Path) -> None:
    sa = tmp_path / "namespace"
    assert operator_namespace({OPERATOR_NAMESPACE_ENV: "ops"}, str(sa)) == "ops"
    assert operator_namespace({}, str(sa)) is None  # outside a cluster: no rule for the operator
    sa.write_text("modeldeploy-system\n")
    assert operator_namespace({}, str(sa)) == "modeldeploy-system"


# --- bad selectors: refused by the types and by the CRD the API server enforces ---


@pytest.mark.parametrize(
    ("peer", "needle"),
    [
        ({}, MSG_PEER),
        ({"podSelector": {"matchLabels": {"bad key!": "x"}}}, MSG_LABEL_KEY),
        ({"podSelector": {"matchLabels": {"a/" + "b" * 64: "x"}}}, MSG_LABEL_KEY),
        ({"podSelector": {"matchLabels": {"app": "-bad"}}}, "should match pattern"),
        ({"podSelector": {"matchLabels": {"app": "x" * 64}}}, "at most 63"),
        ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}, MSG_VALUES),
        (
            {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["a"]}]}},
            MSG_VALUES,
        ),
        ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "Has"}]}}, "'In', 'NotIn'"),
        ({"podSelector": {"matchExpressions": [{"key": "UPPER.case/x", "operator": "Exists"}]}}, "pattern"),
        ({"namespaceSelector": {"matchLabel": {"a": "b"}}}, "Extra inputs are not permitted"),
    ],
)
def test_bad_selectors_are_refused_with_a_message(peer: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as e:
        ModelDeploymentSpec.model_validate(md(network={"allowFrom": [peer]})["spec"])
    assert needle in str(e.value) and "network.allowFrom.0" in str(e.value)


def _crd_network() -> dict[str, Any]:
    root = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root["properties"]["spec"]["properties"]["network"]


def test_crd_carries_the_selector_rules_the_api_server_enforces() -> None:
    net = _crd_network()
    peer = net["properties"]["allowFrom"]["items"]
    assert peer["x-kubernetes-validations"] == [
        {"rule": "has(self.namespaceSelector) || has(self.podSelector)", "message": MSG_PEER}
    ]
    sel = peer["properties"]["podSelector"]
    labels = sel["properties"]["matchLabels"]
    assert labels["additionalProperties"]["pattern"] == LABEL_VALUE_RE and labels["maxProperties"] == 16
    # map keys by CEL (a structural schema has no patternProperties); maxProperties keeps its cost bounded
    (key_rule,) = labels["x-kubernetes-validations"]
    assert key_rule["message"] == f"keys {MSG_LABEL_KEY}" and "k.matches(" in key_rule["rule"]
    assert re.fullmatch(key_rule["rule"].split("'")[1].replace("\\\\", "\\"), "app.kubernetes.io/name")
    term = sel["properties"]["matchExpressions"]["items"]
    assert term["properties"]["key"]["pattern"] == LABEL_KEY_RE
    assert term["properties"]["operator"]["enum"] == ["In", "NotIn", "Exists", "DoesNotExist"]
    assert term["x-kubernetes-validations"][0]["message"] == MSG_VALUES
    assert net["default"]["policy"] is True and net["default"]["metricsFrom"][0]["namespaceSelector"][
        "matchLabels"
    ] == {"kubernetes.io/metadata.name": "monitoring"}
    assert peer == net["properties"]["metricsFrom"]["items"]  # both lists take the same peers


@pytest.mark.parametrize(
    ("value", "ok"),
    [("", True), ("a", True), ("a.b-c_d", True), ("-a", False), ("a-", False), ("a b", False)],
)
def test_label_value_pattern_matches_kubernetes(value: str, ok: bool) -> None:
    assert bool(re.fullmatch(LABEL_VALUE_RE, value)) is ok


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("app", True),
        ("kubernetes.io/metadata.name", True),
        ("app.kubernetes.io/instance", True),
        ("a/b/c", False),
        ("/a", False),
        ("Upper.io/a", False),
        ("a_", False),
    ],
)
def test_label_key_pattern_matches_kubernetes(key: str, ok: bool) -> None:
    assert bool(re.fullmatch(LABEL_KEY_RE, key)) is ok
