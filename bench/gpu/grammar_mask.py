"""Applying xgrammar's token bitmask to CUDA float32 logits (batch 32, vocabulary 128256, 24 rows
constrained): the runtime's apply_bitmask with the bitmask already on the device and with its
host-to-device copy (as in the engine), the sampler's pure-torch twin, and the CPU path.

    python3 bench/gpu/grammar_mask.py OUT.json
"""

from __future__ import annotations

import sys
import time

from modeldeploy_dev.gpu_bench import main, time_cuda
from modeldeploy_dev.grammar_masks import BATCH, VOCAB, grammar_bitmasks


def measure() -> dict:
    import torch

    try:
        import xgrammar  # noqa: F401
    except ImportError as e:
        return {"skipped": f"xgrammar not installed ({e})"}
    from modeldeploy.runtime.engine.sample.sampler import _apply_bitmask as torch_twin
    from modeldeploy.runtime.engine.structured_output.grammar import apply_bitmask

    real, _, compile_s = grammar_bitmasks(VOCAB, BATCH)
    rows = [i for i in range(BATCH) if i % 4]  # every 4th row unconstrained
    logits = torch.randn(BATCH, VOCAB, generator=torch.Generator().manual_seed(1))
    x, bm_dev = logits.to("cuda"), real.to("cuda")
    timing = {
        "vocab": VOCAB,
        "batch": BATCH,
        "constrained_rows": len(rows),
        "compile_s": compile_s,
        "cuda_apply_incl_h2d_ms": time_cuda(lambda: apply_bitmask(x, real, rows)) * 1e3,
        "cuda_apply_ms": time_cuda(lambda: apply_bitmask(x, bm_dev, rows)) * 1e3,
        "cuda_torch_twin_ms": time_cuda(lambda: torch_twin(x, bm_dev, rows)) * 1e3,
    }
    xc, times = logits.clone(), []
    for _ in range(20):
        t = time.perf_counter()
        apply_bitmask(xc, real, rows)
        times.append(time.perf_counter() - t)
    timing["cpu_apply_ms"] = sorted(times)[len(times) // 2] * 1e3
    return timing


if __name__ == "__main__":
    sys.exit(main(measure))
