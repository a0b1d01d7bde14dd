"""LoRA on CPU: engine step time of a mixed batch (3 adapters + base) vs a base-only batch,
and the memory each resident adapter takes.

Same random-weight model (hidden 384, 6 layers, like bench/engine_cpu.py), 3 PEFT adapters
(rank 16, all seven projections, made with `peft`), batch 32: 8 base rows + 8 per adapter,
against 32 base rows. Each round prefills the batch (one step: 32 x 64 prompt tokens) and
then times `--decode-steps` decode steps (32 rows each); rounds alternate mixed / base so
machine noise hits both alike. Reported: medians per step and their ratio.

    .venv/bin/python bench/lora_cpu.py --rounds 5 --threads 1 --out bench/results/lora_cpu_t1.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

BATCH, PROMPT, RANK = 32, 64, 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(base: Path, root: Path, n: int) -> list[dict]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    pins = []
    for i in range(n):
        torch.manual_seed(100 + i)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        cfg = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS, init_lora_weights=False)
        out = root / f"adapter-{i}"
        get_peft_model(model, cfg).save_pretrained(out)
        pins.append({"name": f"adapter-{i}", "path": str(out)})
    return pins


def timed_round(engine, adapters: list[str | None], decode_steps: int, tag: str) -> dict:
    from modeldeploy.runtime import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=decode_steps + 1, ignore_eos=True)
    for i, name in enumerate(adapters):
        prompt = [(7 * i + j) % 400 + 5 for j in range(PROMPT)]
        engine.add_request(f"{tag}-{i}", prompt, params, adapter=name)
    t = time.perf_counter()
    engine.step()  # the whole batch's prefill in one step
    prefill = time.perf_counter() - t
    steps = []
    while engine.has_work():
        t = time.perf_counter()
        outs = engine.step()
        steps.append(time.perf_counter() - t)
        assert len(outs) == BATCH, "every row decodes every step"
    return {"prefill_s": prefill, "decode_step_s": statistics.median(steps), "decode_steps": len(steps)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode-steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    from modeldeploy.runtime import LLM
    from modeldeploy.runtime.models.llama import ModelArgs
    from modeldeploy.runtime.models.lora import SITES, LoraSlots
    from modeldeploy.runtime.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        base = make_tiny_model(
            Path(tmp) / "base", "llama", 0, hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2
        )
        pins = make_adapters(base, Path(tmp), 3)
        llm = LLM(
            base,
            dtype="float32",
            device="cpu",
            max_num_seqs=BATCH,
            max_num_batched_tokens=BATCH * PROMPT,
            max_model_len=256,
            enable_prefix_caching=False,
            adapters=pins,
            max_loras=3,
        )
        engine = llm.engine
        names = [p["name"] for p in pins]
        mixed_rows = [None, *names] * (BATCH // 4)
        timed_round(engine, mixed_rows, 4, "warm-mixed")
        timed_round(engine, [None] * BATCH, 4, "warm-base")
        mixed, base_only = [], []
        for r in range(a.rounds):
            mixed.append(timed_round(engine, mixed_rows, a.decode_steps, f"m{r}"))
            base_only.append(timed_round(engine, [None] * BATCH, a.decode_steps, f"b{r}"))
        info = engine.info()["lora"]

    def med(rows, key):
        return statistics.median(x[key] for x in rows)

    # The same per-slot arithmetic for Llama-3-8B shapes (bf16, rank 16, all seven targets).
    l8b = ModelArgs(
        "LlamaForCausalLM", 128256, 4096, 14336, 32, 32, 8, 128, 1e-5, 8192, False, False, False, {}
    )
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "git_rev": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "torch_threads": torch.get_num_threads(),
        "model": "llama hidden 384, 6 layers, 6/2 heads, float32, CPU",
        "batch": BATCH,
        "prompt_tokens": PROMPT,
        "adapters": {"count": 3, "rank": RANK, "targets": TARGETS},
        "rounds": a.rounds,
        "mixed": {"decode_step_s": med(mixed, "decode_step_s"), "prefill_s": med(mixed, "prefill_s")},
        "base_only": {
            "decode_step_s": med(base_only, "decode_step_s"),
            "prefill_s": med(base_only, "prefill_s"),
        },
        "per_round": {"mixed": mixed, "base_only": base_only},
        "memory": {
            "slot_bytes": info["slot_bytes"],
            "host_bytes_per_adapter": info["host_bytes"] // 3,
            "device_bytes_3_slots": info["device_bytes"],
            "llama3_8b_bf16_r16_all_targets_slot_bytes": LoraSlots.slot_bytes(
                l8b, RANK, tuple(SITES), torch.bfloat16
            ),
        },
    }
    result["ratio_decode"] = result["mixed"]["decode_step_s"] / result["base_only"]["decode_step_s"]
    result["ratio_prefill"] = result["mixed"]["prefill_s"] / result["base_only"]["prefill_s"]
    print(json.dumps({k: v for k, v in result.items() if k != "per_round"}, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
