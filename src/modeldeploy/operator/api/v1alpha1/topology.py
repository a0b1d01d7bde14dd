"""Where and on what one replica runs (spec.topology, spec.resources): GPUs, tensor parallelism, placement.

Also the sizes the capacity fit check reads (weightsMemory, kvCachePerGpu) and /dev/shm.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from modeldeploy.operator.api.v1alpha1._model import _Model
from modeldeploy.operator.api.v1alpha1.common import (
    ByteQuantity,
    Quantity,
    _cel,
    quantity_bytes,
    quantity_value,
)
from modeldeploy.operator.api.v1alpha1.network import LABEL_KEY_RE, LABEL_VALUE_RE, _check_key

MSG_TP = "topology.tensorParallel must divide topology.gpusPerReplica"
# Default /dev/shm per tensor-parallel rank: 1Gi at TP=1 (the value before TP, so those pods keep
# their template), N Gi for N ranks (TGI runs sharded models with --shm-size 1g; vLLM asks for more
# or --ipc=host). A memory-backed emptyDir only charges what is written, to the pod's memory limit.
SHM_PER_RANK_GI = 1


# core/v1 ValidateTolerations, which the API server applies to the Deployment the operator writes: a spec
# that broke one of them was accepted here and then failed every reconcile (bench/crd_fuzz.py found it)
MSG_TOLERATION_KEY = "tolerations: an empty key matches every taint and needs operator Exists"
MSG_TOLERATION_VALUE = "tolerations: operator Exists takes no value"
MSG_TOLERATION_SECONDS = "tolerations: tolerationSeconds applies only to effect NoExecute"
_TOLERATION_RULES: tuple[dict[str, Any], ...] = (
    {"rule": "self.operator == 'Exists' || (has(self.key) && self.key != '')", "message": MSG_TOLERATION_KEY},
    {
        "rule": "self.operator != 'Exists' || !has(self.value) || self.value == ''",
        "message": MSG_TOLERATION_VALUE,
    },
    {
        "rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        "message": MSG_TOLERATION_SECONDS,
    },
)


class Toleration(_Model):
    """A pod toleration (core/v1 Toleration subset), held to the rules the API server checks on pods."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [*_TOLERATION_RULES]})
    key: str | None = Field(
        default=None, max_length=317, pattern=f"^$|{LABEL_KEY_RE}", description="Taint key (a label key)."
    )
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(
        default=None, max_length=63, pattern=LABEL_VALUE_RE, description="Taint value (Equal; a label value)."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Effect."
    )
    toleration_seconds: int | None = Field(default=None, description="NoExecute grace.")

    @model_validator(mode="after")
    def _pod_rules(self) -> Toleration:
        """The pydantic twin of _TOLERATION_RULES, and the prefix/name lengths of a non-empty key."""
        if self.key:
            _check_key(self.key)
        if self.operator != "Exists" and not self.key:
            raise ValueError(MSG_TOLERATION_KEY)
        if self.operator == "Exists" and self.value:
            raise ValueError(f"{MSG_TOLERATION_VALUE} (got {self.value!r})")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(f"{MSG_TOLERATION_SECONDS} (got effect {self.effect})")
        return self


