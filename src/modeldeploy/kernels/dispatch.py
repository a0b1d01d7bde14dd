"""The one door the engine uses for hot ops: CUDA tensors go to the CuPy kernels,
CPU paged attention to the in-place C++ kernel (`kernels.cpu_attention`, built on first use
when a compiler is present), CPU float32 linear layers to oneDNN with packed weights
(`kernels.cpu_gemm`), quantized weights (`kernels.quant.QuantLinear`) on CPU float32 to the C++
group-wise int4/int8 kernel (`kernels.cpu_quant`) and on CUDA to the CuPy int4/int8 kernels
(`kernels.quant_cuda`), everything else to the torch reference twins
(`modeldeploy.kernels.reference`, `quant.linear`).

The engine never imports a kernel module directly, so CPU-only installs never
import cupy, and a GPU build swaps implementations without touching the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from modeldeploy.kernels import cpu_gemm, cpu_quant, quant, reference

# Filled from `modeldeploy.kernels.cuda_ops.KERNELS` when CuPy and a CUDA device are present.
_CUDA: dict[str, Callable[..., Any]] = {}
_cuda_checked = False
# CPU kernels (paged attention reading blocks in place, KV write, rotary, RMSNorm, SiLU-and-mul);
# empty without a compiler.
_CPU: dict[str, Callable[..., Any]] = {}
_CPU_NAMES = (
    "paged_attention_decode",
    "paged_attention_prefill",
    "write_kv",
    "rotary_embedding",
    "rms_norm",
    "silu_and_mul",
)
_cpu_checked = False


def _cpu_impl(name: str):
    global _cpu_checked
    if not _cpu_checked:
        _cpu_checked = True
        from modeldeploy.kernels import cpu_attention

        if cpu_attention.available():  # logs which path is used
            _CPU.update(
                paged_attention_decode=cpu_attention.paged_attention_decode,
                paged_attention_prefill=cpu_attention.paged_attention_prefill,
                write_kv=cpu_attention.write_kv,
                rotary_embedding=cpu_attention.rotary_embedding,
                rms_norm=cpu_attention.rms_norm,
                silu_and_mul=cpu_attention.silu_and_mul,
            )
    return _CPU.get(name)


def describe(device: str) -> dict[str, object]:
    """Which kernels this process runs on `device`, for /v1/bundle: on CPU, the in-place C++
    attention kernel (prebuilt in the image for this CPU's level, or built here) or the torch twins,
    and the linear paths; on CUDA, also what a quantized linear layer runs."""
    if device != "cpu":
        if not device.startswith("cuda"):
            return {"attention": "reference"}
        qpath = "reference (de-quantize, then GEMM: cupy not installed)"
        if _cuda("quant_linear") is not None:
            from modeldeploy.kernels import quant_cuda  # imported already by cuda_ops

            qpath = quant_cuda.path_in_use()
        return {"attention": "cuda", "quantized_linear": qpath}
    from modeldeploy.kernels import cpu_attention

    return {
        "attention": cpu_attention.build(),
        "linear": cpu_gemm.path_in_use(),
        "quantized_linear": cpu_quant.path_in_use(),
        "quantized_long_chunks": cpu_quant.prefill_path(),
        "head": (
            f"{cpu_quant.path_in_use()} up to {cpu_quant.FLOAT_MAX_ROWS} rows of a float32 head"
            if cpu_quant.available()
            else "as linear"
        ),
    }


def _cuda(name: str) -> Callable[..., Any] | None:
    """The CuPy kernel registered as `name`, or None (no CuPy: `cuda_ops` is imported once, on first use)."""
    global _cuda_checked
    if not _cuda_checked:
        _cuda_checked = True
        try:
            from modeldeploy.kernels import cuda_ops
        except ImportError:
            pass
        else:
            _CUDA.update(cuda_ops.KERNELS)
    return _CUDA.get(name)


def _impl(name: str, t: torch.Tensor):
    if t.is_cuda:
        fn = _cuda(name)
        if fn is not None:
            return fn
    elif name in _CPU_NAMES and t.device.type == "cpu":
        fn = _cpu_impl(name)
        if fn is not None:
            return fn
    return getattr(reference, name)


def pack_linear(weight):
    """A [out, in] weight in the form `linear` runs fastest on its device: packed once for oneDNN
    on CPU float32 (`kernels.cpu_gemm`), a QuantLinear as it is, the tensor itself elsewhere.
    The model keeps only this."""
    if isinstance(weight, quant.QuantLinear):
        if weight.device.type == "cpu":
            cpu_quant.prefill_path()  # decided (and a bad MODELDEPLOY_CPU_QUANT_PREFILL refused) at load
        return weight
    return cpu_gemm.pack(weight)


def linear(x, weight, bias=None):
    """x @ weight.T (+ bias) for a weight from `pack_linear` (or a plain tensor)."""
    if isinstance(weight, quant.QuantLinear):
        if cpu_quant.supports(x, weight):
            return cpu_quant.linear(x, weight, bias)
        return _quant_impl(x)(x, weight, bias)
    if isinstance(weight, torch.Tensor) and x.dim() == 2 and cpu_quant.streams_float(x, weight):
        # a plain CPU float32 weight (cpu_gemm's choice on Intel) at decode sizes: the streaming kernel
        out = cpu_quant.linear_float(x, weight)
        return out if bias is None else out.add_(bias)
    return cpu_gemm.linear(x, weight, bias)


def head_linear(x, weight):
    """The LM head's logits x @ weight.T: a plain CPU float32 weight (a tied head is the embedding
    table, never packed) at few rows goes to the C++ streaming kernel (`cpu_quant.linear_float`),
    which holds the memory rate where torch's `mm` GEMV drops to half of it; the rest as `linear`."""
    if isinstance(weight, torch.Tensor) and cpu_quant.streams_float(x, weight):
        return cpu_quant.linear_float(x, weight)
    return linear(x, weight)


