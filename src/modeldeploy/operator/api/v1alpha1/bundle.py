"""What a ModelDeployment serves (spec.bundle): engine image, model, tokenizer, adapters, config.

Everything here is hashed into the bundle id, so changing any of it is a canaried rollout; the
pins (image by digest, artifacts by manifest digest) and their CEL rules live next to the types.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from modeldeploy.oci import URI_PATTERN as OCI_URI_RE
from modeldeploy.oci import OciRefError, parse_oci_uri
from modeldeploy.operator.api.v1alpha1._model import _Model
from modeldeploy.operator.api.v1alpha1.common import _cel, _matches
from modeldeploy.operator.api.v1alpha1.network import _cel_re

PINNED_IMAGE_RE = r"^[^@ ]+@sha256:[0-9a-f]{64}$"
DIGEST_RE = r"^sha256:[0-9a-f]{64}$"
URI_RE = r"^(pvc|file|https?|oci)://.+$"
MSG_IMAGE = "engine.image must be pinned by digest: <repo>@sha256:<64 hex>, tags alone are not accepted"
MSG_DIGEST = "digest must be 'sha256:' followed by 64 lowercase hex characters"
MSG_URI = "uri must start with pvc://, file://, http://, https:// or oci://"
MSG_OCI = (
    "an oci:// uri must be pinned by digest: oci://REGISTRY/REPO@sha256:<64 hex> "
    "(REGISTRY a host with a dot or a port, or localhost; REPO lowercase), tags alone are not accepted"
)
MSG_PULL = "pullMethod and insecure apply only to oci:// uris"
# CEL string literals take no regex escapes such as \. : each backslash of the RE2 pattern is doubled
_OCI_CEL = OCI_URI_RE.replace("\\", "\\\\")
MSG_TOKENIZER = (
    "tokenizer.uri must be omitted or equal model.uri: "
    "the runtime loads the tokenizer from the model directory"
)
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
DEFAULT_SERVED_NAME = "model"  # the runtime's default: the model directory's name (children.MODEL_DIR)


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


def _oci_pinned(v: str) -> str:
    """The same acceptance as the CEL rule below: `parse_oci_uri`, the parser `modeldeploy fetch` uses."""
    if v.startswith("oci://"):
        try:
            parse_oci_uri(v)
        except OciRefError as e:
            raise ValueError(f"{MSG_OCI} (got {v!r}: {e})") from None
    return v


# What the pod needs of each scheme, held here so the API server refuses it (bench/crd_fuzz.py found these
# accepted and then failing every reconcile): a PVC claim name that is a DNS subdomain, a file:// path (the
# hostPath), no '..' element in a hostPath or PVC subPath, and an http(s) host that parses.
PVC_URI_RE = r"^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/.*)?$"
FILE_URI_RE = r"^file://[^/?#\[\]]*/"
BACKSTEP_RE = r"^(pvc|file)://(.*/)?[.][.](/.*)?$"
HTTP_URI_RE = r"^https?://([A-Za-z0-9.-]+|\[[0-9a-fA-F:.]+\])(:[0-9]{1,5})?([/?#].*)?$"
MSG_PVC_URI = "a pvc:// uri is pvc://CLAIM[/SUBPATH], CLAIM a PersistentVolumeClaim name (a DNS subdomain)"
MSG_FILE_URI = "a file:// uri needs a path (and no brackets): file:///PATH, the node directory for a hostPath"
MSG_BACKSTEP = "a pvc:// or file:// path must not contain a '..' element"
MSG_HTTP_URI = "an http(s):// uri needs a host name or a bracketed IP address, then an optional port and path"
_URI_RULES = (
    ("pvc://", PVC_URI_RE, MSG_PVC_URI),
    ("file://", FILE_URI_RE, MSG_FILE_URI),
    ("http://", HTTP_URI_RE, MSG_HTTP_URI),
    ("https://", HTTP_URI_RE, MSG_HTTP_URI),
)


def _uri_parts(v: str) -> str:
    """The pydantic twin of the per-scheme CEL rules, and a parse by urllib as the operator does."""
    for prefix, pattern, message in _URI_RULES:
        if v.startswith(prefix) and not re.match(pattern, v):
            raise ValueError(f"{message} (got {v!r})")
    if re.match(BACKSTEP_RE, v):
        raise ValueError(f"{MSG_BACKSTEP} (got {v!r})")
    try:
        urlparse(v)
    except ValueError as e:  # e.g. a bracketed host that is no IPv6 address
        raise ValueError(f"uri does not parse as a URL (got {v!r}: {e})") from None
    return v


Uri = Annotated[
    str,
    _matches(URI_RE, MSG_URI),
    AfterValidator(_oci_pinned),
    AfterValidator(_uri_parts),
    Field(
        max_length=2048,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"self.matches('{URI_RE}')", "message": MSG_URI},
                {"rule": f"!self.startsWith('oci://') || self.matches('{_OCI_CEL}')", "message": MSG_OCI},
                *(
                    {"rule": f"!self.startsWith('{p}') || self.matches('{_cel_re(r)}')", "message": m}
                    for p, r, m in _URI_RULES
                ),
                {"rule": f"!self.matches('{_cel_re(BACKSTEP_RE)}')", "message": MSG_BACKSTEP},
            ]
        },
    ),
]
PullMethod = Literal["ImageVolume", "InitContainer"]


def _pull_rules() -> dict[str, Any]:
    """The CEL twin of _Pulled._oci_only, for each class that has a uri (a fresh dict per class)."""
    rule = "(!has(self.pullMethod) && !has(self.insecure)) || self.uri.startsWith('oci://')"
    return _cel(rule, MSG_PULL)


class _Pulled(_Model):
    """How an oci:// artifact reaches the pod; unset fields leave the bundle id of other schemes as it was."""

    pull_method: PullMethod | None = Field(
        default=None,
        description="oci:// only. ImageVolume (default): an image volume (`volumes[].image`, beta and on by "
        "default since Kubernetes v1.35) mounted read-only; the kubelet pulls and caches the artifact like "
        "an image, with the pod's imagePullSecrets. InitContainer: for clusters without image volumes, an "
        "init container runs `modeldeploy fetch oci://...` into an emptyDir, verifying every blob and the "
        "model digest (credentials: the first of spec.imagePullSecrets, mounted as DOCKER_CONFIG).",
    )
    insecure: bool | None = Field(
        default=None,
        description="oci:// with pullMethod InitContainer: plain HTTP to a registry that is not on loopback "
        "(`modeldeploy fetch --insecure`, e.g. an in-cluster registry). Image volumes follow the node's "
        "container runtime registry configuration instead.",
    )

    @model_validator(mode="after")
    def _oci_only(self) -> _Pulled:
        uri = getattr(self, "uri", None) or ""
        if (self.pull_method is not None or self.insecure is not None) and not uri.startswith("oci://"):
            raise ValueError(MSG_PULL)
        return self


