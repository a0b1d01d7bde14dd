"""HTTPRoute builder: parents/hostnames from spec, cohort-pinning header rule, weights, ownership."""

from __future__ import annotations

import pytest
from support.operator_fixtures import md

from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT, ModelDeploymentSpec
from modeldeploy.operator.rollout import routing
from modeldeploy.operator.rollout.bundle import instance_labels
from modeldeploy.operator.rollout.children import service

GATEWAY = {
    "parentRefs": [
        {"name": "inference-gateway", "namespace": "gateway-system", "sectionName": "https"},
        {"name": "internal"},
    ],
    "hostnames": ["llm.example.com"],
}


def build(weight: int, has_canary: bool, **gw):
    obj = md(rollout={"trafficRouting": {"gatewayAPI": GATEWAY | gw}})
    spec = ModelDeploymentSpec.model_validate(obj["spec"])
    return obj, routing.http_route(obj, spec, weight, has_canary)


def test_no_route_without_gateway_api() -> None:
    obj = md()
    assert routing.http_route(obj, ModelDeploymentSpec.model_validate(obj["spec"]), 0, False) is None


def test_canary_step_route_shape() -> None:
    obj, r = build(10, True)
    assert r["apiVersion"] == "gateway.networking.k8s.io/v1" and r["kind"] == "HTTPRoute"
    assert r["metadata"]["name"] == "chat" and r["metadata"]["namespace"] == "ns"
    assert r["metadata"]["labels"] == instance_labels("chat")
    owner = r["metadata"]["ownerReferences"][0]
    assert owner["uid"] == "uid-1" and owner["kind"] == "ModelDeployment" and owner["controller"] is True
    assert r["spec"]["parentRefs"] == [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "inference-gateway",
            "namespace": "gateway-system",
            "sectionName": "https",
        },
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "internal"},
    ]
    assert r["spec"]["hostnames"] == ["llm.example.com"]
    pin, split = r["spec"]["rules"]
    assert pin["matches"] == [
        {
            "path": {"type": "PathPrefix", "value": "/"},
            "headers": [{"type": "Exact", "name": "x-modeldeploy-cohort", "value": "canary"}],
        }
    ]
    assert pin["backendRefs"] == [{"group": "", "kind": "Service", "name": "chat-canary", "port": PORT}]
    assert split["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert routing.route_weights(r) == {"chat-stable": 90, "chat-canary": 10}
    assert all(b["port"] == PORT for b in split["backendRefs"])


def test_backends_are_the_cohort_services_children_makes() -> None:
    obj, r = build(50, True)
    names = {b["name"] for rule in r["spec"]["rules"] for b in rule["backendRefs"]}
    cohort_services = {
        service(obj, "stable", "a")["metadata"]["name"],
        service(obj, "canary", "b")["metadata"]["name"],
    }
    assert names == cohort_services
    port = service(obj, "stable", "a")["spec"]["ports"][0]["port"]
    assert {b["port"] for rule in r["spec"]["rules"] for b in rule["backendRefs"]} == {port}


def test_no_canary_means_stable_only_and_no_pinning_rule() -> None:
    _, r = build(0, False)
    assert len(r["spec"]["rules"]) == 1
    assert routing.route_weights(r) == {"chat-stable": 100}


def test_canary_present_before_traffic_has_weight_zero_but_pinning_works() -> None:
    _, r = build(0, True)  # Deploying / Verifying: canary exists, no weighted traffic yet
    assert routing.route_weights(r) == {"chat-stable": 100, "chat-canary": 0}
    assert r["spec"]["rules"][0]["backendRefs"][0]["name"] == "chat-canary"


def test_promoting_sends_everything_to_canary() -> None:
    _, r = build(100, True)
    assert routing.route_weights(r) == {"chat-stable": 0, "chat-canary": 100}


def test_custom_header_and_no_hostnames() -> None:
    obj = md(
        rollout={
            "trafficRouting": {"gatewayAPI": {"parentRefs": [{"name": "gw"}], "cohortHeader": "x-cohort"}}
        }
    )
    r = routing.http_route(obj, ModelDeploymentSpec.model_validate(obj["spec"]), 5, True)
    assert "hostnames" not in r["spec"]
    assert r["spec"]["rules"][0]["matches"][0]["headers"][0]["name"] == "x-cohort"


@pytest.mark.parametrize(
    ("weight", "has_canary", "header", "message"),
    [
        (101, True, "x-modeldeploy-cohort", "within 0..100"),
        (-1, True, "x-modeldeploy-cohort", "within 0..100"),
        (10, False, "x-modeldeploy-cohort", "no canary cohort"),
        (10, True, "bad header", "cohortHeader"),
    ],
)
def test_invalid_inputs_name_the_problem(weight, has_canary, header, message) -> None:
    with pytest.raises(ValueError, match=message):
        routing.route_rules("chat", header, weight, has_canary)


@pytest.mark.parametrize(
    "host", ["LLM.example.com", "llm.example.com:443", "*.*.example.com", "-x.example.com"]
)
def test_invalid_hostnames_are_refused_naming_the_field(host) -> None:
    with pytest.raises(ValueError, match="gatewayAPI.hostnames"):
        build(10, True, hostnames=[host])


def test_wildcard_hostname_is_accepted() -> None:
    _, r = build(10, True, hostnames=["*.example.com", "llm.example.com"])
    assert r["spec"]["hostnames"] == ["*.example.com", "llm.example.com"]