def _gpu_toleration() -> list[Toleration]:
    return [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")]


class Topology(_Model):
    model_config = ConfigDict(
        json_schema_extra=_cel(
            "self.gpusPerReplica == 0 || self.gpusPerReplica % self.tensorParallel == 0",
            MSG_TP,
            fieldPath=".tensorParallel",
        )
    )
    gpus_per_replica: int = Field(
        default=1, ge=0, le=64, description="nvidia.com/gpu per replica (0: CPU only)."
    )
    tensor_parallel: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Tensor-parallel ranks in each pod (--tensor-parallel-size): one GPU per rank, so it "
        "divides gpusPerReplica; with gpusPerReplica 0 only CPU ranks (bundle.config.device: cpu). "
        "Not combinable with bundle.adapters yet.",
    )
    gpu_type: str | None = Field(
        default=None,
        max_length=128,
        description="Node label nvidia.com/gpu.product the replica needs (e.g. NVIDIA-H200).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Extra node labels a replica needs (merged with the GPU-type selector).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=_gpu_toleration,
        max_length=32,
        description="Pod tolerations (default: nvidia.com/gpu Exists).",
    )
    shm_size: ByteQuantity | None = Field(
        default=None,
        description="Size limit of the memory-backed /dev/shm (tensor-parallel ranks exchange data "
        f"through it); default {SHM_PER_RANK_GI}Gi per tensor-parallel rank.",
    )
    weights_memory: ByteQuantity | None = Field(
        default=None,
        description="Device memory the model's weights take at the serving dtype, all ranks together "
        "(e.g. 140Gi for a 70B model in bfloat16). When set, the fit check needs a node whose GPUs "
        "each hold weightsMemory / tensorParallel + kvCachePerGpu (node label nvidia.com/gpu.memory, "
        "MiB; a node without it is not ruled out), else the replica is Unschedulable.",
    )
    kv_cache_per_gpu: ByteQuantity | None = Field(
        default=None,
        description="KV cache (plus any headroom) each GPU must hold beside its weight shard, for the fit "
        "check with weightsMemory (default 0).",
    )

    @model_validator(mode="after")
    def _tp_divides(self) -> Topology:
        if self.gpus_per_replica and self.gpus_per_replica % self.tensor_parallel:
            raise ValueError(MSG_TP)
        return self

    def shm_size_limit(self) -> Quantity:
        """The /dev/shm sizeLimit: shmSize when set, else SHM_PER_RANK_GI Gi per tensor-parallel rank."""
        return self.shm_size if self.shm_size is not None else f"{SHM_PER_RANK_GI * self.tensor_parallel}Gi"

    def gpu_bytes_needed(self) -> int | None:
        """Bytes one GPU of a replica needs: weightsMemory / tensorParallel + kvCachePerGpu (None: unknown).

        Each rank holds 1/N of the weights (column/row-parallel shards) and its own KV blocks, so a
        model too large for one GPU fits N of them; the runtime's activations and CUDA context come
        on top, so this is a lower bound: a replica it rejects can never load."""
        if self.weights_memory is None:
            return None
        weights = quantity_bytes(self.weights_memory)
        kv = quantity_bytes(self.kv_cache_per_gpu) if self.kv_cache_per_gpu is not None else 0
        return -(-weights // self.tensor_parallel) + kv


# A container resource: the API server's own check of the Deployment the operator writes (bench/crd_fuzz.py
# found a value that is no quantity accepted here and refused on every Deployment create). The value check
# is a CEL rule too (the quantity library); names and requests <= limits are pydantic's (InvalidSpec).
RESOURCE_NAME_RE = (
    r"^(cpu|memory|ephemeral-storage|hugepages-[0-9A-Za-z.]+|"
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$"
)
MSG_RESOURCE_VALUE = "resources: a value must be a non-negative Kubernetes quantity such as 500m, 4Gi or 2"
MSG_RESOURCE_NAME = (
    "resources: a name is cpu, memory, ephemeral-storage, hugepages-<size> or a domain-prefixed extended "
    "resource such as example.com/foo"
)


def _resource_value(v: Quantity) -> Quantity:
    try:
        ok = quantity_value(v) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{MSG_RESOURCE_VALUE} (got {v!r})")
    return v


ResourceQuantity = Annotated[
    Quantity,
    AfterValidator(_resource_value),
    Field(
        # maxLength (and the maps' maxProperties) keep the API server's CEL cost estimate within its budget
        json_schema_extra={
            "maxLength": 64,
            **_cel(
                "type(self) == int ? int(self) >= 0 : (isQuantity(string(self)) && "
                "!quantity(string(self)).isLessThan(quantity('0')))",
                MSG_RESOURCE_VALUE,
            ),
        }
    ),
]


class Resources(_Model):
    requests: dict[str, ResourceQuantity] = Field(
        default_factory=lambda: {"cpu": "1", "memory": "4Gi"},
        max_length=16,
        description="Container requests (GPUs come from topology).",
    )
    limits: dict[str, ResourceQuantity] = Field(
        default_factory=lambda: {"memory": "16Gi"},
        max_length=16,
        description="Container limits (nvidia.com/gpu is added).",
    )

    @model_validator(mode="after")
    def _pod_rules(self) -> Resources:
        for name in [*self.requests, *self.limits]:
            if not re.match(RESOURCE_NAME_RE, name):
                raise ValueError(f"{MSG_RESOURCE_NAME} (got {name!r})")
        for name, want in self.requests.items():
            if name in self.limits and quantity_value(want) > quantity_value(self.limits[name]):
                raise ValueError(f"resources: requests.{name} {want} must not exceed limits.{name}")
        return self
