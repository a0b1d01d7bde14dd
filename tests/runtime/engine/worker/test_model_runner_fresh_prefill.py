"""The CPU fast path for fresh prompts (runtime/engine/worker/model_runner.py `_fresh`, llama.py): where the
paged prefill is the torch twin, a step whose prefill chunks are all whole prompts with nothing cached
attends with SDPA over the new K/V; any chunk after a cached prefix sends the whole step through the
paged kernel. Both must agree."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.llm_engine import LLMEngine
from modeldeploy.runtime.engine.sampling_params import SamplingParams
from modeldeploy.runtime.engine.worker import model_runner as MR


def _plan(cu: list[int], lens: list[int]) -> MR.StepPlan:
    return MR.StepPlan([], [], [], [], [], [], cu, lens, [])


def test_fresh_spans_only_when_every_chunk_is_a_whole_uncached_prompt():
    twin = SimpleNamespace(sdpa_fresh=True)  # CPU whose paged prefill is the gathering twin
    assert MR.ModelRunner._fresh(twin, _plan([0, 5, 12], [5, 7])) == [(0, 5), (5, 12)]
    assert MR.ModelRunner._fresh(twin, _plan([0, 5, 12], [5, 39])) is None  # 2nd: 32 cached tokens
    assert MR.ModelRunner._fresh(twin, _plan([0], [])) is None  # decodes only
    kernel = SimpleNamespace(sdpa_fresh=False)  # the C++ prefill or CUDA: pages read in place
    assert MR.ModelRunner._fresh(kernel, _plan([0, 5], [5])) is None


def test_sdpa_for_fresh_prompts_only_where_the_paged_prefill_is_the_twin(monkeypatch):
    """CUDA never; CPU with the C++ prefill (faster than SDPA now) not for its dtypes; CPU without it yes."""
    from modeldeploy.kernels import cpu_attention, dispatch

    cache = torch.zeros(2, 16, 1, 8)
    assert dispatch.sdpa_for_fresh_prompts(cache) is (not cpu_attention.available())
    assert dispatch.sdpa_for_fresh_prompts(cache.half()) is True  # float16: the C++ kernel's twin
    monkeypatch.setattr(dispatch, "_cpu_checked", True)
    monkeypatch.setattr(dispatch, "_CPU", {})
    assert dispatch.sdpa_for_fresh_prompts(cache) is True


def _greedy(engine: LLMEngine, rid: str, prompt: list[int], n: int = 12) -> list[int]:
    engine.add_request(rid, prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    for _ in range(200):  # bounded: n tokens take at most n + a few steps
        for out in engine.step():
            if out.request_id == rid and out.finished:
                return list(out.token_ids)
    raise AssertionError("request did not finish in 200 steps")


def test_fresh_and_paged_prefill_give_the_same_tokens(llama_dir, monkeypatch):
    """The same prompt: first fresh (SDPA), then with its prefix cached (paged kernel over the
    cached blocks, since the chunk after a cache hit is not fresh), then with the fast path off."""
    engine = LLMEngine(EngineConfig(model=str(llama_dir), device="cpu", enable_prefix_caching=True))
    engine.runner.sdpa_fresh = True  # as without the C++ prefill, whatever this machine has
    seen: list[bool] = []
    fresh = MR.ModelRunner._fresh

    def spy(self, plan):
        spans = fresh(self, plan)
        if len(plan.prefill_cu) > 1:
            seen.append(spans is not None)
        return spans

    monkeypatch.setattr(MR.ModelRunner, "_fresh", spy)
    prompt = [(7 * i) % 400 + 5 for i in range(70)]  # 4 full blocks of 16 to cache, then 6 tokens
    first = _greedy(engine, "a", prompt)
    assert seen[0] is True
    seen.clear()
    cached = _greedy(engine, "b", prompt)
    assert seen[0] is False  # the prefix came from the cache: the paged kernel ran
    monkeypatch.setattr(MR.ModelRunner, "_fresh", lambda self, plan: None)
    engine2 = LLMEngine(EngineConfig(model=str(llama_dir), device="cpu", enable_prefix_caching=False))
    paged = _greedy(engine2, "c", prompt)
    assert first == cached == paged
