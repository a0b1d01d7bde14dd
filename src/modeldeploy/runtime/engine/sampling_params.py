"""Per-request sampling settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

GRAMMAR_KINDS = ("json_schema", "json_object", "structural_tag")


@dataclass
class Structured:
    """A decoding constraint: `json_schema` (schema is canonical JSON text), `json_object` (any JSON
    object) or `structural_tag` (xgrammar's: free text, constrained inside tags once a trigger appears).

    `compiled` is filled by whoever compiled it ahead of the step loop (the in-thread engine client does
    so on a worker thread); the engine compiles synchronously when it is still empty.
    """

    kind: str
    schema: str | None = None
    compiled: Any = field(default=None, repr=False, compare=False)


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 (or < 1e-5) = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = all tokens
    seed: int | None = None  # per-request generator: same seed, same tokens
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0  # OpenAI: minus this for every token already generated
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count in the output
    repetition_penalty: float = 1.0  # vLLM/HF: divide positive (multiply negative) logits of seen tokens
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens exist
    logprobs: int | None = None  # None: off; k >= 0: the chosen token's logprob and the top k
    # None: off; k >= 0: every prompt token's logprob (teacher-forced), its rank and the top k (vLLM's)
    prompt_logprobs: int | None = None
    n: int = 1  # sequences sampled from one prompt (its KV blocks shared by reference)
    structured: Structured | None = None

    @property
    def greedy(self) -> bool:
        # Below 1e-5 the scaled logits overflow float32; argmax is what such a temperature means.
        return self.temperature < 1e-5

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field (in field order)."""
        self._validate_sampling()
        self._validate_stops()
        self._validate_penalties()
        self._validate_outputs()

    def _validate_sampling(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature: must be in [0, 100], got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k: must be -1 (disabled) or >= 0, got {self.top_k!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")

    def _validate_stops(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop: every stop sequence must be a non-empty string")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids: every id must be a non-negative integer")

    def _validate_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and -2.0 <= v <= 2.0):
                raise ValueError(f"{name}: must be in [-2, 2], got {v!r}")
        if not (isinstance(self.repetition_penalty, int | float) and 0.0 < self.repetition_penalty <= 10.0):
            raise ValueError(f"repetition_penalty: must be in (0, 10], got {self.repetition_penalty!r}")
        for tok, bias in self.logit_bias.items():
            if not isinstance(tok, int) or tok < 0:
                raise ValueError(f"logit_bias: token id {tok!r} must be a non-negative integer")
            if not (isinstance(bias, int | float) and math.isfinite(bias) and -100 <= bias <= 100):
                raise ValueError(f"logit_bias: bias for token {tok} must be in [-100, 100], got {bias!r}")

    def _validate_outputs(self) -> None:
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens: must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs: must be an integer in [0, 20], got {self.logprobs!r}")
        k = self.prompt_logprobs
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 20):
            raise ValueError(f"prompt_logprobs: must be an integer in [0, 20], got {k!r}")
        if not isinstance(self.n, int) or not 1 <= self.n <= 16:
            raise ValueError(f"n: must be an integer in [1, 16], got {self.n!r}")
        if self.structured is not None and self.structured.kind not in GRAMMAR_KINDS:
            raise ValueError(f"structured: kind must be one of {', '.join(GRAMMAR_KINDS)}")
