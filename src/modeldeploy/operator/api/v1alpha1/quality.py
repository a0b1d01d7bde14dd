"""The quality gate's settings (spec.rollout.analysis.quality): a pinned evaluation set and thresholds.

An evaluation set is a list of items, each a prompt (or chat messages), a token budget and exactly
one check of the answer: `exact`, `contains`, `regex` or `jsonSchema`. It is pinned by the sha256 of
its canonical JSON (`eval_set_digest`): a ConfigMap's content must match the digest the spec pins,
so an edited ConfigMap is refused, never silently used. Each rule is checked twice, by pydantic and
by a CEL rule the API server runs, with the same message.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from modeldeploy.operator.api.v1alpha1._model import _Model

CHECKS = ("exact", "contains", "regex", "jsonSchema")
DIGEST_RE = r"^sha256:[0-9a-f]{64}$"
MSG_ONE_CHECK = "an evaluation item needs exactly one check: exact, contains, regex or jsonSchema"
MSG_ONE_PROMPT = "an evaluation item needs exactly one of prompt or messages"
MSG_ONE_SOURCE = "evalSet needs exactly one of inline or configMapRef"
MSG_CM_DIGEST = "evalSet.configMapRef needs evalSet.digest (sha256:<64 hex>) pinning the ConfigMap's items"
MSG_DIGEST = "evalSet.digest must be sha256: followed by 64 lowercase hex digits"
# The JSON Schema keywords the gate's validator implements (operator/analysis/quality_checks.py):
# a schema using any other is refused at apply, not judged wrongly later.
SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "minimum",
    "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", "description", "title",
})  # fmt: skip
SCHEMA_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})


def _schema_problems(schema: Any, at: str = "jsonSchema") -> list[str]:
    """Why the gate could not judge answers against `schema` (empty: it can)."""
    if not isinstance(schema, dict):
        return [f"{at}: a schema must be an object"]
    out = [f"{at}: unsupported JSON Schema keyword {k!r}" for k in schema if k not in SCHEMA_KEYWORDS]
    types = schema.get("type")
    for t in types if isinstance(types, list) else [types] if types is not None else []:
        if t not in SCHEMA_TYPES:
            out.append(f"{at}.type: unknown type {t!r}")
    for k, sub in (schema.get("properties") or {}).items():
        out += _schema_problems(sub, f"{at}.properties.{k}")
    for k in ("items", "additionalProperties"):
        if isinstance(schema.get(k), dict):
            out += _schema_problems(schema[k], f"{at}.{k}")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except (re.error, TypeError) as e:
            out.append(f"{at}.pattern: not a regular expression: {e}")
    return out


class ChatMessage(_Model):
    """One chat message of an evaluation item."""

    role: Literal["system", "user", "assistant"] = Field(description="system, user or assistant.")
    content: str = Field(max_length=65536, description="The message text.")


class EvalItem(_Model):
    """One prompt, answered greedily by each cohort, and the one check its answer must pass."""

    prompt: str | None = Field(
        default=None, max_length=65536, description="A user message (or use messages for a conversation)."
    )
    messages: list[ChatMessage] | None = Field(
        default=None, min_length=1, max_length=64, description="Chat messages, as the chat API takes them."
    )
    max_tokens: int = Field(default=32, ge=1, le=1024, description="Answer length budget (greedy).")
    exact: str | None = Field(
        default=None,
        max_length=4096,
        description="The answer, stripped of surrounding whitespace, equals this.",
    )
    contains: str | None = Field(
        default=None, max_length=4096, description="The answer contains this (case-insensitive)."
    )
    regex: str | None = Field(
        default=None,
        max_length=4096,
        description="A Python regular expression found in the answer (re.search).",
    )
    json_schema: dict[str, Any] | None = Field(
        default=None,
        description="The answer (or its first JSON object or array) parses as JSON and satisfies this schema "
        "(keywords: type, properties, required, additionalProperties, items, enum, const, minimum, maximum, "
        "minLength, maxLength, pattern, minItems, maxItems).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )

    model_config = _Model.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.exact), has(self.contains), has(self.regex), has(self.jsonSchema)]"
                    ".filter(x, x).size() == 1",
                    "message": MSG_ONE_CHECK,
                },
                {"rule": "has(self.prompt) != has(self.messages)", "message": MSG_ONE_PROMPT},
            ]
        }
    }

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"regex: not a Python regular expression: {e} (got {v!r})") from e
        return v

    @field_validator("json_schema")
    @classmethod
    def _judgeable(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        problems = _schema_problems(v) if v is not None else []
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @model_validator(mode="after")
    def _one_each(self) -> EvalItem:
        if sum(getattr(self, k) is not None for k in ("exact", "contains", "regex", "json_schema")) != 1:
            raise ValueError(MSG_ONE_CHECK)
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(MSG_ONE_PROMPT)
        return self

    def chat(self) -> list[dict[str, str]]:
        """The item as chat messages."""
        if self.messages is not None:
            return [m.model_dump() for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]


def canonical(items: list[EvalItem]) -> bytes:
    """The items as canonical JSON (camelCase, no nulls, sorted keys, no spaces): what the digest covers."""
    dumped = [i.model_dump(mode="json", by_alias=True, exclude_none=True) for i in items]
    return json.dumps(dumped, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def eval_set_digest(items: list[EvalItem]) -> str:
    """sha256:<hex> of the canonical JSON: the same items give the same digest wherever they are written."""
    return "sha256:" + hashlib.sha256(canonical(items)).hexdigest()


class ConfigMapRef(_Model):
    name: str = Field(max_length=253, description="ConfigMap in the ModelDeployment's namespace.")
    key: str = Field(
        default="items.json", max_length=253, description="Data key holding the items as a JSON list."
    )


class EvalSet(_Model):
    """The evaluation items, inline or in a ConfigMap, pinned by digest."""

    inline: list[EvalItem] | None = Field(
        default=None, min_length=1, max_length=500, description="The items themselves."
    )
    config_map_ref: ConfigMapRef | None = Field(
        default=None, description="A ConfigMap key holding the items as a JSON list (digest required)."
    )
    digest: str | None = Field(
        default=None,
        max_length=71,
        pattern=DIGEST_RE,
        description="sha256 of the items' canonical JSON (`modeldeploy` prints it in status.lastQuality). "
        "Required with configMapRef: a ConfigMap whose items no longer match is refused "
        "(rollback EvalSetMismatch). Inline: optional, checked when given.",
    )

    model_config = _Model.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": "has(self.inline) != has(self.configMapRef)", "message": MSG_ONE_SOURCE},
                {"rule": "!has(self.configMapRef) || has(self.digest)", "message": MSG_CM_DIGEST},
            ]
        }
    }

    @model_validator(mode="after")
    def _pinned(self) -> EvalSet:
        if (self.inline is None) == (self.config_map_ref is None):
            raise ValueError(MSG_ONE_SOURCE)
        if self.config_map_ref is not None and self.digest is None:
            raise ValueError(MSG_CM_DIGEST)
        if self.inline is not None and self.digest is not None:
            got = eval_set_digest(self.inline)
            if got != self.digest:
                raise ValueError(f"evalSet.digest {self.digest} does not match the inline items ({got})")
        return self


class Quality(_Model):
    """Canary against stable on the same pinned prompts, answered greedily, before any traffic.

    Every threshold left unset comes from the spread of harmless changes measured for the cohorts'
    precision (float32 on both sides, or anything else; bench/results/quality.md): in float32 a harmless
    change (batch size, scheduling, tensor parallelism, file layout) reproduces the greedy answers and
    their log-probabilities to under 5e-5 nats, so the float32 tolerances are tight; lower precisions
    reorder sums with the batch and get the wider ones. Set a field to override its default.
    """

    enabled: bool = Field(default=True, description="Run the quality gate (false: skip it).")
    eval_set: EvalSet | None = Field(
        default=None,
        description="The pinned evaluation set; default: the built-in set (its digest in status).",
    )
    max_accuracy_drop: int | None = Field(
        default=None,
        ge=0,
        description="Fail when the canary passes more than this many items fewer than stable. Default: a "
        "share of the set by precision (float32: 3 %, at least 1 item; else 10 %).",
    )
    agreement_tokens: int = Field(
        default=8, ge=1, le=256, description="Greedy agreement compares the first N answer tokens."
    )
    min_agreement: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Fail when fewer than this share of items agree on their first agreementTokens tokens. "
        "Default: 0.9 in float32, else 0.5.",
    )
    min_answer_agreement: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Fail when fewer than this share of items get the same whole greedy answer (where it "
        "stops included: a changed end-of-turn id shows here). Default: 0.85 in float32, else not judged "
        "(0).",
    )
    max_logprob_drop: float | None = Field(
        default=None,
        ge=0,
        description="Fail when the mean per-token log-probability of stable's answers drops by more than "
        "this (nats) when scored by the canary (teacher forcing). Default: 0.005 in float32, else 0.1.",
    )
    max_logprob_delta: float | None = Field(
        default=None,
        ge=0,
        description="Fail when the mean per-token |change| of that log-probability, either way, exceeds this "
        "(nats): a canary more confident in stable's answers has changed too. Default: 0.001 in float32, "
        "else 0.1.",
    )
    max_kl: float | None = Field(
        default=None,
        ge=0,
        description="Fail when the mean per-token KL(stable || canary) of the next-token distributions along "
        "stable's answers (top tokens, nats) exceeds this. Default: 0.0005 in float32, else 0.05.",
    )
    accuracy_floor: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="An intended model change: when the canary serves a new model digest, judge it by this "
        "absolute accuracy (share of items passing) instead of against stable's answers.",
    )
    timeout_seconds: int = Field(
        default=300, ge=10, le=3600, description="No verdict by then: rollback QualityTimeout."
    )
    at_each_step: bool = Field(
        default=False,
        description="Run the gate again when each canary step begins, under live traffic: the step does not "
        "advance before it passes (timeoutSeconds from the step's start), and a failure rolls back.",
    )
