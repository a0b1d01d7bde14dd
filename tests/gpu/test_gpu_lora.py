"""LoRA on CUDA: base + 2 adapters mixed in one batch (fp32, tiny llama) give transformers' greedy
tokens on the merged weights (W + scaling * B @ A), through the CuPy shrink/expand kernels."""

from __future__ import annotations

import torch

from modeldeploy_dev.lora_fixtures import hf_greedy, merged_model, write_lora

MAX_NEW = 16


def test_mixed_batch_matches_merged_weights(tiny_model, tmp_path, launches):
    from transformers import AutoConfig

    from modeldeploy.runtime import LLM, SamplingParams

    base = tiny_model("llama", 0, hidden_size=256, num_heads=4, num_kv_heads=2)
    cfg = AutoConfig.from_pretrained(base)
    pins, refs = [], {None: base}
    for j, (rank, alpha) in enumerate(((8, 16), (16, 8))):
        mats = write_lora(tmp_path / f"ad{j}", cfg, rank, alpha, seed=j, dtype=torch.float32, scale=0.2)
        pins.append({"name": f"ad{j}", "path": str(tmp_path / f"ad{j}")})
        refs[f"ad{j}"] = merged_model(base, tmp_path / f"merged{j}", mats, alpha / rank)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (5, 33, 70)]
    names = [None, "ad0", "ad1"]
    rows = [(p, n) for p in prompts for n in names]
    llm = LLM(base, dtype="float32", device="cuda", adapters=pins, max_loras=2)
    ours = llm.generate(
        [p for p, _ in rows], SamplingParams(temperature=0, max_tokens=MAX_NEW), adapter=[n for _, n in rows]
    )
    assert launches.get("lora_shrink_kernel"), launches
    for n in names:
        got = [o.token_ids for (_, rn), o in zip(rows, ours, strict=True) if rn == n]
        assert got == hf_greedy(refs[n], None, prompts, MAX_NEW, device="cuda"), f"adapter {n}"
    # the adapters really change the output: every prompt gives three different continuations
    by_prompt = [{tuple(o.token_ids) for o in ours[i : i + 3]} for i in range(0, len(ours), 3)]
    assert all(len(t) == 3 for t in by_prompt)