class EngineRef(_Model):
    image: PinnedImage = Field(description="Runtime image, pinned by digest (repo@sha256:...).")


class Artifact(_Pulled):
    model_config = ConfigDict(json_schema_extra=_pull_rules())
    uri: Uri = Field(
        description="Where the files are: pvc://CLAIM[/SUBPATH], file:///HOST/PATH (hostPath, dev clusters), "
        "http(s)://URL (fetched by an init container that verifies the digest), or "
        "oci://REGISTRY/REPO@sha256:<64 hex> (an OCI artifact from `modeldeploy model push`, pinned by its "
        "manifest digest; mounted as an image volume, see pullMethod)."
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


class AdapterRef(_Pulled):
    """A LoRA adapter (PEFT directory), pinned like the model; clients select it with `model: <name>`."""

    model_config = ConfigDict(json_schema_extra=_pull_rules())

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
    # the Deployment's secretKeyRef takes a DNS-subdomain name and a config-map-style key; anything else was
    # accepted here and then refused on every Deployment create (bench/crd_fuzz.py found it)
    name: str = Field(
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="Secret name in the same namespace (a DNS subdomain).",
    )
    key: str = Field(
        max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="Key within the Secret ([-._a-zA-Z0-9]+)."
    )


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
    cuda_graphs: bool | None = Field(
        default=None,
        description="Replay pure-decode steps from CUDA graphs captured at load (--cuda-graphs); needs a "
        "CUDA device, not with tensorParallel > 1. Unset: off (and the bundle id of a bundle without it).",
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
        description="Secret key holding the API key; given to the runtime as env MODELDEPLOY_API_KEY, "
        "never read by the operator. The operator's gates send a token of their own, which the pods "
        "check against its sha256 (env MODELDEPLOY_GATE_KEY_SHA256); an operator without a gate key "
        "refuses this together with a gate (NoGateKey).",
    )
    hf_overrides: dict[str, Any] | None = Field(
        default=None,
        description="Fields of the model's config.json replaced at load (--hf-overrides, vLLM's "
        "hf_overrides), keyed as in config.json (e.g. rope_theta: 1000000); nested objects merge. A name "
        "the model's config does not have fails the load (the pod never turns Ready). Part of the bundle "
        "id: a numerics change is a new bundle, and the quality gate judges it.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )

    @field_validator("hf_overrides")
    @classmethod
    def _overrides(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        """Keys are config.json field names; the size bound keeps a bundle (and its args) small."""
        for key in v or {}:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", key):
                raise ValueError(f"hfOverrides: {key!r} is not a config.json field name")
        if v and len(json.dumps(v)) > 4096:
            raise ValueError("hfOverrides: at most 4096 bytes of JSON")
        return v


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
                    "(has(self.config.servedModelName) ? self.config.servedModelName : "
                    f"'{DEFAULT_SERVED_NAME}'))",
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
        description="LoRA adapters served beside the base model, each pinned by digest; "
        "part of the bundle id, so changing one is a canaried rollout.",
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
