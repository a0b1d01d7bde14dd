"""ModelDeployment API types (serving.modeldeploy.dev/v1alpha1): the single source of truth.

The CRD schema (`modeldeploy crd`) is generated from these models, and the operator parses
every object through them, so the API server and the operator agree on shape, defaults and
rules. CEL rules (`x-kubernetes-validations`) sit next to the field they guard; the same
checks run in pydantic so a unit test or `plan()` sees the error the API server would give.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from modeldeploy.operator._model import _Model
from modeldeploy.operator.api_status import (  # noqa: F401  (re-exported: the API is one namespace)
    AnalysisResult,
    CohortStatus,
    Condition,
    HistoryEntry,
    MetricVerdict,
    ModelDeploymentStatus,
    RolloutStatus,
)

GROUP = "serving.modeldeploy.dev"
VERSION = "v1alpha1"
KIND = "ModelDeployment"
PLURAL = "modeldeployments"
SINGULAR = "modeldeployment"
SHORT_NAMES = ("md",)

PINNED_IMAGE_RE = r"^[^@ ]+@sha256:[0-9a-f]{64}$"
DIGEST_RE = r"^sha256:[0-9a-f]{64}$"
URI_RE = r"^(pvc|file|https?)://.+$"
MSG_IMAGE = "engine.image must be pinned by digest: <repo>@sha256:<64 hex>, tags alone are not accepted"
MSG_DIGEST = "digest must be 'sha256:' followed by 64 lowercase hex characters"
MSG_URI = "uri must start with pvc://, file://, http:// or https://"
MSG_TP = "topology.tensorParallel must divide topology.gpusPerReplica"
MSG_TP_CPU = (
    "topology.tensorParallel > 1 with topology.gpusPerReplica 0 needs bundle.config.device: cpu "
    "(CPU ranks over gloo); give GPU ranks a GPU each with gpusPerReplica"
)
MSG_TP_ADAPTERS = (
    "topology.tensorParallel > 1 cannot be combined with bundle.adapters: "
    "the runtime does not serve LoRA adapters under tensor parallelism yet"
)
MSG_STEPS = "rollout.steps weights must be strictly increasing"
PERCENT_RE = r"^(100|[1-9][0-9]?)%$"
MSG_COUNT_OR_PERCENT = "must be a count (an integer >= 0) or a percentage of spec.replicas such as '25%'"
MSG_TOKENIZER = "tokenizer.uri must be omitted or equal model.uri: the runtime loads the tokenizer from the model directory"
ADAPTER_NAME_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_ADAPTERS = 16
MSG_ADAPTER_NAME = (
    "adapter name must be a DNS label: lowercase letters, digits and '-', at most 63 characters"
)
MSG_ADAPTER_UNIQUE = "adapters: every adapter name must be unique"
MSG_ADAPTER_MODEL = (
    "adapters: an adapter name must differ from the served model name "
    "(config.servedModelName, default 'model'): clients select either by that name"
)
# Default /dev/shm per tensor-parallel rank: 1Gi at TP=1 (the value before TP, so those pods keep
# their template), N Gi for N ranks (TGI runs sharded models with --shm-size 1g; vLLM asks for more
# or --ipc=host). A memory-backed emptyDir only charges what is written, to the pod's memory limit.
SHM_PER_RANK_GI = 1
DEFAULT_SERVED_NAME = "model"  # the runtime's default: the model directory's name (children.MODEL_DIR)


def _cel(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": rule, "message": message, **extra}]}


def _matches(pattern: str, message: str):
    def check(v: str) -> str:
        if not re.match(pattern, v):
            raise ValueError(f"{message} (got {v!r})")
        return v

    return AfterValidator(check)


PinnedImage = Annotated[
    str,
    _matches(PINNED_IMAGE_RE, MSG_IMAGE),
    Field(max_length=512, json_schema_extra=_cel(f"self.matches('{PINNED_IMAGE_RE}')", MSG_IMAGE)),
]
Digest = Annotated[
    str,
    _matches(DIGEST_RE, MSG_DIGEST),
    Field(max_length=71, json_schema_extra=_cel(f"self.matches('{DIGEST_RE}')", MSG_DIGEST)),
]
Uri = Annotated[
    str,
    _matches(URI_RE, MSG_URI),
    Field(max_length=2048, json_schema_extra=_cel(f"self.matches('{URI_RE}')", MSG_URI)),
]
# A Kubernetes quantity ("4Gi", "500m", 2): int-or-string in the CRD.
Quantity = int | str
_QUANTITY_RE = re.compile(
    r"^([+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E))?$"
)
_SUFFIX = MappingProxyType(
    {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
    | {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
)


def quantity_bytes(q: Quantity) -> int:
    """A byte quantity ("140Gi", "80G", "1.5Ti", 2**30) as whole bytes (rounded up); ValueError otherwise."""
    if isinstance(q, bool):
        raise ValueError(f"not a quantity: {q!r}")
    if isinstance(q, int):
        if q < 0:
            raise ValueError(f"a byte quantity must not be negative, got {q}")
        return q
    m = _QUANTITY_RE.match(q.strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity (e.g. 8Gi, 80G): {q!r}")
    number, exponent, suffix = m.groups()
    value = Decimal(number + (exponent or "")) * _SUFFIX[suffix or ""]
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def _check_bytes(v: Quantity | None) -> Quantity | None:
    if v is not None:
        quantity_bytes(v)
    return v


ByteQuantity = Annotated[Quantity, AfterValidator(_check_bytes)]


def _check_count_or_percent(v: int | str) -> int | str:
    if (
        isinstance(v, bool)
        or (isinstance(v, int) and v < 0)
        or (isinstance(v, str) and not re.match(PERCENT_RE, v))
    ):
        raise ValueError(f"{MSG_COUNT_OR_PERCENT} (got {v!r})")
    return v


# A replica count or a percentage of spec.replicas (rounded up): int-or-string in the CRD.
CountOrPercent = Annotated[
    int | str,
    AfterValidator(_check_count_or_percent),
    Field(
        # maxLength bounds the string side: without it the API server's CEL cost estimate for the regex
        # (a string of any length, in each of 20 steps) exceeds its budget and it rejects the CRD
        json_schema_extra={
            "maxLength": 4,
            **_cel(
                f"type(self) == string ? self.matches('{PERCENT_RE}') : int(self) >= 0", MSG_COUNT_OR_PERCENT
            ),
        }
    ),
]


def resolve_count(v: int | str, total: int) -> int:
    """A CountOrPercent against spec.replicas: a percentage rounds up, like a PodDisruptionBudget's."""
    if isinstance(v, str):
        return math.ceil(total * int(v[:-1]) / 100)
    return v


