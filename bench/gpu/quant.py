"""The CUDA weight-only int4/int8 GEMM (kernels/quant_cuda.py) at Llama-3-8B layer shapes, bf16
activations, batch 1/8/16/32: microseconds and share of the copy roofline for
- gemv: `quant_gemv_kernel` (forced at every batch, to find where it stops paying),
- dequant+gemm: `quant_dequant_kernel` to bf16, then torch's GEMM (the path above GEMV_MAX_ROWS),
- twin: `quant.linear` (torch de-quantize in float32, cast, GEMM: the CUDA path before the kernels),
- dense: F.linear on a bf16 weight of the same shape (what an unquantized model does).
Roofline bytes: the weight as stored (4-bit 0.75 B/weight with float32 scales and zeros, 8-bit 1.125;
bf16 2) plus x and out, over the device's copy bandwidth; the de-quantize paths move more than that,
which is the point of the comparison. Weights are random bytes in QuantLinear's layout (the kernel's
speed does not depend on the values).

    python3 bench/gpu/quant.py OUT.json
"""

from __future__ import annotations

import sys

from modeldeploy_dev.gpu_bench import LLAMA3_8B, copy_bandwidth, main, time_cuda

BATCHES = (1, 8, 16, 32)
FORMATS = {"Q4_0": 4, "Q8_0": 8}  # Q4_1 and Q4_K run the same 4-bit kernel (one layout)


def layer_shapes() -> dict[str, tuple[int, int]]:
    """name -> (N, K) of the fused GEMMs of one 8B layer."""
    h, i = LLAMA3_8B["hidden_size"], LLAMA3_8B["intermediate_size"]
    kv = LLAMA3_8B["num_key_value_heads"] * h // LLAMA3_8B["num_attention_heads"]
    return {"qkv": (h + 2 * kv, h), "o": (h, h), "gate_up": (2 * i, h), "down": (h, i)}


def random_weight(bits: int, n: int, k: int, seed: int):
    import torch

    from modeldeploy.kernels.quant import GROUP, QuantLinear

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.uint8 if bits == 4 else torch.int8
    lo, hi = (0, 256) if bits == 4 else (-128, 128)
    q = torch.randint(lo, hi, (n, k * bits // 8), generator=g, device="cuda", dtype=torch.int16).to(dt)
    scales = torch.rand(n, k // GROUP, generator=g, device="cuda") * 1e-3 + 1e-4
    zeros = -8 * scales if bits == 4 else None
    return QuantLinear(q, scales, zeros, "Q4_0" if bits == 4 else "Q8_0")


def crossover(rows: list[dict]) -> dict[str, int | None]:
    """Per "fmt layer": the smallest batch where de-quantize + GEMM beats the GEMV (None: never here)."""
    out: dict[str, int | None] = {}
    for r in rows:
        key = f"{r['fmt']} {r['layer']}"
        out.setdefault(key, None)
        if out[key] is None and r.get("gemv_vs_dequant_gemm", 2.0) < 1:
            out[key] = r["batch"]
    return out


def measure() -> dict:
    import torch
    import torch.nn.functional as F

    from modeldeploy.kernels import quant, quant_cuda

    bw = copy_bandwidth()
    rows = []
    for fmt, bits in FORMATS.items():
        for layer, (n, k) in layer_shapes().items():
            w = random_weight(bits, n, k, seed=n + k)
            dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            for batch in BATCHES:
                x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
                io = 2 * batch * (k + n)
                row = {"fmt": fmt, "layer": layer, "n": n, "k": k, "batch": batch}
                row["path"] = "gemv" if batch <= quant_cuda.GEMV_MAX_ROWS else "dequant+gemm"
                row["warps"] = quant_cuda.warps_for(n, -(-batch // 8), quant_cuda._sm_count(x.device))
                try:
                    timed = {
                        "gemv": lambda x=x, w=w: quant_cuda.gemv(x, w),
                        "dequant_gemm": lambda x=x, w=w: F.linear(x, quant_cuda.dequantize(w, x.dtype)),
                        "twin": lambda x=x, w=w: quant.linear(x, w),
                        "dense": lambda x=x, d=dense: F.linear(x, d),
                    }
                    for name, fn in timed.items():
                        row[f"{name}_us"] = time_cuda(fn, warmup=3, reps=20 if name != "twin" else 5) * 1e6
                    row["gemv_roofline"] = (w.nbytes + io) / (row["gemv_us"] * 1e-6) / bw
                    row["dense_roofline"] = (dense.numel() * 2 + io) / (row["dense_us"] * 1e-6) / bw
                    row["gemv_vs_twin"] = row["twin_us"] / row["gemv_us"]
                    row["gemv_vs_dense"] = row["dense_us"] / row["gemv_us"]
                    row["gemv_vs_dequant_gemm"] = row["dequant_gemm_us"] / row["gemv_us"]
                except Exception as e:  # recorded per row: the other shapes still report
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                rows.append(row)
            del w, dense
            torch.cuda.empty_cache()
    return {
        "copy_bytes_per_s": bw,
        "gemv_max_rows": quant_cuda.GEMV_MAX_ROWS,
        "activations": "bfloat16",
        "rows": rows,
        "crossover": crossover(rows),
    }


if __name__ == "__main__":
    sys.exit(main(measure))