@dataclass(frozen=True)
class CpuKernels:
    """The loaded CPU kernel libraries, for a caller that replays their calls itself
    (`runtime/engine/worker/cpu_decode.py`): the attention object (cpu/paged_attention.cpp) and the GEMM
    object (cpu/quant_gemm.cpp), with the row limits up to which `linear` sends a quantized or a
    plain float32 weight to the GEMM object, and runs a oneDNN-packed one at its own row count."""

    attention: Any
    gemm: Any
    quant_max_rows: int
    float_max_rows: int
    packed_max_rows: int


def cpu_kernels() -> CpuKernels | str:
    """Both CPU kernel libraries, or why not (no compiler, switched off, a failed build)."""
    from modeldeploy.kernels import cpu_attention

    if _cpu_impl("rms_norm") is None or not cpu_attention.available():
        return f"CPU attention kernels: {cpu_attention.build()}"
    if not cpu_quant.available():
        return f"CPU GEMM kernel: {cpu_quant.path_in_use()}"
    q = cpu_quant
    return CpuKernels(
        cpu_attention._load(), q._load(), q.FUSED_MAX_ROWS, q.FLOAT_MAX_ROWS, cpu_gemm.EXACT_ROWS
    )


def _quant_impl(x: torch.Tensor) -> Callable[..., Any]:
    """A QuantLinear call off the CPU kernel: CUDA's int4/int8 kernels (`kernels.quant_cuda`, which
    hands shapes and dtypes it does not cover to the twin itself), else the twin `quant.linear`."""
    fn = _cuda("quant_linear") if x.is_cuda else None
    return fn if fn is not None else quant.linear


def embedding(ids, table, dtype=torch.float32):
    """Rows `ids` of the embedding table: a plain tensor, or a QuantLinear (those rows de-quantized
    to `dtype`, the model's)."""
    if isinstance(table, quant.QuantLinear):
        return table.rows(ids, dtype)
    return torch.nn.functional.embedding(ids, table)


def rms_norm(x, weight, eps, residual=None):
    return _impl("rms_norm", x)(x, weight, eps, residual)


def rotary_embedding(positions, q, k, cos_sin_cache):
    return _impl("rotary_embedding", q)(positions, q, k, cos_sin_cache)


def silu_and_mul(x):
    return _impl("silu_and_mul", x)(x)


def write_kv(k, v, k_cache, v_cache, slot_mapping):
    return _impl("write_kv", k)(k, v, k_cache, v_cache, slot_mapping)


def _into(out, fn, *args):
    """Run an attention impl writing `out` when given: the kernels take `out=` (and write it unless
    they fell back to their twin for an unsupported layout), the twins' result is copied in."""
    if out is None:
        return fn(*args)
    res = fn(*args) if fn.__module__ == reference.__name__ else fn(*args, out=out)
    if res is not out:
        out.copy_(res)
    return out


def paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale, out=None):
    """`out` (contiguous [B, H, D]) is written in place when given."""
    fn = _impl("paged_attention_decode", q)
    return _into(out, fn, q, k_cache, v_cache, block_tables, context_lens, scale)


def paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, out=None):
    fn = _impl("paged_attention_prefill", q)
    return _into(out, fn, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)


def sdpa_for_fresh_prompts(kv_cache: torch.Tensor) -> bool:
    """Whether a step whose prefill chunks are all whole fresh prompts should attend with SDPA
    over their own K/V (`causal_attention`) instead of the paged prefill: only on CPU where the
    paged prefill is the torch twin (a gather of every sequence's blocks, then SDPA). The in-place
    C++ prefill beats SDPA on these shapes (2.3x at 283 tokens, 1.1x at 1536;
    bench/results/engine_cpu.md) and CUDA's kernels read pages at full speed."""
    if kv_cache.device.type != "cpu":
        return False
    from modeldeploy.kernels import cpu_attention

    return _cpu_impl("paged_attention_prefill") is None or kv_cache.dtype not in cpu_attention.DTYPES


def causal_attention(q, k, v, scale, out=None):
    """One fresh prompt's causal self-attention over its own q [T, H, D], k, v [T, Hkv, D] (views
    of qkv allowed): torch SDPA on every device (no paged read needed: nothing cached before it)."""
    o = reference.causal_attention(q, k, v, scale)
    if out is None:
        return o
    out.copy_(o)
    return out


def lora_apply(out, x, a, b, scales, slots):
    return _impl("lora_apply", x)(out, x, a, b, scales, slots)
