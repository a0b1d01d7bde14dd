"""LoRA's cost in an 8B-shaped bf16 decode step (random weights): batch 32 = 8 base rows + 8 rows
of each of 3 rank-16 adapters, against 32 base rows; and the bytes of one adapter slot.

    python3 bench/gpu/lora.py OUT.json
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from modeldeploy_dev.gpu_bench import LLAMA3_8B, dummy_model, main
from modeldeploy_dev.lora_fixtures import write_lora

DECODE_STEPS = 32


def measure() -> dict:
    import torch

    from modeldeploy.runtime import LLM, SamplingParams
    from modeldeploy.runtime.models.llama import ModelArgs

    cfg = LLAMA3_8B
    args = ModelArgs(
        architecture="LlamaForCausalLM",
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["hidden_size"] // cfg["num_attention_heads"],
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        qkv_bias=False,
        qk_norm=False,
        rope={},
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        d = dummy_model(tmp / "big", cfg)
        pins = []
        for j in range(3):
            write_lora(tmp / f"ad{j}", args, 16, 32, seed=10 + j, dtype=torch.bfloat16)
            pins.append({"name": f"ad{j}", "path": str(tmp / f"ad{j}")})
        llm = LLM(
            d,
            dtype="bfloat16",
            device="cuda",
            load_format="dummy",
            max_model_len=1024,
            max_num_seqs=32,
            max_num_batched_tokens=32 * 512,
            num_kv_blocks=32 * 40,
            adapters=pins,
            max_loras=3,
            enable_prefix_caching=False,
        )
        eng = llm.engine

        def median_step(names: list[str | None], tag: str) -> float:
            p = SamplingParams(temperature=0, max_tokens=DECODE_STEPS + 1, ignore_eos=True)
            for i, n in enumerate(names):
                eng.add_request(f"{tag}{i}", [(13 * i + j) % 500 + 3 for j in range(512)], p, adapter=n)
            eng.step()  # prefill
            times = []
            while eng.has_work():
                torch.cuda.synchronize()
                t = time.perf_counter()
                eng.step()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            return sorted(times)[len(times) // 2]

        mixed_names = [None, "ad0", "ad1", "ad2"] * 8
        median_step(mixed_names, "wm")
        median_step([None] * 32, "wb")
        mixed = sorted(median_step(mixed_names, f"m{r}") for r in range(3))[1]
        base = sorted(median_step([None] * 32, f"b{r}") for r in range(3))[1]
        return {
            "shape": "8B bf16 r16 x3, batch 32, ctx 512",
            "mixed_step_s": mixed,
            "base_step_s": base,
            "ratio": mixed / base,
            "slot_bytes": eng.info()["lora"]["slot_bytes"],
        }


if __name__ == "__main__":
    sys.exit(main(measure))
