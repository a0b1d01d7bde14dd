"""8B-shaped bf16 decode (random weights): the engine's tokens/s over pure-decode steps at batch
1/8/32/64 and context ~1k, bytes per step (weights + KV) over step time against the copy
roofline, and transformers `generate` tokens/s at the same batch.

    python3 bench/gpu/decode.py OUT.json
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

from modeldeploy_dev.gpu_bench import (
    LLAMA3_8B,
    bytes_per_step,
    copy_bandwidth,
    dummy_model,
    error_fields,
    main,
)

BATCHES = (1, 8, 32, 64)
CONTEXT, DECODE_STEPS = 1000, 32


def ours(model_dir: Path, gen) -> list[dict]:
    """Tokens/s over steps in which every sequence decodes (prefill steps excluded)."""
    import torch

    from modeldeploy.runtime import LLM, SamplingParams

    blocks = max(BATCHES) * (-(-(CONTEXT + DECODE_STEPS + 8) // 16)) + 64
    llm = LLM(
        model_dir,
        dtype="bfloat16",
        device="cuda",
        load_format="dummy",
        max_num_seqs=max(BATCHES),
        max_num_batched_tokens=8192,
        enable_prefix_caching=False,
        num_kv_blocks=blocks,
        max_model_len=CONTEXT + DECODE_STEPS + 32,
    )
    warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate([[5] * 64, [6] * 32], warm)
    eng, rows = llm.engine, []
    for b in BATCHES:
        params = SamplingParams(temperature=0, max_tokens=DECODE_STEPS + 1, ignore_eos=True)
        for j in range(b):
            prompt = torch.randint(10, 500, (CONTEXT,), generator=gen).tolist()
            eng.add_request(f"bench-{b}-{j}", prompt, params)
        decode_time, decode_tokens = 0.0, 0
        while eng.has_work():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs = eng.step()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if len(outs) == b and all(len(o.token_ids) >= 2 for o in outs):  # a pure decode step
                decode_time += dt
                decode_tokens += b
        rows.append(
            {
                "batch": b,
                "tokens_per_s": decode_tokens / decode_time,
                "decode_steps": decode_tokens // b,
                "bytes_per_step": bytes_per_step(LLAMA3_8B, b, CONTEXT + DECODE_STEPS // 2),
                "step_s": decode_time / max(1, decode_tokens // b),
            }
        )
    return rows


def transformers_generate(gen) -> list[dict]:
    """transformers generate at the same batch: (time(1 + N new) - time(1 new)) / N per token."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(**{k: v for k, v in LLAMA3_8B.items() if k not in ("architectures", "model_type")})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    rows = []
    for b in BATCHES:
        x = torch.randint(10, 500, (b, CONTEXT), generator=gen).to("cuda")

        def run(n, x=x):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    do_sample=False,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    pad_token_id=0,
                )
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        run(2)  # warm-up at this shape
        t = run(DECODE_STEPS + 1) - run(1)
        rows.append({"batch": b, "tokens_per_s": b * DECODE_STEPS / t})
    model = None
    torch.cuda.empty_cache()
    return rows


def measure() -> dict:
    import torch

    gen = torch.Generator().manual_seed(0)
    result: dict = {
        "config": "Llama-3-8B shape, random weights, bf16",
        "context": CONTEXT,
        "decode_steps": DECODE_STEPS,
        "copy_bytes_per_s": copy_bandwidth(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        d = dummy_model(Path(tmp) / "m8b", LLAMA3_8B)
        try:
            result["ours"] = ours(d, gen)
            gc.collect()  # free the engine before transformers loads
            torch.cuda.empty_cache()
            for r in result["ours"]:
                r["roofline"] = r["bytes_per_step"] / r["step_s"] / result["copy_bytes_per_s"]
        except Exception as e:
            result["ours_error"] = error_fields(e)["error"]
    try:
        result["transformers"] = transformers_generate(gen)
    except Exception as e:
        result["transformers_error"] = error_fields(e)["error"]
    return result


if __name__ == "__main__":
    sys.exit(main(measure))