class EngineRef(_Model):
    image: PinnedImage = Field(description="Runtime image, pinned by digest (repo@sha256:...).")


class Artifact(_Model):
    uri: Uri = Field(
        description="Where the files are: pvc://CLAIM[/SUBPATH], file:///HOST/PATH (hostPath, dev clusters), "
        "or http(s)://URL (fetched by an init container that verifies the digest)."
    )
    revision: str = Field(
        max_length=256, description="Human revision (git sha, tag) recorded in status and metrics."
    )
    digest: Digest = Field(
        description="sha256 over the sorted path:sha256 manifest (`modeldeploy digest DIR`)."
    )


class TokenizerRef(_Model):
    uri: Uri | None = Field(
        default=None, description="Omit (or set equal to model.uri): read from the model directory."
    )
    revision: str = Field(max_length=256, description="Tokenizer revision.")
    digest: Digest = Field(description="sha256 manifest digest of the tokenizer files.")


class AdapterRef(_Model):
    """A LoRA adapter (PEFT directory), pinned like the model; clients select it with `model: <name>`."""

    name: Annotated[
        str,
        _matches(ADAPTER_NAME_RE, MSG_ADAPTER_NAME),
        Field(
            max_length=63,
            description="The model name clients send to select this adapter (a DNS label).",
            json_schema_extra=_cel(f"self.matches('{ADAPTER_NAME_RE}')", MSG_ADAPTER_NAME),
        ),
    ]
    uri: Uri = Field(description="Where the adapter files are (same schemes as model.uri).")
    revision: str = Field(max_length=256, description="Human revision, recorded in /v1/bundle.")
    digest: Digest = Field(description="sha256 manifest digest of the adapter directory (required).")


class SecretKeyRef(_Model):
    name: str = Field(max_length=253, description="Secret name in the same namespace.")
    key: str = Field(max_length=253, description="Key within the Secret.")


