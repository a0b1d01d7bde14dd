"""Weight-only quantized linear layers: `QuantLinear` keeps a [out, in] weight as 4-bit or 8-bit
integers in groups of 32 along `in`, each group with a float32 scale (and a float32 zero for 4-bit):
w = q * scale + zero. Its torch twin is `dequantize()` then F.linear, which runs on every device;
on CPU float32 the C++ kernel (`kernels.cpu_quant`) multiplies without rebuilding the weight, on
CUDA the CuPy kernels (`kernels.quant_cuda`: a GEMV rebuilding the weight in registers for few
rows, a one-pass de-quantize kernel before torch's GEMM for more). `kernels.dispatch.linear` picks.

GGUF's block formats map onto it exactly (`from_gguf`), so a GGUF file is served with its weights
kept quantized in memory:

| GGUF | block | here |
|---|---|---|
| Q4_0 | 32 x 4-bit q, fp16 d; w = d (q - 8) | 4-bit, scale d, zero -8d |
| Q4_1 | 32 x 4-bit q, fp16 d, m; w = d q + m | 4-bit, scale d, zero m |
| Q4_K | 8 x 32; fp16 d, dmin; 6-bit sc, m per 32; w = d sc q - dmin m | 4-bit, scale d sc, zero -dmin m |
| Q8_0 | 32 x int8 q, fp16 d; w = d q | 8-bit, scale d, no zero |

Lossless: the scales and zeros are the file's own values in float32 (fp16 values, or a product of
an fp16 value and a 6-bit integer: exact in float32), and q * scale is exact (at most 11 + 6 + 8
significant bits), so `dequantize()` equals gguf-py's (and transformers') de-quantized float32
weights bit for bit (tests/runtime/models/test_quantized.py). The price of float32 scales over
fp16: 0.25 bytes per weight for 4-bit (0.75 B/weight in all, against 0.5625 in the file; Q8_0 1.125
against 1.0625).

`linear_int8_act` is the twin of the CPU kernel's other path, for prefill chunks where the CPU has
AVX-512 VNNI: the activations rounded to int8 per group of 32, one integer dot product per group.

torch's own `_weight_int4pack_mm_for_cpu` takes float32 activations only on a scalar path (15-60x
slower than oneDNN's float32 GEMM here) and its fast path wants bfloat16 activations and scales
(lossy); `_weight_int8pack_mm` has one scale per row, not per 32: hence our kernel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("modeldeploy.kernels")

GROUP = 32
# GGUF quantization types kept quantized (everything else is de-quantized by the loader, with a log line).
GGUF_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q8_0")
_BLOCK_BYTES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144), "Q8_0": (32, 34)}


@dataclass(frozen=True)
class QuantLinear:
    """A [out_features, in_features] weight, group-wise quantized (see the module docstring).

    qweight: uint8 [N, K/2] for 4-bit (per group of 32, byte j holds q[j] in its low nibble and
    q[j+16] in its high one, q in 0..15: GGUF's Q4_0/Q4_1 layout), int8 [N, K] for 8-bit.
    scales, zeros: float32 [N, K/32] (zeros None for 8-bit, which is symmetric).
    fmt: the format it came from ("Q4_1", ...), reported in /v1/bundle."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    fmt: str

    @property
    def bits(self) -> int:
        return 8 if self.zeros is None else 4

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.scales.shape[1] * GROUP

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        parts = (self.qweight, self.scales) if self.zeros is None else (self.qweight, self.scales, self.zeros)
        return sum(t.numel() * t.element_size() for t in parts)

    def to(self, device: torch.device | str) -> QuantLinear:
        z = None if self.zeros is None else self.zeros.to(device)
        return QuantLinear(self.qweight.to(device), self.scales.to(device), z, self.fmt)

    def take_rows(self, index: torch.Tensor) -> QuantLinear:
        """The rows `index` (a permutation or a selection), still quantized."""
        z = None if self.zeros is None else self.zeros[index]
        return QuantLinear(self.qweight[index], self.scales[index], z, self.fmt)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows `ids` de-quantized: the embedding lookup [T] -> [T, in_features]."""
        return _dequant(self.take_rows(ids), dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The torch twin: the whole weight as `dtype` [N, K] (built in float32, then cast)."""
        return _dequant(self, dtype)


def _dequant(w: QuantLinear, dtype: torch.dtype) -> torch.Tensor:
    n, g = w.scales.shape
    if w.zeros is None:
        q = w.qweight.reshape(n, g, GROUP).float()
        out = q * w.scales[..., None]
    else:
        b = w.qweight.reshape(n, g, GROUP // 2)
        q = torch.cat([b & 15, b >> 4], dim=-1).float()
        out = q * w.scales[..., None] + w.zeros[..., None]
    return out.reshape(n, g * GROUP).to(dtype)


def linear(x: torch.Tensor, w: QuantLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The twin: x [T, K] @ dequantize(w).T (+ bias), on any device and dtype."""
    if x.shape[-1] != w.in_features:
        raise ValueError(f"linear: input has {x.shape[-1]} features, the weight takes {w.in_features}")
    return F.linear(x, w.dequantize(x.dtype), bias)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] float32 -> (ia int [T, K/32, 32] in -127..127, scale float32 [T, K/32]): per row and
    group of 32 inputs, ia = round(x * 127 / amax) and scale = amax / 127 (a group of zeros: 0 and 0).
    Round half to even, as the C++ kernel's conversion."""
    g = x.float().reshape(x.shape[0], -1, GROUP)
    amax = g.abs().amax(dim=-1)
    # a true float32 division, as the kernel's (`127.0 / tensor` is 127 * reciprocal, which can
    # differ in the last bit and flip a value that lands on .5)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    return torch.round(g * inv[..., None]), amax / 127.0


def linear_int8_act(x: torch.Tensor, w: QuantLinear) -> torch.Tensor:
    """The twin of the C++ kernel's long-chunk path (`cpu_quant.linear` beyond FUSED_MAX_ROWS rows
    where the CPU has AVX-512 VNNI): x [T, K] float32 @ w.T with the activations quantized to int8 per
    group of 32 (`quantize_activations`), in float64. Per group, sum_k w_k x_k becomes
    scale_w * scale_x * sum_k q_k ia_k, plus zero * sum_k x_k on the float activations (4-bit, with q
    centred on 0 and the zero moved by 8 scales, as the kernel packs it)."""
    ia, sx = quantize_activations(x)
    n, g = w.scales.shape
    if w.zeros is None:
        q = w.qweight.reshape(n, g, GROUP).double()
    else:  # centred: s q + z = s (q - 8) + (z + 8 s), so the int8 part carries only s (q - 8)
        b = w.qweight.reshape(n, g, GROUP // 2)
        q = torch.cat([b & 15, b >> 4], dim=-1).double() - 8
    dots = torch.einsum("tgk,ngk->tng", ia.double(), q)  # exact: integers well under 2**53
    out = (dots * w.scales.double()[None] * sx.double()[:, None, :]).sum(-1)
    if w.zeros is not None:
        xsum = x.double().reshape(x.shape[0], g, GROUP).sum(-1)
        out += xsum @ (w.zeros.double() + 8 * w.scales.double()).T
    return out.float()


def nbytes(w: torch.Tensor | QuantLinear) -> int:
    """Resident bytes of a weight, quantized or not."""
    if isinstance(w, QuantLinear):
        return w.nbytes
    return w.numel() * w.element_size()


def cat_rows(parts: list[torch.Tensor | QuantLinear], what: str = "") -> torch.Tensor | QuantLinear:
    """Weights stacked along out_features (the fused q/k/v and gate/up GEMMs): still quantized
    when every part has the same bit width, else all de-quantized to the float parts' dtype (a
    file mixing e.g. Q4_K and Q6_K in one group), which a log line says."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)  # type: ignore[arg-type]
    quant = [p for p in parts if isinstance(p, QuantLinear)]
    if len(quant) == len(parts) and len({p.bits for p in quant}) == 1:
        fmts = sorted({p.fmt for p in quant})
        z = None if quant[0].zeros is None else torch.cat([p.zeros for p in quant])  # type: ignore[misc]
        return QuantLinear(
            torch.cat([p.qweight for p in quant]), torch.cat([p.scales for p in quant]), z, "+".join(fmts)
        )
    floats = [p for p in parts if isinstance(p, torch.Tensor)]
    dtype = floats[0].dtype if floats else torch.float32
    log.warning(
        "quantized weights %s: formats %s cannot share one GEMM; de-quantized to %s",
        what,
        [p.fmt if isinstance(p, QuantLinear) else str(p.dtype) for p in parts],
        dtype,
    )
    return torch.cat([p.dequantize(dtype) if isinstance(p, QuantLinear) else p for p in parts])


def from_gguf(fmt: str, data: np.ndarray, in_features: int) -> QuantLinear:
    """A QuantLinear from a GGUF tensor's raw blocks: `data` uint8 [N, row bytes] (GGUFReader's
    `tensor.data` for a 2-D quantized tensor), `fmt` one of GGUF_TYPES."""
    if fmt not in _BLOCK_BYTES:
        raise ValueError(f"GGUF type {fmt} is not kept quantized (supported: {', '.join(GGUF_TYPES)})")
    block, size = _BLOCK_BYTES[fmt]
    if in_features % block:
        raise ValueError(f"{fmt}: {in_features} input features are not a multiple of its block of {block}")
    n = data.shape[0]
    b = np.ascontiguousarray(data, dtype=np.uint8).reshape(n, in_features // block, size)

    def f16(lo: int) -> np.ndarray:  # the fp16 field at bytes lo..lo+2 of each block, as float32
        return b[..., lo : lo + 2].copy().view(np.float16)[..., 0].astype(np.float32)

    if fmt == "Q8_0":
        q = b[..., 2:].copy().view(np.int8).reshape(n, in_features)
        return _make(q, f16(0), None, fmt)
    if fmt == "Q4_0":
        d = f16(0)
        return _make(b[..., 2:].reshape(n, in_features // 2), d, -8.0 * d, fmt)
    if fmt == "Q4_1":
        return _make(b[..., 4:].reshape(n, in_features // 2), f16(0), f16(2), fmt)
    # Q4_K: 8 sub-blocks of 32 per super-block; qs is 4 chunks of 32 bytes, chunk c holding
    # sub-block 2c in its low nibbles and 2c+1 in its high ones, element j at byte j.
    sc, mn = _q4k_scale_min(b[..., 4:16])  # [n, S, 8] each
    scale = f16(0)[..., None] * sc  # exact in float32: an fp16 value times a 6-bit integer
    zero = -(f16(2)[..., None] * mn)
    qs = b[..., 16:].reshape(n, -1, 4, 32)
    lo, hi = qs & 15, qs >> 4  # [n, S, 4, 32]: sub-blocks 2c and 2c+1
    sub = np.stack([lo, hi], axis=3).reshape(n, -1, 8, 32)  # [n, S, 8 sub-blocks, 32 values]
    packed = sub[..., :16] | (sub[..., 16:] << 4)  # our layout: byte j = q[j] | q[j+16] << 4
    s = in_features // GROUP
    return _make(packed.reshape(n, in_features // 2), scale.reshape(n, s), zero.reshape(n, s), fmt)


def _q4k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of packed 6-bit scales and mins -> two [.., 8] float32 arrays (llama.cpp's
    get_scale_min_k4, as gguf-py unpacks it)."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _make(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, fmt: str) -> QuantLinear:
    n = q.shape[0]

    def f32(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).reshape(n, -1))

    z = None if zero is None else f32(zero)
    return QuantLinear(torch.from_numpy(np.ascontiguousarray(q)), f32(scale), z, fmt)
