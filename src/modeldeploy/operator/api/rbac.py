"""The operator's RBAC rules: the code that makes API calls declares them here.

`modeldeploy crd` writes them into the chart (files/rbac-rules.yaml, read by the
ClusterRole template), so the chart never grants more than the code uses. No wildcards,
no Secrets: API keys reach pods by secretKeyRef, which the kubelet resolves, not us.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, PLURAL


def rules() -> list[dict[str, Any]]:
    rw = ["get", "list", "watch", "create", "patch", "delete"]
    return [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch", "update"]},
        # blockOwnerDeletion on children needs update on the owner's finalizers subresource
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/finalizers"], "verbs": ["update"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": rw},
        {"apiGroups": [""], "resources": ["services"], "verbs": rw},
        # spec.network: the operator owns one NetworkPolicy per object (watched, so an edit reverts)
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": rw},
        # spec.rollout.trafficRouting.gatewayAPI: the operator owns one HTTPRoute per object
        {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"], "verbs": rw},
        # get: the node a not-Ready pod of ours sits on, read fresh for the lost-node check
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]},
        # spec.rollout.analysis.quality.evalSet.configMapRef: the pinned evaluation set
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
        # delete: a pod the rollout waits on, not Ready on a node marked lost (rollout/plan.py)
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {
            "apiGroups": ["kopf.dev"],
            "resources": ["clusterkopfpeerings", "kopfpeerings"],
            "verbs": ["get", "list", "watch", "patch"],
        },
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        },
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    ]


def permissions(rules: Iterable[Mapping[str, Any]]) -> list[str]:
    """RBAC rules as sorted `verb resource.group[/subresource]` lines (core group: `verb resource`), the
    spelling of `kubectl auth can-i --list`: the form tests/data/operator_permissions.txt reviews, so a
    widening is a one-line diff there, and the e2e can hold the API server's answer against it."""
    out: set[str] = set()
    for r in rules:
        if r.get("resourceNames") or r.get("nonResourceURLs"):
            raise ValueError(f"rule outside the reviewed form (resourceNames, nonResourceURLs): {dict(r)}")
        for group in r["apiGroups"]:
            for res in r["resources"]:
                base, _, sub = res.partition("/")
                name = f"{base}.{group}" if group else base
                out.update(f"{verb} {name}/{sub}" if sub else f"{verb} {name}" for verb in r["verbs"])
    return sorted(out)
