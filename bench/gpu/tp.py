"""Tensor parallelism over NCCL: an 8B-shaped bf16 decode step at batch 32 (random weights,
prompt 512), TP=1 against TP=2. Skips, with the reason, when fewer than 2 GPUs are visible.

    python3 bench/gpu/tp.py OUT.json
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

from modeldeploy_dev.gpu_bench import LLAMA3_8B, dummy_model, main


def measure() -> dict:
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        return {"skipped": f"{n} GPU(s) visible: tensor parallelism needs at least 2"}
    from modeldeploy.runtime import LLM, SamplingParams

    result: dict = {"gpus": n}
    with tempfile.TemporaryDirectory() as tmp:
        d = dummy_model(Path(tmp) / "8b", LLAMA3_8B)
        for tp in (1, 2):
            llm = LLM(
                d,
                dtype="bfloat16",
                device="cuda",
                load_format="dummy",
                tensor_parallel_size=tp,
                max_num_seqs=32,
                max_model_len=2048,
                num_kv_blocks=4096,
            )
            eng = llm.engine
            sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
            for i in range(32):
                eng.add_request(f"r{i}", list(range(1, 513)), sp)
            eng.step()  # prefill
            for _ in range(3):
                eng.step()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(16):
                eng.step()
            torch.cuda.synchronize()
            result[f"tp{tp}_decode_step_s"] = (time.perf_counter() - t) / 16
            eng.close()
            del eng, llm
            gc.collect()
            torch.cuda.empty_cache()
    return result


if __name__ == "__main__":
    sys.exit(main(measure))
