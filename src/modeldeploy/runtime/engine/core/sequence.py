"""A sequence: one request's tokens and where it stands in the engine."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from modeldeploy.runtime.engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    adapter_id: int = -1  # LoRA adapter (index in EngineConfig.adapters); -1 = the base model
    token_ids: list[int] = field(init=False)  # prompt + generated
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0  # leading blocks registered in the prefix cache
    status: Status = Status.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    prefill_chunks: int = 0  # steps its prompt took before the first token (chunked prefill), for traces
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_emitted_tokens: int = 0  # generated tokens already handed to the client
    group_id: str = ""  # the request this sequence answers (n > 1: several sequences share it)
    index: int = 0  # choice index within the request
    grammar: Any = None  # the grammar matcher of a constrained sequence; advances with each token
    logprobs: list = field(default_factory=list)  # TokenLogprob per generated token, when asked
    # PromptLogprob of prompt tokens 1.. (token 0 has none), filled prefill chunk by prefill chunk
    prompt_logprobs: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.group_id = self.group_id or self.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def scores_prompt(self) -> bool:
        """Prompt positions still need their logprobs (choice 0 of a request that asked; the other
        choices share its prompt). While true, the prefix cache must not skip any of them."""
        return (
            self.params.prompt_logprobs is not None
            and self.index == 0
            and len(self.prompt_logprobs) < self.num_prompt_tokens - 1
        )

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
