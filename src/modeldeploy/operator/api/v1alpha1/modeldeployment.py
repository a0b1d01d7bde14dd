"""The ModelDeployment object and its spec (serving.modeldeploy.dev/v1alpha1), with the cross-field rules.

The CRD schema (`modeldeploy crd`) is generated from these models, and the operator parses
every object through them, so the API server and the operator agree on shape, defaults and
rules. CEL rules (`x-kubernetes-validations`) sit next to the field they guard; the same
checks run in pydantic so a unit test or `plan()` sees the error the API server would give.

The parts live beside this module, one concept a file: bundle (what is served), topology (where
a replica runs), rollout (how a change rolls out), analysis (how a canary is judged), status
(what the operator reports), common (shared checks). Import each name from its own module.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from modeldeploy.operator.api.v1alpha1._model import _Model
from modeldeploy.operator.api.v1alpha1.bundle import (
    Bundle,
)
from modeldeploy.operator.api.v1alpha1.network import Network
from modeldeploy.operator.api.v1alpha1.rollout import (
    Rollout,
)
from modeldeploy.operator.api.v1alpha1.status import (
    ModelDeploymentStatus,
)
from modeldeploy.operator.api.v1alpha1.topology import (
    Resources,
    Topology,
)

GROUP = "serving.modeldeploy.dev"
VERSION = "v1alpha1"
KIND = "ModelDeployment"
PLURAL = "modeldeployments"
SINGULAR = "modeldeployment"
SHORT_NAMES = ("md",)
# The port every serving pod listens on: its `http` container port, the Service's port, the port
# routes and network policies admit and the one the operator's analysis reads /metrics on. Part
# of the pod contract, so it lives with the API that every operator package may import.
PORT = 8000

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


class LocalObjectReference(_Model):
    """A Secret named by the pod (imagePullSecrets), which the kubelet reads; the operator does not."""

    name: str = Field(
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of a Secret in the same namespace.",
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
    network: Network = Field(
        default_factory=Network,
        description="Who may reach the serving pods: the NetworkPolicy the operator writes (ingress only).",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=8,
        description="kubernetes.io/dockerconfigjson Secrets for private registries, given to every serving "
        "and pre-pull pod as imagePullSecrets: the kubelet uses them for the engine image and for oci:// "
        "image volumes. The InitContainer pull method mounts the first one's .dockerconfigjson as "
        "DOCKER_CONFIG/config.json. The operator only names them, it never reads Secrets. Not part of the "
        "bundle: changing them restarts the pods without a canary.",
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
