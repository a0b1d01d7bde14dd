"""Kernel sources, NVRTC options and the template instantiations each wrapper launches.

Pure Python (no CuPy, no GPU): the runtime loader (`kernels.launch`) and the CI compile
check (`tests/kernels/test_kernels_nvrtc.py`) both take sources, options and name expressions from
here, so CI compiles exactly what a GPU would run.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

CUDA_DIR = Path(__file__).parent / "cuda"
FAMILIES = ("norm", "activation", "rotary", "cache", "attention", "lora", "quant")

# torch dtype name -> CUDA C++ type
CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}

ATTN_HEAD_DIMS = (64, 128)
ATTN_GROUPS = (1, 2, 4, 8, 16)  # query heads per kv head
ATTN_UNROLL = 4  # keys per warp per step (attention.cu's UNROLL)
# Extra instantiations with UNROLL=8 on the 8B-class hot path, for the GPU check to compare.
ATTN_UNROLL8 = tuple((dt, 128, g) for dt in ("float16", "bfloat16") for g in (4, 8))


def vec_width(dtype: str) -> int:
    """Elements per 16-byte access."""
    return 16 // ITEMSIZE[dtype]


def rms_norm_name(dtype: str, vec: int) -> str:
    return f"rms_norm_kernel<{CTYPES[dtype]}, {vec}>"


def silu_and_mul_name(dtype: str, vec: int) -> str:
    return f"silu_and_mul_kernel<{CTYPES[dtype]}, {vec}>"


ROTARY_VEC = 4  # pairs per thread on the vector path (needs head_dim / 2 % 4 == 0)


def rotary_name(dtype: str, vec: int) -> str:
    return f"rotary_kernel<{CTYPES[dtype]}, {vec}>"


def write_kv_name(dtype: str, vec: int) -> str:
    return f"write_kv_kernel<{CTYPES[dtype]}, {vec}>"


def attention_name(dtype: str, head_dim: int, group: int, unroll: int = ATTN_UNROLL) -> str:
    return f"paged_attention_kernel<{CTYPES[dtype]}, {head_dim}, {group}, {unroll}>"


def attention_reduce_name(dtype: str) -> str:
    return f"paged_attention_reduce_kernel<{CTYPES[dtype]}>"


def lora_shrink_name(dtype: str) -> str:
    return f"lora_shrink_kernel<{CTYPES[dtype]}>"


def lora_expand_name(dtype: str) -> str:
    return f"lora_expand_kernel<{CTYPES[dtype]}>"


QUANT_BITS = (4, 8)
QUANT_ROWS = (1, 2, 4, 8)  # rows of x per GEMV block (quant.cu's ROWS); more rows take several blocks
QUANT_COLS = 4  # output columns per warp (quant.cu's COLS)


def quant_gemv_name(dtype: str, bits: int, rows: int) -> str:
    return f"quant_gemv_kernel<{CTYPES[dtype]}, {bits}, {rows}, {QUANT_COLS}>"


def quant_dequant_name(dtype: str, bits: int) -> str:
    return f"quant_dequant_kernel<{CTYPES[dtype]}, {bits}>"


@cache
def name_expressions(family: str) -> tuple[str, ...]:
    """Every instantiation of a family's templates (what a wrapper may ask for)."""
    names: list[str] = []
    for dt in CTYPES:
        vecs = (1, vec_width(dt))
        if family == "norm":
            names += [rms_norm_name(dt, v) for v in vecs]
        elif family == "activation":
            names += [silu_and_mul_name(dt, v) for v in vecs]
        elif family == "rotary":
            names += [rotary_name(dt, v) for v in (1, ROTARY_VEC)]
        elif family == "cache":
            names += [write_kv_name(dt, v) for v in vecs]
        elif family == "attention":
            names += [attention_name(dt, d, g) for d in ATTN_HEAD_DIMS for g in ATTN_GROUPS]
            names += [attention_name(dt, d, g, 8) for (t, d, g) in ATTN_UNROLL8 if t == dt]
            names.append(attention_reduce_name(dt))
        elif family == "lora":
            names += [lora_shrink_name(dt), lora_expand_name(dt)]
        elif family == "quant":
            names += [quant_gemv_name(dt, b, r) for b in QUANT_BITS for r in QUANT_ROWS]
            names += [quant_dequant_name(dt, b) for b in QUANT_BITS]
        else:
            raise KeyError(family)
    return tuple(names)


_LOCAL_INCLUDE = re.compile(r'^#include "([\w.]+)"\s*$', re.M)


@cache
def source(family: str) -> str:
    """The family's .cu text with local `#include "x.cuh"` inlined (CuPy's cache keys on the text)."""
    text = (CUDA_DIR / f"{family}.cu").read_text()
    return _LOCAL_INCLUDE.sub(lambda m: (CUDA_DIR / m.group(1)).read_text(), text)


@cache
def cuda_include_dir() -> str | None:
    """Directory holding cuda_fp16.h / cuda_bf16.h for NVRTC.

    NVRTC searches no directory by default. Order: the CUDA runtime headers found by
    cuda-pathfinder (the pip wheels next to the NVRTC that CuPy loads: nvidia-cuda-runtime),
    then $CUDA_PATH / $CUDA_HOME, then /usr/local/cuda.
    """
    candidates: list[str] = []
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            candidates.append(found)
    except Exception:  # pathfinder missing or no wheel: fall through to the system paths
        pass
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "include"))
    candidates.append("/usr/local/cuda/include")
    for d in candidates:
        if os.path.isfile(os.path.join(d, "cuda_bf16.h")):
            return d
    return None


def nvrtc_options() -> tuple[str, ...]:
    """Options for every compile (the architecture is added by the caller)."""
    opts = ["-std=c++17"]
    inc = cuda_include_dir()
    if inc:
        opts.append(f"-I{inc}")
    return tuple(opts)
