"""ModelDeployment API types (serving.modeldeploy.dev/v1alpha1): the single source of truth.

The CRD schema (`modeldeploy crd`) is generated from these models, and the operator parses
every object through them, so the API server and the operator agree on shape, defaults and
rules. CEL rules (`x-kubernetes-validations`) sit next to the field they guard; the same
checks run in pydantic so a unit test or `plan()` sees the error the API server would give.

This module holds the object and its spec; the parts live beside it, one concept a file:
api_bundle (what is served), api_topology (where a replica runs), api_rollout (how a change rolls
out), api_analysis (how a canary is judged), api_status (what the operator reports), api_common
(shared checks). Every public name is re-exported here: the API is one namespace, `api.X`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from modeldeploy.operator._model import _Model
from modeldeploy.operator.api_analysis import (
    MSG_PROM_QUERY,
    MSG_PROM_SELECTOR,
    MSG_PROM_URL,
    MSG_PROM_WINDOW,
    PROM_DURATION_RE,
    PROM_MATCHERS_RE,
    PROM_SELECTOR_RE,
    PROM_TEMPLATE_RE,
    PROM_URL_RE,
    SLO,
    Analysis,
    PromAddress,
    PrometheusQueries,
    PrometheusSource,
    PromQLTemplate,
    PromSelector,
    PromWindow,
)
from modeldeploy.operator.api_bundle import (
    ADAPTER_NAME_RE,
    DEFAULT_SERVED_NAME,
    DIGEST_RE,
    MAX_ADAPTERS,
    MSG_ADAPTER_MODEL,
    MSG_ADAPTER_NAME,
    MSG_ADAPTER_UNIQUE,
    MSG_DIGEST,
    MSG_IMAGE,
    MSG_TOKENIZER,
    MSG_URI,
    PINNED_IMAGE_RE,
    URI_RE,
    AdapterRef,
    Artifact,
    Bundle,
    Digest,
    EngineRef,
    PinnedImage,
    SecretKeyRef,
    ServingConfig,
    TokenizerRef,
    Uri,
)
from modeldeploy.operator.api_common import (
    MSG_COUNT_OR_PERCENT,
    PERCENT_RE,
    ByteQuantity,
    CountOrPercent,
    Quantity,
    quantity_bytes,
    resolve_count,
)
from modeldeploy.operator.api_rollout import (
    MSG_STEPS,
    GatewayAPI,
    GatewayParentRef,
    KeepPrevious,
    KeepPrior,
    Rollout,
    RolloutStep,
    TrafficRouting,
)
from modeldeploy.operator.api_status import (
    AnalysisResult,
    CohortStatus,
    Condition,
    HistoryEntry,
    MetricVerdict,
    ModelDeploymentStatus,
    RolloutStatus,
)
from modeldeploy.operator.api_topology import (
    MSG_TP,
    SHM_PER_RANK_GI,
    Resources,
    Toleration,
    Topology,
)

__all__ = (  # a tuple: operator/ modules keep no mutable module state (tests/test_operator_state.py)
    "ADAPTER_NAME_RE",
    "AdapterRef",
    "Analysis",
    "AnalysisResult",
    "Artifact",
    "Bundle",
    "ByteQuantity",
    "CohortStatus",
    "Condition",
    "CountOrPercent",
    "DEFAULT_SERVED_NAME",
    "DIGEST_RE",
    "Digest",
    "EngineRef",
    "GROUP",
    "GatewayAPI",
    "GatewayParentRef",
    "HistoryEntry",
    "KIND",
    "KeepPrevious",
    "KeepPrior",
    "MAX_ADAPTERS",
    "MSG_ADAPTER_MODEL",
    "MSG_ADAPTER_NAME",
    "MSG_ADAPTER_UNIQUE",
    "MSG_COUNT_OR_PERCENT",
    "MSG_DIGEST",
    "MSG_IMAGE",
    "MSG_PROM_QUERY",
    "MSG_PROM_SELECTOR",
    "MSG_PROM_URL",
    "MSG_PROM_WINDOW",
    "MSG_STEPS",
    "MSG_TOKENIZER",
    "MSG_TP",
    "MSG_GRAPHS_CPU",
    "MSG_GRAPHS_TP",
    "MSG_TP_ADAPTERS",
    "MSG_TP_CPU",
    "MSG_URI",
    "MetricVerdict",
    "ModelDeployment",
    "ModelDeploymentSpec",
    "ModelDeploymentStatus",
    "Observability",
    "PERCENT_RE",
    "PINNED_IMAGE_RE",
    "PLURAL",
    "PROM_DURATION_RE",
    "PROM_MATCHERS_RE",
    "PROM_SELECTOR_RE",
    "PROM_TEMPLATE_RE",
    "PROM_URL_RE",
    "PinnedImage",
    "PromAddress",
    "PromQLTemplate",
    "PromSelector",
    "PromWindow",
    "PrometheusQueries",
    "PrometheusSource",
    "Quantity",
    "Readiness",
    "Resources",
    "Rollout",
    "RolloutStatus",
    "RolloutStep",
    "SHM_PER_RANK_GI",
    "SHORT_NAMES",
    "SINGULAR",
    "SLO",
    "SecretKeyRef",
    "ServingConfig",
    "TokenizerRef",
    "Toleration",
    "Topology",
    "TrafficRouting",
    "URI_RE",
    "Uri",
    "VERSION",
    "quantity_bytes",
    "resolve_count",
)

GROUP = "serving.modeldeploy.dev"
VERSION = "v1alpha1"
KIND = "ModelDeployment"
PLURAL = "modeldeployments"
SINGULAR = "modeldeployment"
SHORT_NAMES = ("md",)

MSG_TP_CPU = (
    "topology.tensorParallel > 1 with topology.gpusPerReplica 0 needs bundle.config.device: cpu "
    "(CPU ranks over gloo); give GPU ranks a GPU each with gpusPerReplica"
)
MSG_GRAPHS_CPU = "bundle.config.cudaGraphs needs a CUDA device: bundle.config.device cpu has no CUDA graphs"
MSG_GRAPHS_TP = "bundle.config.cudaGraphs cannot be combined with topology.tensorParallel > 1 yet"
MSG_TP_ADAPTERS = (
    "topology.tensorParallel > 1 cannot be combined with bundle.adapters: "
    "the runtime does not serve LoRA adapters under tensor parallelism yet"
)


class Readiness(_Model):
    load_timeout_seconds: int = Field(
        default=600, ge=10, le=86400, description="Weights must load within this; sizes the startupProbe."
    )


class Observability(_Model):
    """Where the runtime pods send traces; not part of the bundle (changing it restarts pods, no canary)."""

    otlp_endpoint: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="OTLP/HTTP endpoint (e.g. http://otel-collector.monitoring:4318), passed to the "
        "pods as OTEL_EXPORTER_OTLP_ENDPOINT; unset: no traces are exported.",
    )


class ModelDeploymentSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.topology.tensorParallel == 1 || !has(self.bundle.adapters) "
                    "|| size(self.bundle.adapters) == 0",
                    "message": MSG_TP_ADAPTERS,
                    "fieldPath": ".topology.tensorParallel",
                },
                {
                    "rule": "self.topology.tensorParallel == 1 || self.topology.gpusPerReplica != 0 "
                    "|| (has(self.bundle.config.device) && self.bundle.config.device == 'cpu')",
                    "message": MSG_TP_CPU,
                    "fieldPath": ".topology.tensorParallel",
                },
                {
                    "rule": "!has(self.bundle.config.cudaGraphs) || !self.bundle.config.cudaGraphs "
                    "|| !has(self.bundle.config.device) || self.bundle.config.device != 'cpu'",
                    "message": MSG_GRAPHS_CPU,
                    "fieldPath": ".bundle.config.cudaGraphs",
                },
                {
                    "rule": "!has(self.bundle.config.cudaGraphs) || !self.bundle.config.cudaGraphs "
                    "|| self.topology.tensorParallel == 1",
                    "message": MSG_GRAPHS_TP,
                    "fieldPath": ".bundle.config.cudaGraphs",
                },
            ]
        }
    )
    bundle: Bundle = Field(
        description="What is served: engine image, model, tokenizer, config. Hashed into the bundle id."
    )
    replicas: int = Field(default=1, ge=0, le=1000, description="Serving replicas of the stable bundle.")
    topology: Topology = Field(default_factory=Topology, description="GPUs and placement of one replica.")
    resources: Resources = Field(
        default_factory=Resources, description="CPU/memory of the serving container."
    )
    readiness: Readiness = Field(default_factory=Readiness, description="Load and readiness timing.")
    rollout: Rollout = Field(default_factory=Rollout, description="How a bundle change is rolled out.")
    observability: Observability = Field(
        default_factory=Observability, description="Telemetry the runtime pods export (traces over OTLP)."
    )

    @model_validator(mode="after")
    def _tp_fits_the_bundle(self) -> ModelDeploymentSpec:
        if self.topology.tensor_parallel > 1:
            if self.bundle.adapters:
                raise ValueError(MSG_TP_ADAPTERS)
            if self.topology.gpus_per_replica == 0 and self.bundle.config.device != "cpu":
                raise ValueError(MSG_TP_CPU)
        if self.bundle.config.cuda_graphs:
            if self.bundle.config.device == "cpu":
                raise ValueError(MSG_GRAPHS_CPU)
            if self.topology.tensor_parallel > 1:
                raise ValueError(MSG_GRAPHS_TP)
        return self


class ModelDeployment(_Model):
    """The whole object as the operator sees it; metadata stays a plain dict."""

    model_config = ConfigDict(extra="ignore")
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus = Field(default_factory=ModelDeploymentStatus)
