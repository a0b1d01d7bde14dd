"""The NetworkPolicy `<name>` a ModelDeployment owns (spec.network): who may open a connection to its
serving pods. Pure, no I/O.

It selects every serving pod of the object (stable, canary and a warm prior bundle alike: the labels
the `<name>` Service selects), so a rollout never leaves a cohort open or shut. Ingress only, on the
serving port, in two rules:
1. serving: spec.network.allowFrom (unset: the object's own namespace) plus the namespace of every
   Gateway the HTTPRoute attaches to;
2. metrics (the same port, see api/v1alpha1/network.py): spec.network.metricsFrom plus the operator's
   own namespace when it runs in the cluster (it reads /metrics and /health/ready of each pod).
A rule whose source list would be empty is left out: a NetworkPolicy rule without `from` admits
everyone, the opposite of what an empty list means here.
Tensor-parallel ranks share one pod and talk over loopback and /dev/shm, which no NetworkPolicy
filters; kubelet probes come from the node, which NetworkPolicy implementations admit.
"""

from __future__ import annotations

from typing import Any

from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT, ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.network import namespace_peer
from modeldeploy.operator.rollout.bundle import instance_labels, selector_labels
from modeldeploy.operator.rollout.children import owner_reference

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"


def same_namespace() -> dict[str, Any]:
    """The peer for every pod of the policy's own namespace."""
    return {"podSelector": {}}


def gateway_namespaces(spec: ModelDeploymentSpec, namespace: str) -> list[str]:
    """Namespaces of the Gateways the HTTPRoute attaches to (a parentRef without one: the route's own)."""
    gw = spec.rollout.traffic_routing.gateway_api
    return sorted({p.namespace or namespace for p in gw.parent_refs}) if gw is not None else []


def _unique(peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in peers:
        if p not in out:
            out.append(p)
    return out


def serving_peers(spec: ModelDeploymentSpec, namespace: str) -> list[dict[str, Any]]:
    net = spec.network
    named = [same_namespace()] if net.allow_from is None else [p.to_k8s() for p in net.allow_from]
    gateways = [namespace_peer(n).to_k8s() for n in gateway_namespaces(spec, namespace)]
    return _unique(named + gateways)


def metrics_peers(spec: ModelDeploymentSpec, operator_namespace: str | None) -> list[dict[str, Any]]:
    peers = [p.to_k8s() for p in spec.network.metrics_from]
    if operator_namespace:
        peers.append(namespace_peer(operator_namespace).to_k8s())
    return _unique(peers)


def network_policy(
    md: dict[str, Any], spec: ModelDeploymentSpec, operator_namespace: str | None
) -> dict[str, Any] | None:
    """The NetworkPolicy `<name>`, or None when spec.network.policy is false (none wanted).

    `operator_namespace`: where the operator runs (None: outside the cluster, no rule for it)."""
    if not spec.network.policy:
        return None
    name, ns = md["metadata"]["name"], md["metadata"]["namespace"]
    port = [{"protocol": "TCP", "port": PORT}]
    rules = [
        {"from": peers, "ports": port}
        for peers in (serving_peers(spec, ns), metrics_peers(spec, operator_namespace))
        if peers  # never a rule without `from`: that would admit every source
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": instance_labels(name),
            "ownerReferences": [owner_reference(md)],
        },
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }
