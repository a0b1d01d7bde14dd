"""transformers' own greedy decoding: the reference every engine equality test compares with."""

from __future__ import annotations

import torch

MAX_NEW = 24


TEXT_PROMPTS = [
    "The quick brown fox",
    "Kubernetes schedules pods onto nodes that have room for them. A node with eight GPUs",
    "A",
    "def forward(x): return down(silu(gate(x)) * up(x))",
    "Time to first token measures how long a user waits before anything appears. Inter-token latency "
    "measures how smooth the stream feels after that, and goodput counts only the requests that met",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64",
]


TOKEN_PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 20 + 53))]  # 8 prompts in all, 1..~70 tokens


def hf_greedy(model_dir, prompts_ids: list[list[int]]) -> tuple[list[list[int]], list[torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs, first_logits = [], []
    with torch.no_grad():
        for ids in prompts_ids:
            x = torch.tensor([ids])
            first_logits.append(hf(x).logits[0, -1].float())
            g = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW)
            outs.append(g[0, len(ids) :].tolist())
    return outs, first_logits
