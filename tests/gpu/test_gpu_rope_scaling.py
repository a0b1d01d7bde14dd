"""RoPE scaling on CUDA (float32, CuPy kernels, CUDA graphs on): greedy tokens equal transformers' past
the original context for the static yarn and the length-dependent dynamic and longrope types. The CPU
suite (tests/runtime/models/test_rope_scaling.py) covers every type and path; this is the GPU's share:
the cos/sin cache moved to the device, longrope's long rows replayed by the graphs, dynamic NTK's
per-step rows run eagerly beside them."""

from __future__ import annotations

import pytest
import torch

NEW = 32
LENGTHS = (9, 50, 90)  # against 64 original positions: crossing while decoding, and past it from the start


@pytest.mark.parametrize("kind", ["yarn", "dynamic", "longrope"])
def test_greedy_past_the_original_context_matches_transformers(kind, tiny_model):
    from transformers import AutoModelForCausalLM

    from modeldeploy.runtime import LLM, SamplingParams

    d = tiny_model(
        "llama", hidden_size=256, num_heads=4, num_kv_heads=2, max_position_embeddings=64, rope_scaling=kind
    )
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(6, 500, (n,), generator=gen).tolist() for n in LENGTHS]
    params = SamplingParams(temperature=0, max_tokens=NEW, min_tokens=NEW)
    llm = LLM(d, dtype="float32", device="cuda", max_num_seqs=4, cuda_graphs=True)
    try:
        ours = [o.token_ids for o in llm.generate(prompts, params)]
        if kind != "dynamic":  # dynamic: each decode step holds a token past 64 with rows of its own
            assert llm.engine.runner.graphs.replays > 0
    finally:
        llm.engine.close()
    ref = []
    for ids in prompts:  # a fresh model per prompt: transformers' dynamic rope keeps state across calls
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).to("cuda").eval()
        x = torch.tensor([ids], device="cuda")
        with torch.no_grad():
            g = hf.generate(
                x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW
            )
        ref.append(g[0, len(ids) :].tolist())
    mismatched = [i for i, (o, r) in enumerate(zip(ours, ref, strict=True)) if o != r]
    assert not mismatched, f"{kind}: prompts {mismatched} differ from transformers"
