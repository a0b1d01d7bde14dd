"""What the engine hands back per request per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    prefill_chunks: int = 0  # engine steps the prompt took (1 unless chunked prefill split it)


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # all generated so far
    new_token_ids: list[int]  # generated this step
    text: str  # all text so far (stop string excluded)
    delta_text: str  # text new since the previous output
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    metrics: RequestMetrics
    num_preemptions: int = 0
    extra: dict = field(default_factory=dict)
    index: int = 0  # choice index (n > 1)
    logprobs: list = field(default_factory=list)  # TokenLogprob per generated token, when asked
    new_logprobs: list = field(default_factory=list)  # those of new_token_ids
    # prompt_logprobs asked (choice 0): PromptLogprob of prompt tokens 1.. (token 0 has none), on every
    # output once the prefill is done; None otherwise
    prompt_logprobs: list | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    num_free_blocks: int
    num_total_blocks: int
    preemptions_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    steps_total: int
    prefix_cache_hit_tokens: int = 0
    lora_resident: tuple[str, ...] = ()  # adapters on the device now
    lora_loads_total: int = 0  # adapter copies host -> device slot
    tensor_parallel_size: int = 1
    tp_allreduce_bytes_total: int = 0  # bytes summed across ranks by rank 0's all-reduces


@dataclass
class CompileResult:
    """A grammar compile: `compiled` is the xgrammar object in-process, None from the engine core
    process (the compiled grammar stays in the core's cache, for the request that follows)."""

    compiled: Any
    seconds: float
    cached: bool


class EngineDead(RuntimeError):
    """The engine can no longer serve (its step loop raised, its core process died, or a
    tensor-parallel rank died): what every waiting request gets instead of its next output."""
