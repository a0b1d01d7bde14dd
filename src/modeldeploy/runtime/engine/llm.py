"""Offline generation: `LLM(model_dir, **config).generate(prompts, params)`."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import cast

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.llm_engine import LLMEngine
from modeldeploy.runtime.engine.output import RequestOutput
from modeldeploy.runtime.engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, **config):
        self.engine = LLMEngine(EngineConfig(model=str(model), **config))
        self._next_id = 0

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[int] | Seq[str | list[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        adapter: str | None | Seq[str | None] = None,
    ) -> list[RequestOutput]:
        """All prompts are submitted together and batched continuously; outputs keep prompt order
        (with n > 1, a prompt's n choices in index order).
        `adapter`: a LoRA adapter name for all prompts, or one per prompt (None = base model)."""
        batch: list[str | list[int]]
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            batch = [cast("str | list[int]", prompts)]  # one prompt: text, or token ids
        else:
            batch = list(cast("Seq[str | list[int]]", prompts))
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, Seq) else [params] * len(batch)
        if len(plist) != len(batch):
            raise ValueError(f"params: {len(plist)} SamplingParams for {len(batch)} prompts")
        alist = [adapter] * len(batch) if adapter is None or isinstance(adapter, str) else list(adapter)
        if len(alist) != len(batch):
            raise ValueError(f"adapter: {len(alist)} adapters for {len(batch)} prompts")
        ids = []
        for prompt, p, a in zip(batch, plist, alist, strict=True):
            rid = f"offline-{self._next_id}"
            self._next_id += 1
            self.engine.add_request(rid, prompt, p, adapter=a)
            ids.append(rid)
        done: dict[tuple[str, int], RequestOutput] = {}
        while self.engine.has_work():
            for out in self.engine.step():
                if out.finished:
                    done[(out.request_id, out.index)] = out
        return [done[(r, i)] for r, p in zip(ids, plist, strict=True) for i in range(p.n)]
