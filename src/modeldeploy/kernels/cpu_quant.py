"""Weight-streaming linear layers on CPU (cpu/quant_gemm.cpp): float32 activations times a
`QuantLinear` (4-bit or 8-bit groups of 32, float32 scales) without rebuilding the float weight,
and times a plain float32 weight at few rows (`linear_float`, the LM head). Twins: `quant.linear`
(de-quantize, then F.linear) and F.linear.

Up to `FUSED_MAX_ROWS` rows (decode steps, short chunks) the kernel rebuilds each group of 32
weights in registers once and multiplies it into every row: it reads 0.75 (4-bit) or 1.125
(8-bit) bytes per weight instead of float32's 4. Against oneDNN on a packed float32 weight, one
thread (bench/results/serving_real_cpu.md, "Quantized weights"): 2x faster on the 49152 x 576 head
at 1 row (weights streamed from memory), 0.9-1.2x at 16 rows, within 10-30 % on the layers' GEMMs
whose float32 weights sit in cache in that micro-benchmark (in the model they do not: decode at
batch 1 is 1.8x faster), and 1.7-2.6x slower at 64-256 rows. So longer chunks (prefill) rebuild
the float32 weight once per call (`mdq_dequant`, a transient [N, K] buffer) and multiply with
torch's BLAS, within 10 % of oneDNN there; except for weights too big for that buffer to pay
(over `DEQUANT_MAX_WEIGHTS`: the head, 28 M weights, where the fused kernel stays faster than that).

Where the CPU has AVX-512 VNNI, those longer chunks run on int8 activations instead
(`mdq_linear_i8`, W4A8 / W8A8, what llama.cpp does for these formats): each row quantized per group
of 32 inputs, one exact int32 dot product per group (VPDPBUSD, 64 byte pairs an instruction against
an FMA's 16 floats), scaled by both groups' scales. 1.9-3.8x faster than de-quantize + MKL at 33-1536
rows (`bench/serving_real_cpu.py quant-gemm`); a prompt's prefill on the real model 1.5-1.9x
(`quant-prefill`); served, 4x llama.cpp's capacity on Q8_0 (bench/results/serving_real_cpu.md).
Its per-call copy is 1 byte a weight, so it also takes the tied head (up to `I8_MAX_WEIGHTS`) when
a request asks for prompt log-probabilities (the quality gate's teacher forcing): 1.4-3.1x the fused
kernel on the real model's Q8_0 head at 33-512 rows. The price is the activations' rounding: about
0.4 % (4-bit) and 0.5 % (8-bit) relative error of a layer's output against the float32 product on
random data; on the real model the quality gate saw no loss (Q4_1: 34/34 items, log-prob drop
-0.002 nats/token, greedy agreement 0.94; Q8_0 as on float activations: bench/results/quality.md).
MODELDEPLOY_CPU_QUANT_PREFILL=float keeps the float32 path (bit-comparable with a float reference
on the de-quantized weights); the int8 path's twin is `quant.linear_int8_act`.

The float32 path is for the LM head, which the engine applies to one row per sampled sequence:
a tied head is the embedding table itself, kept unpacked (the lookup needs it, and a packed copy
would double its 113 MB on the real model), so it ran through torch's `mm`, whose GEMV falls to
10-15 GB/s at 4-8 rows. Up to `FLOAT_MAX_ROWS` rows it goes through this kernel instead; beyond,
F.linear, which MKL runs as a GEMM there and wins. The same holds for the layers' weights where
`kernels.cpu_gemm` keeps them plain (Intel CPUs, or MODELDEPLOY_CPU_GEMM=0; `dispatch.linear`): on
an Intel Xeon with AVX-512 this kernel ran the layers' 120 GEMMs 1.06-1.4x faster than oneDNN's
packed weights at 1-16 rows, within 10 % of MKL at 1-2 rows and 1.1-1.4x faster than it at 4-16
(bench/results/serving_real_cpu.md, "Decode on the kernels' own calls").

Built and loaded like the paged-attention kernel (kernels/cpu_build.py: prebuilt per x86-64 level
in the image, else compiled here on first use); without either, or with MODELDEPLOY_CPU_KERNELS=0,
`available()` is False and dispatch uses the twin, which a log line says.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from modeldeploy.kernels import cpu_build
from modeldeploy.kernels.cpu_attention import ENV_SWITCH, _cache_dirs
from modeldeploy.kernels.quant import QuantLinear

log = logging.getLogger("modeldeploy.kernels")

SOURCE = cpu_build.QUANT_SOURCE
ABI_VERSION = 3  # 2: bits 32 (float32 weights); 3: mdq_linear_i8
ENV_PREFILL = "MODELDEPLOY_CPU_QUANT_PREFILL"  # "int8" (where the CPU has AVX-512 VNNI) or "float"
PREFILL_CHOICES = ("int8", "float")
I8_COLUMNS = 16  # the int8 path packs output columns in strips of this many
FUSED_MAX_ROWS = 32  # more rows: de-quantize once, then BLAS (see the docstring)
DEQUANT_MAX_WEIGHTS = 1 << 22  # ... for weights up to this many (a 16 MB float32 buffer)
I8_MAX_WEIGHTS = (
    1 << 25
)  # int8 activations: weights up to this many (a 32 MB int8 copy per call; the head too)
FLOAT_MAX_ROWS = 16  # a plain float32 weight: this kernel up to here, F.linear beyond

_lib: ctypes.CDLL | None = None
_state = "unloaded"  # unloaded | loaded | unavailable
_why = ""
_origin = ""
_lock = threading.Lock()
_prefill: str | None = None  # what chunks over FUSED_MAX_ROWS run on, decided once per process


def _object() -> tuple[Path, str]:
    prebuilt = os.environ.get(cpu_build.ENV_PREBUILT)
    if prebuilt:
        found = cpu_build.find_prebuilt(Path(prebuilt), source=SOURCE)
        if found is not None:
            return found[0], f"prebuilt {found[1]}"
        log.warning("CPU quantized GEMM: no prebuilt object in %s for this source and CPU", prebuilt)
    if cpu_build.compiler() is None:
        raise RuntimeError("no C++ compiler on PATH (g++, c++, clang++; or set CXX)")
    return cpu_build.build_here(_cache_dirs(), SOURCE), "built here (-march=native)"


def _load() -> ctypes.CDLL | None:
    global _lib, _state, _why, _origin
    with _lock:
        if _state != "unloaded":
            return _lib
        if os.environ.get(ENV_SWITCH, "1") == "0":
            _state, _why = "unavailable", f"{ENV_SWITCH}=0"
        else:
            try:
                path, origin = _object()
                i, i64, p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
                lib = cpu_build.open_library(
                    path,
                    "mdq_abi_version",
                    ABI_VERSION,
                    {
                        "mdq_linear": ([i, p, i64, i64, p, p, p, i64, p, i], None),
                        "mdq_dequant": ([i, p, p, p, i64, i64, p, i], None),
                        "mdq_i8_supported": ([], i),
                        "mdq_linear_i8": ([i, p, i64, i64, p, p, p, i64, p, i], None),
                    },
                )
                _lib, _state, _origin = lib, "loaded", origin
            except Exception as e:  # noqa: BLE001  (any failure means: use the twin)
                _state, _why = "unavailable", str(e)
        if _state == "loaded":
            log.info("CPU quantized linear layers: C++ kernel (%s, %s)", SOURCE.name, _origin)
        else:
            log.warning("CPU quantized linear layers: torch twin (de-quantize, then GEMM): %s", _why)
        return _lib


def available() -> bool:
    return _load() is not None


def path_in_use() -> str:
    """'cpp (origin)' or 'reference (why)', for /v1/bundle."""
    return f"cpp ({_origin})" if available() else f"reference ({_why})"


def prefill_path() -> str:
    """What quantized GEMMs over FUSED_MAX_ROWS rows run on: "int8 activations (AVX-512 VNNI)", or
    "float32 (why)": de-quantize, then BLAS. Raises ValueError naming MODELDEPLOY_CPU_QUANT_PREFILL
    for a value it does not know (the model load reports it)."""
    global _prefill
    if _prefill is None:
        choice = os.environ.get(ENV_PREFILL, "int8").strip() or "int8"
        if choice not in PREFILL_CHOICES:
            raise ValueError(f"{ENV_PREFILL}={choice!r}: expected one of {', '.join(PREFILL_CHOICES)}")
        lib = _load()
        if choice == "float":
            _prefill = f"float32 ({ENV_PREFILL}=float)"
        elif lib is None:
            _prefill = f"float32 (no C++ kernel: {_why})"
        elif not lib.mdq_i8_supported():
            _prefill = "float32 (this CPU has no AVX-512 VNNI)"
        else:
            _prefill = "int8 activations (AVX-512 VNNI)"
        log.info("CPU quantized linear layers over %d rows: %s", FUSED_MAX_ROWS, _prefill)
    return _prefill


def supports(x: torch.Tensor, w: QuantLinear) -> bool:
    """Whether the kernel takes this call: CPU float32 activations and weight, and a loaded kernel."""
    return x.device.type == "cpu" and w.device.type == "cpu" and x.dtype == torch.float32 and available()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def dequantize(w: QuantLinear) -> torch.Tensor:
    """The float32 [N, K] weight, rebuilt by the kernel (equal to `w.dequantize()`)."""
    lib = _load()
    if lib is None:
        return w.dequantize()
    out = torch.empty(w.out_features, w.in_features, dtype=torch.float32)
    lib.mdq_dequant(
        w.bits,
        _ptr(w.qweight),
        _ptr(w.scales),
        _ptr(w.zeros),
        w.out_features,
        w.in_features,
        _ptr(out),
        torch.get_num_threads(),
    )
    return out


def linear(x: torch.Tensor, w: QuantLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] float32 @ w.T (+ bias) -> [T, N] on CPU (callers check `supports` first)."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"CPU quantized GEMM kernel unavailable: {_why}")
    if x.shape[-1] != w.in_features:
        raise ValueError(f"linear: input has {x.shape[-1]} features, the weight takes {w.in_features}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features).contiguous()
    rows = x2.shape[0]
    size = w.out_features * w.in_features
    i8 = (
        rows > FUSED_MAX_ROWS
        and size <= I8_MAX_WEIGHTS
        and w.out_features % I8_COLUMNS == 0
        and prefill_path().startswith("int8")
    )
    if rows > FUSED_MAX_ROWS and size <= DEQUANT_MAX_WEIGHTS and not i8:
        return F.linear(x, dequantize(w), bias)
    out = _gemm(lib.mdq_linear_i8 if i8 else lib.mdq_linear, x2, w)
    if bias is not None:
        out += bias
    return out.reshape(*lead, w.out_features)


def linear_i8(x: torch.Tensor, w: QuantLinear) -> torch.Tensor:
    """x [T, K] float32 @ w.T on int8 activations at any row count, whatever `linear` would pick
    (benches; callers check `prefill_path()` first)."""
    lib = _load()
    if lib is None or not lib.mdq_i8_supported():
        raise RuntimeError(f"CPU int8-activation GEMM unavailable: {prefill_path()}")
    return _gemm(lib.mdq_linear_i8, x.contiguous(), w)


def _gemm(fn: Callable[..., None], x: torch.Tensor, w: QuantLinear) -> torch.Tensor:
    """One of the kernel's two GEMMs (mdq_linear, mdq_linear_i8: the same arguments) on a contiguous
    [T, K] float32 x."""
    out = torch.empty(x.shape[0], w.out_features, dtype=torch.float32)
    fn(
        w.bits,
        _ptr(x),
        x.shape[0],
        w.in_features,
        _ptr(w.qweight),
        _ptr(w.scales),
        _ptr(w.zeros),
        w.out_features,
        _ptr(out),
        torch.get_num_threads(),
    )
    return out


def streams_float(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `linear_float` takes this call: CPU float32 [T, K] activations and a contiguous
    float32 [N, K] weight, K a multiple of 32, at most FLOAT_MAX_ROWS rows, a loaded kernel."""
    return (
        x.device.type == "cpu"
        and w.device.type == "cpu"
        and x.dtype == torch.float32
        and w.dtype == torch.float32
        and x.dim() == 2
        and w.dim() == 2
        and w.shape[1] == x.shape[1]
        and w.shape[1] % 32 == 0
        and w.is_contiguous()
        and 0 < x.shape[0] <= FLOAT_MAX_ROWS
        and available()
    )


def linear_float(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [T, K] float32 @ w.T -> [T, N] for a plain float32 weight (callers check `streams_float`)."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"CPU weight-streaming kernel unavailable: {_why}")
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: input has {x.shape[-1]} features, the weight takes {w.shape[1]}")
    x2 = x.contiguous()
    out = torch.empty(x2.shape[0], w.shape[0], dtype=torch.float32)
    rows, threads = x2.shape[0], torch.get_num_threads()
    lib.mdq_linear(32, _ptr(x2), rows, w.shape[1], _ptr(w), None, None, w.shape[0], _ptr(out), threads)
    return out
