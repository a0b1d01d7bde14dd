"""The engine's greedy tokens on CUDA (float32, CuPy kernels) equal transformers' on tiny models:
head_dim 64 with GQA, head_dim 128 with one KV head and llama3 rope, and qwen3's q/k norm."""

from __future__ import annotations

import pytest
import torch

from modeldeploy_dev.lora_fixtures import hf_greedy

MAX_NEW = 24
VARIANTS = {
    "llama-d64-g2": ("llama", {"hidden_size": 256, "num_heads": 4, "num_kv_heads": 2}),
    "llama-d128-llama3rope": (
        "llama",
        {"hidden_size": 512, "num_heads": 4, "num_kv_heads": 1, "rope_scaling": "llama3"},
    ),
    "qwen3-d64-g2": ("qwen3", {"hidden_size": 256, "num_heads": 4, "num_kv_heads": 2}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_matches_transformers(variant, tiny_model, launches):
    from modeldeploy.runtime import LLM, SamplingParams

    arch, sizes = VARIANTS[variant]
    d = tiny_model(arch, seed=list(VARIANTS).index(variant), **sizes)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (1, 7, 16, 33, 100, 250)]
    ours = LLM(d, dtype="float32", device="cuda").generate(
        prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW)
    )
    assert launches.get("paged_attention_kernel") and launches.get("rms_norm_kernel"), launches
    ref = hf_greedy(d, None, prompts, MAX_NEW, device="cuda")
    mismatched = [i for i, (o, r) in enumerate(zip(ours, ref, strict=True)) if o.token_ids != r]
    assert not mismatched, f"prompts {mismatched} differ from transformers"