class ServingConfig(_Model):
    max_num_seqs: int = Field(
        default=16, ge=1, le=4096, description="Sequences batched at once (--max-num-seqs)."
    )
    max_queue: int = Field(
        default=64, ge=0, le=100000, description="Admission queue length before 429 (--max-queue)."
    )
    max_queued_tokens: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000_000,
        description="Prompt tokens that may wait together before a 429 (--max-queued-tokens); a request "
        "alone in the queue always enters. Unset or 0: no bound.",
    )
    queue_budget_seconds: float | None = Field(
        default=None,
        ge=0,
        le=86400,
        description="Seconds a request may be expected to wait for a running slot; beyond, a 429 with "
        "Retry-After at once instead of a late answer (--queue-budget; a client's x-request-deadline-ms "
        "header sets its own). Unset: spec.rollout.analysis.slo.ttftSeconds, the TTFT SLO the canary "
        "analysis judges goodput by. 0: no server budget.",
    )
    max_model_len: int | None = Field(
        default=None, ge=16, le=1048576, description="Context length cap (--max-model-len)."
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=16,
        le=1048576,
        description="Token budget per engine step (--max-num-batched-tokens).",
    )
    kv_cache_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Share of free device memory for KV blocks (--kv-cache-fraction).",
    )
    num_kv_blocks: int | None = Field(
        default=None, ge=1, description="Fixed KV block count (--num-kv-blocks)."
    )
    chunked_prefill: bool = Field(
        default=True, description="Split long prompts across steps (off: --no-chunked-prefill)."
    )
    structured_output: bool = Field(
        default=False,
        description="The bundle serves response_format json_schema: the conformance gate then checks "
        "that constrained outputs validate and that unsupported schema features get a 400.",
    )
    served_model_name: str | None = Field(
        default=None, max_length=256, description="Model name clients send (--served-model-name)."
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        default="auto", description="Weight dtype (--dtype)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Device (--device).")
    drain_timeout_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="SIGTERM drain budget (--drain-timeout); grace period is longer.",
    )
    max_loras: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ADAPTERS,
        description="LoRA adapters held on the device at once (--max-loras); the rest wait in host memory.",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API key; given to the runtime as env MODELDEPLOY_API_KEY, never read by the operator.",
    )


class Bundle(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.tokenizer.uri) || self.tokenizer.uri == self.model.uri",
                    "message": MSG_TOKENIZER,
                },
                {
                    "rule": "!has(self.adapters) || self.adapters.all(a, a.name != "
                    f"(has(self.config.servedModelName) ? self.config.servedModelName : '{DEFAULT_SERVED_NAME}'))",
                    "message": MSG_ADAPTER_MODEL,
                },
            ]
        }
    )
    engine: EngineRef = Field(description="The serving runtime image.")
    model: Artifact = Field(description="Model weights and config.")
    tokenizer: TokenizerRef = Field(description="Tokenizer pin.")
    config: ServingConfig = Field(
        default_factory=ServingConfig, description="Serving configuration (runtime flags)."
    )
    adapters: list[AdapterRef] | None = Field(
        default=None,
        max_length=MAX_ADAPTERS,
        description="LoRA adapters served beside the base model, each pinned by digest; part of the bundle id, "
        "so changing one is a canaried rollout.",
        json_schema_extra=_cel("self.all(a, self.exists_one(b, b.name == a.name))", MSG_ADAPTER_UNIQUE),
    )

    @field_validator("adapters")
    @classmethod
    def _no_adapters_is_none(cls, v: list[AdapterRef] | None) -> list[AdapterRef] | None:
        return v or None  # `adapters: []` and no adapters are the same bundle (and bundle id)

    @model_validator(mode="after")
    def _tokenizer_same_dir(self) -> Bundle:
        if self.tokenizer.uri is not None and self.tokenizer.uri != self.model.uri:
            raise ValueError(MSG_TOKENIZER)
        names = [a.name for a in self.adapters or []]
        if len(set(names)) != len(names):
            raise ValueError(MSG_ADAPTER_UNIQUE)
        if (self.config.served_model_name or DEFAULT_SERVED_NAME) in names:
            raise ValueError(MSG_ADAPTER_MODEL)
        return self


class Toleration(_Model):
    """A pod toleration (core/v1 Toleration subset)."""

    key: str | None = Field(default=None, max_length=317, description="Taint key.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value (Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Effect."
    )
    toleration_seconds: int | None = Field(default=None, description="NoExecute grace.")


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


