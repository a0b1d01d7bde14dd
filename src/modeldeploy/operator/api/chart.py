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


DURATION = r"^[0-9]+(ms|s|m|h)$"


class PodMonitor(_V):
    """Scrape the runtime pods of every ModelDeployment (selected by the labels the operator sets)."""

    enabled: bool = Field(default=False, description="Create a PodMonitor (prometheus-operator CRD).")
    interval: str = Field(default="15s", pattern=DURATION, description="Scrape interval.")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels, e.g. release: kube-prometheus-stack."
    )


class ServiceMonitor(_V):
    """Scrape the operator's /metrics (rollout phase, canary weight, conditions, reconciles)."""

    enabled: bool = Field(default=False, description="Create a ServiceMonitor for the operator.")
    interval: str = Field(default="15s", pattern=DURATION, description="Scrape interval.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on the ServiceMonitor.")


class PrometheusRule(_V):
    """Alerts from files/prometheus-rules.yaml; they join runtime and operator series (both monitors)."""

    enabled: bool = Field(default=False, description="Create a PrometheusRule with the alerts.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on the PrometheusRule.")


class Dashboard(_V):
    """The Grafana dashboard (dashboards/modeldeploy.json) as a ConfigMap the Grafana sidecar loads."""

    enabled: bool = Field(default=False, description="Create the dashboard ConfigMap.")
    labels: dict[str, str] = Field(
        default_factory=lambda: {"grafana_dashboard": "1"},
        description="Labels the Grafana sidecar selects (kube-prometheus-stack: grafana_dashboard).",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Annotations, e.g. grafana_folder: LLM serving."
    )


class Tracing(_V):
    otlpEndpoint: str = Field(
        default="",
        pattern=r"^(https?://[^\s/]+(/\S*)?)?$",
        description="OTLP/HTTP endpoint for the operator's reconcile and analysis spans; empty: none.",
    )


class GateKey(_V):
    existingSecret: str = Field(
        default="",
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$",
        max_length=253,
        description="Secret (in the release namespace) holding the operator's gate key; empty: the chart "
        "creates <fullname>-gate-key with a random key and keeps it across upgrades (helm lookup). Set "
        "it where the chart is rendered without cluster access (Argo CD), or every render makes a new key.",
    )
    key: str = Field(
        default="gate-key",
        pattern=r"^[-._a-zA-Z0-9]+$",
        max_length=253,
        description="The data key of that Secret holding the gate key (32+ characters).",
    )


class Monitoring(_V):
    podMonitor: PodMonitor = Field(default_factory=PodMonitor)
    serviceMonitor: ServiceMonitor = Field(default_factory=ServiceMonitor)
    prometheusRule: PrometheusRule = Field(default_factory=PrometheusRule)
    dashboard: Dashboard = Field(default_factory=Dashboard)


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
    tracing: Tracing = Field(default_factory=Tracing, description="The operator's own traces.")
    gateKey: GateKey = Field(
        default_factory=GateKey,
        description="How the operator's gates authenticate to pods that require an API key: the operator "
        "reads this key from its env (the kubelet resolves the Secret; the operator cannot read Secrets).",
    )
    monitoring: Monitoring = Field(
        default_factory=Monitoring, description="prometheus-operator monitors, alerts, Grafana dashboard."
    )


def schema_json() -> str:
    schema = Values.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "modeldeploy-operator values"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
