"""Each CuPy kernel at 8B shapes (bf16): bytes moved per second against the copy roofline, and
its time against its torch twin's. Paged attention also at attention.UNROLL = 8.

    python3 bench/gpu/kernels.py OUT.json
"""

from __future__ import annotations

import sys

from modeldeploy_dev.gpu_bench import copy_bandwidth, main, time_cuda


def measure() -> dict:
    import torch

    from modeldeploy.kernels import attention
    from modeldeploy_dev import kernel_checks as checks

    bw = copy_bandwidth()
    rows = []
    variants = []  # (problem, attention.UNROLL)
    for p in checks.bench_problems():
        variants.append((p, 4))
        if p.kernel.startswith("paged_attention"):
            variants.append((p, 8))  # the UNROLL=8 instantiation, for comparison
    for p, unroll in variants:
        attention.UNROLL = unroll
        label = p.label + (f" u{unroll}" if p.kernel.startswith("paged_attention") else "")
        row = {"kernel": p.kernel, "label": label, "dtype": str(p.dtype)[6:]}
        try:
            d = p.setup(0)
            row["bytes"] = p.nbytes(d)
            row["kernel_s"] = time_cuda(lambda d=d, p=p: p.cuda(d, False))
            row["twin_s"] = time_cuda(lambda d=d, p=p: p.twin(d, False), warmup=1, reps=5)
            row["bytes_per_s"] = row["bytes"] / row["kernel_s"]
            row["roofline"] = row["bytes_per_s"] / bw
            row["speedup_vs_twin"] = row["twin_s"] / row["kernel_s"]
            del d
            torch.cuda.empty_cache()
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        rows.append(row)
    attention.UNROLL = 4
    return {"copy_bytes_per_s": bw, "rows": rows}


if __name__ == "__main__":
    sys.exit(main(measure))
