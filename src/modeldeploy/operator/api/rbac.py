"""The operator's RBAC rules: the code that makes API calls declares them here.

`modeldeploy crd` writes them into the chart (files/rbac-rules.yaml, read by the
ClusterRole template), so the chart never grants more than the code uses. No wildcards,
no Secrets: API keys reach pods by secretKeyRef, which the kubelet resolves, not us.
"""

from __future__ import annotations

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
        # spec.rollout.trafficRouting.gatewayAPI: the operator owns one HTTPRoute per object
        {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"], "verbs": rw},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
        # spec.rollout.analysis.quality.evalSet.configMapRef: the pinned evaluation set
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
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
