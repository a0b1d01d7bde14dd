"""Linear layers on CPU: through oneDNN with each weight packed once at load, or torch's BLAS on
plain weights, chosen per CPU.

`F.linear` on CPU goes to torch's BLAS (MKL in the x86 wheels). On the AMD EPYC (Zen 5) machines
this project runs on, MKL reached 142-240 GFLOP/s for the engine's shapes at 16-2048 rows on 2
threads, while oneDNN's matmul on a weight reordered once into its blocked layout reached 245-560
GFLOP/s for the same float32 products: 1.7-2.7x (bench/gemm_cpu.py, bench/results/engine_cpu.md).
At a single row the smallest shapes are a few microseconds slower; larger ones are faster there too.
The GEMMs are most of a CPU step, and vLLM's CPU backend makes the same choice. Float32 stays
float32: oneDNN's fp32 math mode is strict here (no bf16 or tf32 down-conversion), so only the
summation order differs from MKL's (checked against float64 in tests/kernels/test_kernels_reference.py).

Which path is chosen per CPU vendor, because the two machines this project has measured on
disagree. On an Intel Xeon with AVX-512, MKL is Intel's own library on Intel's own CPU: the same
products ran within 5 % of oneDNN's at 64-2048 rows (oneDNN 1.17x ahead at 32), while a plain
weight lets decode steps stream through the C++ GEMV kernel (`cpu_quant.linear_float`, 1.06-1.4x
oneDNN's packed weights at 1-16 rows): served against llama.cpp there, plain weights met the serving goal's
ITL goal and 1.5x its capacity where packed ones gave 1.00x and a 15 % slower ITL
(bench/results/serving_real_cpu.md). So MODELDEPLOY_CPU_GEMM unset (or "auto") means plain weights
on GenuineIntel and oneDNN-packed ones elsewhere; "1" packs on every CPU, "0" never packs.

`pack(weight)` returns a `PackedLinear` on a CPU float32 weight when that path is chosen, else the
weight unchanged; `linear(x, w, bias)` runs either. The packed weight is an opaque oneDNN tensor:
the model keeps only it, not the original.

Row counts are bucketed (`padded_rows`). oneDNN builds, JIT-compiles and caches a primitive per
distinct input shape, and a serving engine meets nearly every row count from 1 to the step budget
(prefill chunks end anywhere). Measured on the real model (bench/heap_cpu.py, bench/results/soak.md):
the engine's live native memory grew ~10 MB per 100 varied steps with no end in 1,500 steps (the
30-minute soak: +378 MiB RSS), and was flat with torch's BLAS path. Above 32 rows (the decode
batches, kept exact) a product runs at the row count rounded up to 16 buckets per power of two:
at most 1/16 extra rows (zeros, sliced off), a bounded set of shapes, primitives built once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from modeldeploy.kernels import cpu_build

log = logging.getLogger("modeldeploy.kernels")

ENV_SWITCH = "MODELDEPLOY_CPU_GEMM"  # "1" oneDNN-packed, "0" torch's F.linear (BLAS), "auto" per CPU
CHOICES = ("auto", "1", "0")

_state: str | None = None  # "onednn" | "blas (...why...)", decided once per process


def cpu_vendor() -> str:
    """The x86 vendor string of this CPU ("GenuineIntel", "AuthenticAMD"), "" where unknown."""
    return cpu_build.cpuinfo_line("vendor_id").partition(":")[2].strip()


def onednn_missing() -> str:
    """Why this torch cannot run packed oneDNN linears, "" where it can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "torch.ops.mkldnn._linear_pointwise missing in this torch"
    return ""


def path_in_use() -> str:
    """ "onednn" where CPU float32 linears are packed for oneDNN, else "blas" and why not."""
    global _state
    if _state is None:
        choice = os.environ.get(ENV_SWITCH, "auto").strip() or "auto"
        if choice not in CHOICES:
            raise ValueError(f"{ENV_SWITCH}={choice!r}: expected one of {', '.join(CHOICES)}")
        vendor = cpu_vendor() if choice == "auto" else ""
        if choice == "0":
            _state = f"blas ({ENV_SWITCH}=0)"
        elif vendor == "GenuineIntel":
            _state = f"blas ({ENV_SWITCH}=auto on {vendor}: plain weights)"
        elif why := onednn_missing():
            _state = f"blas ({why})"
        else:
            _state = "onednn"
        log.info("CPU linear layers: %s", _state)
    return _state


@dataclass(frozen=True)
class PackedLinear:
    """A [out, in] weight in oneDNN's blocked layout (torch._mkldnn tensor)."""

    packed: torch.Tensor
    out_features: int
    in_features: int


def pack(weight: torch.Tensor) -> PackedLinear | torch.Tensor:
    """The weight packed for oneDNN where that path is on for it (CPU, float32, 2-D), else itself."""
    if (
        weight.device.type != "cpu"
        or weight.dtype != torch.float32
        or weight.dim() != 2
        or path_in_use() != "onednn"
    ):
        return weight
    # batch_size None: one packing serves every number of rows (decode 1..N, prefill chunks)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
    return PackedLinear(packed, weight.shape[0], weight.shape[1])


EXACT_ROWS = 32  # up to here (decode batches) every row count is its own shape


def padded_rows(rows: int) -> int:
    """The row count a packed product runs at: `rows` up to EXACT_ROWS, else rounded up to a
    multiple of 2^(bits - 5), i.e. one of 16 buckets per power of two (at most 1/16 more rows)."""
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << (rows.bit_length() - 5)
    return -(-rows // step) * step


def linear(x: torch.Tensor, w: PackedLinear | torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ w.T (+ bias) -> [T, out], through oneDNN when w was packed (T bucketed)."""
    if isinstance(w, PackedLinear):
        if x.shape[-1] != w.in_features:
            raise ValueError(f"linear: input has {x.shape[-1]} features, the weight takes {w.in_features}")
        rows = x.shape[0]
        padded = padded_rows(rows) if x.dim() == 2 else rows
        if padded != rows:
            xp = x.new_empty((padded, x.shape[1]))
            xp[:rows] = x
            xp[rows:] = 0
            return torch.ops.mkldnn._linear_pointwise(xp, w.packed, bias, "none", [], "")[:rows]
        return torch.ops.mkldnn._linear_pointwise(x, w.packed, bias, "none", [], "")
    return F.linear(x, w, bias)
