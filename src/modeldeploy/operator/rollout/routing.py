"""Gateway API `HTTPRoute` for a ModelDeployment routed by `spec.rollout.trafficRouting.gatewayAPI`. Pure.

Two rules, both on the path prefix `/`:
1. requests carrying `<cohortHeader>: canary` go to `<name>-canary` (cohort pinning, so a
   tester can reach the canary on purpose). Present only while there is a canary: pinned
   requests must not be sent to a Service with no pods behind it (they fall to rule 2).
2. everything else is split by weight: `<name>-stable` gets 100-w, `<name>-canary` gets w.

Gateway API gives a header match precedence over a path-only match (more specific wins),
so rule order does not decide it. The weight comes from `sizing.canary_weight()`; this
module only writes it down.
"""

from __future__ import annotations

import re
from typing import Any

from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT, ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.rollout import GatewayAPI
from modeldeploy.operator.rollout.bundle import instance_labels
from modeldeploy.operator.rollout.children import owner_reference

API_VERSION = "gateway.networking.k8s.io/v1"
KIND = "HTTPRoute"
CANARY_VALUE = "canary"
# Gateway API HTTPHeaderName: an RFC 7230 token, at most 256 characters
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]{1,256}$")
# Gateway API Hostname: RFC 1123, optionally one leading wildcard label, no IPs
_HOSTNAME_RE = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def stable_service(name: str) -> str:
    return f"{name}-stable"


def canary_service(name: str) -> str:
    return f"{name}-canary"


def _backend(service: str, weight: int | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"group": "", "kind": "Service", "name": service, "port": PORT}
    if weight is not None:
        ref["weight"] = weight
    return ref


def _parent_refs(gw: GatewayAPI) -> list[dict[str, Any]]:
    out = []
    for p in gw.parent_refs:
        ref: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": p.name}
        if p.namespace:
            ref["namespace"] = p.namespace
        if p.section_name:
            ref["sectionName"] = p.section_name
        out.append(ref)
    return out


def route_rules(name: str, cohort_header: str, weight: int, has_canary: bool) -> list[dict[str, Any]]:
    """The rules of the route (see module docstring); weight is the canary's percent, 0..100."""
    if not 0 <= weight <= 100:
        raise ValueError(f"canary weight must be within 0..100, got {weight}")
    if not _HEADER_RE.match(cohort_header):
        raise ValueError(
            f"spec.rollout.trafficRouting.gatewayAPI.cohortHeader {cohort_header!r}"
            " is not a valid HTTP header name"
        )
    if weight and not has_canary:
        raise ValueError(f"canary weight {weight}% with no canary cohort: nothing would serve that share")
    prefix = {"path": {"type": "PathPrefix", "value": "/"}}
    rules: list[dict[str, Any]] = []
    if has_canary:
        header = {"type": "Exact", "name": cohort_header, "value": CANARY_VALUE}
        rules.append(
            {"matches": [prefix | {"headers": [header]}], "backendRefs": [_backend(canary_service(name))]}
        )
    backends = [_backend(stable_service(name), 100 - weight)]
    if has_canary:
        backends.append(_backend(canary_service(name), weight))
    rules.append({"matches": [prefix], "backendRefs": backends})
    return rules


def http_route(
    md: dict[str, Any], spec: ModelDeploymentSpec, weight: int, has_canary: bool
) -> dict[str, Any] | None:
    """The HTTPRoute `<name>` for this MD, or None when the spec routes by replica ratio (no route wanted).

    `has_canary`: a canary cohort exists now (phase Deploying..Promoting); `weight` its percent.
    """
    gw = spec.rollout.traffic_routing.gateway_api
    if gw is None:
        return None
    name, ns = md["metadata"]["name"], md["metadata"]["namespace"]
    route_spec: dict[str, Any] = {
        "parentRefs": _parent_refs(gw),
        "rules": route_rules(name, gw.cohort_header, weight, has_canary),
    }
    bad = [h for h in gw.hostnames if len(h) > 253 or not _HOSTNAME_RE.match(h)]
    if bad:
        raise ValueError(
            f"spec.rollout.trafficRouting.gatewayAPI.hostnames: {bad} are not RFC 1123 hostnames "
            "(lowercase labels, optional leading '*.', no port)"
        )
    if gw.hostnames:
        route_spec["hostnames"] = list(gw.hostnames)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": instance_labels(name),
            "ownerReferences": [owner_reference(md)],
        },
        "spec": route_spec,
    }


def route_weights(route: dict[str, Any]) -> dict[str, int]:
    """Service -> weight of the weighted (last) rule: what a reconcile compares to tell drift."""
    rule = route["spec"]["rules"][-1]
    return {b["name"]: int(b.get("weight", 1)) for b in rule["backendRefs"]}
