"""CUDA graph decode (--cuda-graphs) gives eager decode's greedy tokens (tiny fp32 llama), and the
captured graphs are really replayed."""

from __future__ import annotations

import torch


def test_graph_decode_equals_eager(tiny_model):
    from modeldeploy.runtime import LLM, SamplingParams

    d = tiny_model("llama", 0, hidden_size=256, num_heads=4, num_kv_heads=2)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (1, 7, 16, 33, 100, 250)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    tokens = {}
    for graphs in (False, True):
        llm = LLM(d, dtype="float32", device="cuda", max_num_seqs=8, cuda_graphs=graphs)
        tokens[graphs] = [o.token_ids for o in llm.generate(prompts, params)]
        if graphs:
            assert llm.engine.runner.graphs.replays > 0
    differ = [i for i, (a, b) in enumerate(zip(tokens[False], tokens[True], strict=True)) if a != b]
    assert not differ, f"prompts {differ} differ between graph and eager decode"