class Resources(_Model):
    requests: dict[str, Quantity] = Field(
        default_factory=lambda: {"cpu": "1", "memory": "4Gi"},
        description="Container requests (GPUs come from topology).",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=lambda: {"memory": "16Gi"}, description="Container limits (nvidia.com/gpu is added)."
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


class RolloutStep(_Model):
    """One canary step: traffic weight, then a pause with analysis."""

    weight: int = Field(ge=1, le=100, description="Canary traffic percent at this step.")
    pause_seconds: int = Field(default=60, ge=0, le=86400, description="Hold before analysis may advance.")
    replicas: CountOrPercent | None = Field(
        default=None,
        description="Canary replicas at this step, apart from its traffic weight: a count or a percentage "
        "of spec.replicas ('25%', rounded up; at least 1, at most spec.replicas). Default: proportional to "
        "weight (replica ratio: weight% of the pods beside a full stable; Gateway API: weight% of "
        "spec.replicas).",
    )
    await_promotion: bool = Field(
        default=False,
        description="After the pause and a passing analysis, hold until `modeldeploy rollout promote` "
        "(Argo CD: Suspended); analysis keeps running and a failure still rolls back.",
    )


class SLO(_Model):
    ttft_seconds: float = Field(default=1.0, gt=0, description="Time-to-first-token SLO for goodput.")
    inter_token_seconds: float = Field(default=0.1, gt=0, description="Inter-token latency SLO for goodput.")


# Prometheus as the analysis source: the address, the label selector and PromQL templates.
PROM_URL_RE = r"^https?://([A-Za-z0-9.-]+|\[[0-9a-fA-F:.]+\])(:[0-9]{1,5})?(/[A-Za-z0-9._~%+=:@/-]*)?$"
PROM_MATCHERS_RE = r'^([ ]*[a-zA-Z_][a-zA-Z0-9_]*[ ]*(=|!=|=~|!~)[ ]*"[^"]*"[ ]*(,[ ]*[a-zA-Z_][a-zA-Z0-9_]*[ ]*(=|!=|=~|!~)[ ]*"[^"]*"[ ]*)*,?[ ]*)?$'
PROM_DURATION_RE = r"^[1-9][0-9]{0,6}(s|m|h)$"


def _only_placeholders(*names: str) -> str:
    """Regex: every `{word}` in the text is one of `names` (PromQL's own braces hold no bare word)."""
    known = "|".join(names)
    return f"^([^{{]|[{{]({known})[}}]|[{{][}}]|[{{][a-zA-Z0-9_]*([^a-zA-Z0-9_}}]|$))*$"


PROM_TEMPLATE_RE = _only_placeholders("bundle", "namespace", "selector", "window")
PROM_SELECTOR_RE = _only_placeholders("bundle", "namespace")
MSG_PROM_URL = "prometheus.address must be an http:// or https:// URL: scheme://host[:port][/path], no credentials or query"
MSG_PROM_SELECTOR = (
    'prometheus.selector must be comma-separated PromQL label matchers such as namespace="{namespace}" '
    "(placeholders: {bundle}, {namespace})"
)
MSG_PROM_QUERY = (
    "prometheus.queries: a template must contain {bundle} and no placeholders other than "
    "{bundle}, {namespace}, {selector}, {window}"
)
MSG_PROM_WINDOW = "prometheus.window must be a PromQL duration in whole s, m or h, e.g. 5m"


def _full(pattern: str, message: str, contains: str = "") -> AfterValidator:
    """Like `_matches`, but the whole string (re.match's `$` accepts a trailing newline; RE2's does not)."""

    def check(v: str) -> str:
        if not re.fullmatch(pattern, v) or contains not in v:
            raise ValueError(f"{message} (got {v!r})")
        return v

    return AfterValidator(check)


def _cel_all(message: str, *patterns: str, contains: str = "") -> dict[str, Any]:
    """One CEL rule for several checks; a regex backslash is doubled inside the CEL string literal."""
    rules = [f"self.matches('{p}')".replace("\\", "\\\\") for p in patterns]
    rules += [f"self.contains('{contains}')"] if contains else []
    return _cel(" && ".join(rules), message)


PromAddress = Annotated[
    str,
    _full(PROM_URL_RE, MSG_PROM_URL),
    Field(max_length=2048, json_schema_extra=_cel_all(MSG_PROM_URL, PROM_URL_RE)),
]
PromSelector = Annotated[
    str,
    _full(PROM_MATCHERS_RE, MSG_PROM_SELECTOR),
    _full(PROM_SELECTOR_RE, MSG_PROM_SELECTOR),
    Field(max_length=1024, json_schema_extra=_cel_all(MSG_PROM_SELECTOR, PROM_MATCHERS_RE, PROM_SELECTOR_RE)),
]
PromWindow = Annotated[
    str,
    _full(PROM_DURATION_RE, MSG_PROM_WINDOW),
    Field(max_length=16, json_schema_extra=_cel_all(MSG_PROM_WINDOW, PROM_DURATION_RE)),
]
PromQLTemplate = Annotated[
    str,
    _full(PROM_TEMPLATE_RE, MSG_PROM_QUERY, contains="{bundle}"),
    Field(max_length=4096, json_schema_extra=_cel_all(MSG_PROM_QUERY, PROM_TEMPLATE_RE, contains="{bundle}")),
]


class PrometheusQueries(_Model):
    """PromQL templates replacing the built-in ones (see operator/promql.py for the defaults).

    Each returns one cohort's increase over the window: the histogram ones one series per
    `le` (cumulative counts, +Inf included), the outcome one one series per `outcome`.
    """

    ttft_buckets: PromQLTemplate | None = Field(
        default=None, description="Time-to-first-token bucket increases, by le."
    )
    itl_buckets: PromQLTemplate | None = Field(
        default=None, description="Inter-token latency bucket increases, by le."
    )
    outcomes: PromQLTemplate | None = Field(
        default=None,
        description="Finished requests by outcome (completed, error, rejected, invalid, cancelled).",
    )


class PrometheusSource(_Model):
    """Where canary analysis reads the cohorts' metrics when it does not scrape the pods itself."""

    address: PromAddress = Field(
        description="Prometheus HTTP API base URL, e.g. http://prometheus-operated.monitoring.svc:9090."
    )
    selector: PromSelector = Field(
        default='namespace="{namespace}"',
        description="Label matchers added to every query next to bundle=; placeholders {namespace}, {bundle}.",
    )
    window: PromWindow | None = Field(
        default=None,
        description="Fixed PromQL range (e.g. 5m); default: since the current step began, at most 1h.",
    )
    queries: PrometheusQueries = Field(
        default_factory=PrometheusQueries, description="PromQL templates overriding the built-in ones."
    )


class Analysis(_Model):
    interval_seconds: int = Field(
        default=30, ge=5, le=3600, description="How often canary is compared to stable."
    )
    min_samples: int = Field(
        default=50, ge=1, description="Below this many requests per cohort the verdict is Inconclusive."
    )
    max_ttft_p95_ratio: float = Field(
        default=1.2, gt=0, description="Fail when canary TTFT p95 > ratio * stable."
    )
    max_inter_token_p95_ratio: float = Field(
        default=1.2, gt=0, description="Fail when canary ITL p95 > ratio * stable."
    )
    max_error_rate: float = Field(
        default=0.01, ge=0, le=1, description="Fail when canary error rate exceeds this."
    )
    min_goodput_ratio: float = Field(
        default=0.95, ge=0, description="Fail when canary goodput < ratio * stable."
    )
    slo: SLO = Field(default_factory=SLO, description="Latency SLOs that define goodput.")
    on_inconclusive: Literal["Hold", "Rollback"] = Field(
        default="Hold",
        description="An Inconclusive verdict (too few samples, metrics unreadable) after the step's pause: "
        "Hold keeps the step until a verdict or progressDeadlineSeconds; Rollback rolls back at once "
        "(reason AnalysisInconclusive).",
    )
    prometheus: PrometheusSource | None = Field(
        default=None,
        description="Read the cohorts' metrics from a Prometheus HTTP API; default: scrape cohort pods' /metrics.",
    )


class GatewayParentRef(_Model):
    """A Gateway (and listener) the HTTPRoute attaches to."""

    name: str = Field(max_length=253, description="Gateway name.")
    namespace: str | None = Field(default=None, max_length=63, description="Gateway namespace.")
    section_name: str | None = Field(default=None, max_length=253, description="Listener name.")


class GatewayAPI(_Model):
    parent_refs: list[GatewayParentRef] = Field(
        min_length=1, max_length=16, description="Gateways the HTTPRoute attaches to."
    )
    hostnames: list[str] = Field(default_factory=list, max_length=16, description="HTTPRoute hostnames.")
    cohort_header: str = Field(
        default="x-modeldeploy-cohort",
        max_length=256,
        description="Header whose value 'canary' pins to canary.",
    )


class TrafficRouting(_Model):
    gateway_api: GatewayAPI | None = Field(
        default=None,
        alias="gatewayAPI",
        description="Route by Gateway API HTTPRoute weights; default: by replica ratio.",
    )


class KeepPrevious(_Model):
    replicas: int = Field(default=1, ge=0, description="Warm replicas of the prior bundle after promotion.")
    seconds: int = Field(default=3600, ge=0, description="How long the prior bundle stays warm.")


class KeepPrior(_Model):
    """The prior bundle kept warm after a promotion, within a GPU budget and only on spare GPUs."""

    replicas: int = Field(default=1, ge=0, description="Warm replicas of the prior bundle after promotion.")
    max_gpus: int | None = Field(
        default=None,
        ge=0,
        alias="maxGPUs",
        description="GPU budget of the warm prior: at most maxGPUs / topology.gpusPerReplica replicas "
        "(default: no budget beyond replicas).",
    )
    seconds: int = Field(default=3600, ge=0, description="How long the prior bundle stays warm.")


def _default_steps() -> list[RolloutStep]:
    return [RolloutStep(weight=10), RolloutStep(weight=50)]


class Rollout(_Model):
    steps: list[RolloutStep] = Field(
        default_factory=_default_steps,
        max_length=20,
        description="Canary steps; weights strictly increasing in 1..100.",
        json_schema_extra=_cel(
            "self.all(a, self.exists_one(b, b.weight == a.weight)) && self.map(s, s.weight).isSorted()",
            MSG_STEPS,
        ),
    )
    analysis: Analysis = Field(default_factory=Analysis, description="Canary vs stable metric analysis.")
    conformance_gate: bool = Field(
        default=True, description="Run the serving-contract suite on a canary pod first."
    )
    traffic_routing: TrafficRouting = Field(
        default_factory=TrafficRouting, description="How traffic is split."
    )
    keep_previous: KeepPrevious = Field(
        default_factory=KeepPrevious,
        description="Deprecated, use keepPrior (which wins when set): warm prior bundle for fast rollback.",
    )
    keep_prior: KeepPrior | None = Field(
        default=None,
        description="Warm prior bundle for fast rollback, within a GPU budget: kept warm only within "
        "maxGPUs and only when the GPUs are spare (Replace on a full cluster: scaled to zero, a cold "
        "rollback target); status.rollout.prior says Warm or Cold and why.",
    )
    progress_deadline_seconds: int = Field(
        default=1800, ge=30, description="A rollout not done by then rolls back."
    )
    capacity: Literal["Surge", "Replace", "Auto"] = Field(
        default="Auto",
        description="Where the canary's GPUs come from. Surge: the canary runs beside a full stable (spare "
        "GPUs needed, up to spec.replicas more at promotion). Replace: stable is scaled down by k, then k "
        "canary replicas come up on the freed GPUs, never below minAvailable Ready; a rollback brings "
        "stable back before removing the canary where spare GPUs allow. Auto: Surge when the fit check "
        "finds spec.replicas more replicas fit on the nodes' spare GPUs (allocatable minus requested), "
        "else Replace; the choice is in the NewBundle Event and status.rollout.capacity.",
    )
    min_available: CountOrPercent = Field(
        default="75%",
        description="Ready replicas (stable and canary together) a Replace rollout never goes below: a count "
        "or a percentage of spec.replicas (rounded up). When moving one more replica would cross it, the "
        "rollout waits (Progressing reason InsufficientCapacity).",
    )

    @model_validator(mode="after")
    def _increasing(self) -> Rollout:
        w = [s.weight for s in self.steps]
        if any(b <= a for a, b in zip(w, w[1:], strict=False)):
            raise ValueError(MSG_STEPS)
        return self


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
        return self


class ModelDeployment(_Model):
    """The whole object as the operator sees it; metadata stays a plain dict."""

    model_config = ConfigDict(extra="ignore")
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus = Field(default_factory=ModelDeploymentStatus)
