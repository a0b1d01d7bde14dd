"""CUDA graph decode (--cuda-graphs) against eager: the pure-decode step time at batch 1/8/32 of a
1024-hidden, 8-layer bf16 llama (random weights), context 256.

    python3 bench/gpu/graphs.py OUT.json
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

from modeldeploy_dev.gpu_bench import main


def measure() -> dict:
    import torch

    from modeldeploy.runtime import LLM, SamplingParams
    from modeldeploy.runtime.tiny_model import make_tiny_model

    gen = torch.Generator().manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        big = make_tiny_model(
            Path(tmp) / "big", "llama", seed=0, hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4
        )
        for graphs in (False, True):
            llm = LLM(
                big,
                dtype="bfloat16",
                device="cuda",
                max_num_seqs=32,
                cuda_graphs=graphs,
                enable_prefix_caching=False,
                max_model_len=512,
            )
            eng = llm.engine
            for b in (1, 8, 32):
                params = SamplingParams(temperature=0, max_tokens=33, ignore_eos=True)
                for j in range(b):
                    prompt = torch.randint(10, 500, (256,), generator=gen).tolist()
                    eng.add_request(f"g{graphs}-{b}-{j}", prompt, params)
                spent, steps = 0.0, 0
                while eng.has_work():
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    outs = eng.step()
                    torch.cuda.synchronize()
                    if len(outs) == b and all(len(o.token_ids) >= 2 for o in outs):  # a pure decode step
                        spent, steps = spent + time.perf_counter() - t0, steps + 1
                rows.append({"graphs": graphs, "batch": b, "step_ms": 1000 * spent / max(1, steps)})
            del llm, eng
            gc.collect()
            torch.cuda.empty_cache()
    eager = {r["batch"]: r["step_ms"] for r in rows if not r["graphs"]}
    for r in rows:
        r["speedup"] = eager[r["batch"]] / r["step_ms"] if r["graphs"] else 1.0
    return {"rows": rows}


if __name__ == "__main__":
    sys.exit(main(measure))
