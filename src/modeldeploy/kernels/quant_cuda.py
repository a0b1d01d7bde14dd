"""Weight-only int4/int8 linear layers on CUDA (cuda/quant.cu) over `QuantLinear`'s layout as it is.
Twin: `quant.linear` (de-quantize the whole weight, then torch's GEMM).

- Up to `GEMV_MAX_ROWS` rows (decode steps, short chunks): `quant_gemv_kernel` reads the packed
  weight once per 8 rows (0.75 B per 4-bit weight, 1.125 per 8-bit one, float32 scales and zeros included)
  and rebuilds it in registers, float32 accumulation: no float weight is ever materialized.
- More rows (prefill): `quant_dequant_kernel` rebuilds the weight as x's dtype in one pass (equal to
  `QuantLinear.dequantize(dtype)` bit for bit), then torch's GEMM on tensor cores; the GEMV runs on
  CUDA cores and its arithmetic (one FMA per weight per row) overtakes the weight bytes it saves
  somewhere between 8 and 32 rows at 8B shapes. `GEMV_MAX_ROWS = 16` is that estimate, not a
  measurement: `bench/gpu/quant.py` times both paths at batch 1/8/16/32 so the first lent GPU sets it.
- Anything else (another dtype, misaligned or non-contiguous packed weight, mismatched devices)
  goes to the twin.

Verified only through the CPU emulation of the exact .cu text (tests/kernels/test_kernels_quant_emulated.py)
and the NVRTC compile for sm_90 (tests/kernels/test_kernels_nvrtc.py); no GPU has run it yet, so its speed
is unmeasured (see kernels/NOTES.md).
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F

from modeldeploy.kernels import build, quant
from modeldeploy.kernels.launch import aligned, dtype_name, i32, i64, launch, ptr
from modeldeploy.kernels.quant import QuantLinear

WARPS = 8  # GEMV: most warps per block (each owns build.QUANT_COLS output columns); see `warps_for`
MIN_WARPS = 2
DEQUANT_THREADS = 256
GEMV_MAX_ROWS = 16  # more rows: de-quantize kernel + torch GEMM (see the module docstring)


def path_in_use() -> str:
    """For /v1/bundle: what a CUDA QuantLinear call runs."""
    return (
        f"cuda (fused int4/int8 GEMV up to {GEMV_MAX_ROWS} rows; de-quantize kernel + torch GEMM above; "
        "the twin for other dtypes or layouts)"
    )


def supports(x: torch.Tensor, w: QuantLinear) -> bool:
    """Whether the kernels take this call: x float32/float16/bfloat16 on w's device, and w's tensors
    as `QuantLinear` lays them out (contiguous, float32 scales and zeros, 16-byte aligned packing)."""
    parts = (w.qweight, w.scales) if w.zeros is None else (w.qweight, w.scales, w.zeros)
    return (
        dtype_name(x) in build.CTYPES
        and x.device == w.device
        and w.qweight.dtype == (torch.int8 if w.bits == 8 else torch.uint8)
        and w.scales.dtype == torch.float32
        and (w.zeros is None or w.zeros.dtype == torch.float32)
        and all(t.is_contiguous() and t.device == w.device for t in parts)
        and w.qweight.shape == (w.out_features, w.in_features * w.bits // 8)
        and aligned(w.qweight)
    )


def linear(x: torch.Tensor, w: QuantLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ w.T (+ bias) -> [..., N] in x's dtype."""
    if x.shape[-1] != w.in_features:
        raise ValueError(f"linear: input has {x.shape[-1]} features, the weight takes {w.in_features}")
    if not supports(x, w) or (bias is not None and (bias.dtype != x.dtype or bias.device != x.device)):
        return quant.linear(x, w, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features)
    if x2.shape[0] > GEMV_MAX_ROWS:
        return F.linear(x, dequantize(w, x.dtype), bias)
    return gemv(x2, w, bias).reshape(*lead, w.out_features)


def _rows_tile(m: int) -> int:
    """The smallest ROWS instantiation holding m rows (the largest one if none does: several blocks)."""
    return next((r for r in build.QUANT_ROWS if r >= m), build.QUANT_ROWS[-1])


@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def warps_for(n: int, row_tiles: int, sm_count: int) -> int:
    """Warps per GEMV block: WARPS (8: x staged once per 32 columns) unless that leaves fewer than two
    blocks per SM, then halved down to MIN_WARPS (an 8B layer's N = 4096 at one row tile is 128
    blocks of 32 columns for 132 SMs; 512 blocks of 8 at 2 warps). The x chunk each block stages is the
    same size whatever its warps, so fewer warps cost more L2 reads of x, never correctness."""
    warps = WARPS
    while warps > MIN_WARPS and -(-n // (warps * build.QUANT_COLS)) * row_tiles < 2 * sm_count:
        warps //= 2
    return warps


def gemv(x: torch.Tensor, w: QuantLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w.T (+ bias) through `quant_gemv_kernel`, any M (callers check `supports`)."""
    dt = dtype_name(x)
    m, n, k = x.shape[0], w.out_features, w.in_features
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    itemsize = build.ITEMSIZE[dt]
    if x.stride(-1) != 1 or not aligned(x) or (x.stride(0) * itemsize) % 16:
        x = x.clone(memory_format=torch.contiguous_format)  # fresh storage: aligned, dense rows
    if bias is not None:
        bias = bias.contiguous()
    rows = _rows_tile(m)
    tiles = -(-m // rows)
    warps = warps_for(n, tiles, _sm_count(x.device))
    cols = warps * build.QUANT_COLS
    launch(
        "quant",
        build.quant_gemv_name(dt, w.bits, rows),
        x.device,
        grid=(-(-n // cols), tiles),
        block=(32 * warps,),
        args=(
            ptr(out),
            i64(out.stride(0)),
            ptr(x),
            i64(x.stride(0)),
            ptr(w.qweight),
            ptr(w.scales),
            ptr(w.zeros),
            ptr(bias),
            i32(m),
            i32(n),
            i32(k),
        ),
    )
    return out


def dequantize(w: QuantLinear, dtype: torch.dtype) -> torch.Tensor:
    """The weight as `dtype` [N, K] through `quant_dequant_kernel` (equal to `w.dequantize(dtype)`)."""
    n, k = w.out_features, w.in_features
    out = torch.empty(n, k, dtype=dtype, device=w.device)
    items = n * (k // quant.GROUP)
    if items == 0:
        return out
    launch(
        "quant",
        build.quant_dequant_name(dtype_name(out), w.bits),
        w.device,
        grid=(-(-items // DEQUANT_THREADS),),
        block=(DEQUANT_THREADS,),
        args=(ptr(out), ptr(w.qweight), ptr(w.scales), ptr(w.zeros), i32(n), i32(k)),
    )
    return out
