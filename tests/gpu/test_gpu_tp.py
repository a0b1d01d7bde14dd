"""Tensor parallelism over NCCL, one GPU per rank: TP=2 greedy tokens equal TP=1's (tiny llama,
fp32). Skips, with the reason, where fewer than 2 GPUs are visible; the gloo path is tested on
CPU (tests/runtime/engine/parallel/test_tensor_parallel.py)."""

from __future__ import annotations

import pytest
import torch


def test_tp2_greedy_equals_tp1(tiny_model):
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"{n} GPU(s) visible: tensor parallelism needs at least 2")
    from modeldeploy.runtime import LLM, SamplingParams

    d = tiny_model("llama", 0, hidden_size=256, num_heads=4, num_kv_heads=2)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [[5, 6, 7], list(range(20, 90)), list(range(100, 300))]
    one = [o.token_ids for o in LLM(d, dtype="float32", device="cuda").generate(prompts, params)]
    llm = LLM(d, dtype="float32", device="cuda", tensor_parallel_size=2)
    try:
        assert llm.engine.parallel_info()["backend"] == "nccl"
        assert [o.token_ids for o in llm.generate(prompts, params)] == one
    finally:
        llm.engine.close()
