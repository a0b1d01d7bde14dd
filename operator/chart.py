"""The Helm chart's values, typed: generates charts/modeldeploy-operator/values.schema.json.

`helm install/lint/template` validate user values against that schema, so a typo such as
`replicas:` instead of `replicaCount:` is an error, not a silently ignored key.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _V(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Image(_V):
    repository: str = Field(min_length=1, description="Operator image repository.")
    tag: str = Field(default="", description="Image tag (ignored when digest is set).")
    digest: str = Field(
        default="", pattern=r"^(sha256:[0-9a-f]{64})?$", description="Image digest sha256:<64 hex>."
    )
    pullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy."
    )


class Port(_V):
    port: int = Field(ge=1, le=65535, description="Container port.")


class ServiceAccount(_V):
    create: bool = Field(default=True, description="Create the ServiceAccount.")
    name: str = Field(default="", description="Name (default: release fullname).")


class Values(_V):
    image: Image
    imagePullSecrets: list[dict[str, str]] = Field(default_factory=list, description="Pull secrets.")
    replicaCount: int = Field(
        default=1, ge=1, le=5, description="Operator replicas; one is active (kopf peering)."
    )
    watchNamespaces: list[str] = Field(default_factory=list, description="Namespaces to watch; empty: all.")
    resyncSeconds: int = Field(default=30, ge=5, le=3600, description="Periodic resync interval.")
    metrics: Port
    health: Port
    resources: dict[str, dict[str, int | str]] = Field(
        default_factory=dict, description="Operator container resources."
    )
    serviceAccount: ServiceAccount = Field(default_factory=ServiceAccount)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] = Field(default_factory=dict)
    podAnnotations: dict[str, str] = Field(default_factory=dict)


def schema_json() -> str:
    schema = Values.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "modeldeploy-operator values"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
