"""Paged attention on CPU that reads the KV blocks in place (cpu/paged_attention.cpp), and the
KV-cache write, rotary embedding, residual-add + RMSNorm and SiLU-and-mul (one call each instead
of several small torch ops per layer). Twins: `reference.paged_attention_decode`,
`reference.paged_attention_prefill`, `reference.write_kv`, `reference.rotary_embedding`,
`reference.rms_norm`, `reference.silu_and_mul`.

The reference twins gather each sequence's blocks into a contiguous copy before SDPA; on CPU
that copy was about half of a decode step (bench/results/engine_cpu.md). This kernel walks
the block table instead: one task per (sequence, kv head[, query tile]), the GROUP query
heads of a kv head sharing each K/V row load, OpenMP over tasks with torch's thread count
(`torch.get_num_threads()`, passed per call), float32 math, float32 and bfloat16 caches.

Build (kernels/cpu_build.py): a plain C ABI shared object loaded with ctypes, either prebuilt
in the runtime image for the CPU's x86-64 level (`$MODELDEPLOY_CPU_KERNELS_PREBUILT`) or
compiled with the system C++ compiler on first use (about 2 s, `-O3 -march=native -fopenmp`)
into a cache directory keyed by the source, the compiler and the CPU's flags. Not a torch
extension on purpose: no torch headers (a torch extension takes ~1 min to compile on 2 cores),
no ninja, no build at install time (pip's build isolation would download torch), and no tie to
torch's C++ ABI. With neither (no prebuilt object for this source and CPU, no compiler), or with
MODELDEPLOY_CPU_KERNELS=0, `available()` is False and dispatch keeps the torch twins; a log line
says which path is used, and `build()` says it for /v1/bundle.
"""

from __future__ import annotations

import ctypes
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from modeldeploy.kernels import cpu_build, reference

log = logging.getLogger("modeldeploy.kernels")

SOURCE = cpu_build.SOURCE
ENV_SWITCH = "MODELDEPLOY_CPU_KERNELS"  # "0" = torch twins only
ENV_CACHE = "MODELDEPLOY_KERNEL_CACHE"  # where the shared object is built (default ~/.cache)
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
PREFILL_TILE = 8  # query tokens per prefill task (x GROUP heads = rows sharing each K/V load) ...
PREFILL_ROWS = 48  # ... on float32 caches: enough tokens for about this many rows (see below)


def prefill_tile(group: int, dtype: torch.dtype) -> int:
    """Query tokens per prefill task. On float32 caches the kernel lays a task's tile x GROUP rows
    along its vector lanes (16 with AVX-512), so a tile of about 48 rows fills three vectors: on
    SmolLM2 (GROUP 3) 16 tokens attended a 1536-token prompt at 179 GFLOP/s where 8 tokens (24
    rows, two vectors a quarter empty) gave 133 (bench/results/paged_attention_cpu.md). The
    bfloat16 path keeps its dot-product form and 8 tokens."""
    if dtype != torch.float32:
        return PREFILL_TILE
    return max(PREFILL_TILE, -(-PREFILL_ROWS // group))


_lib: ctypes.CDLL | None = None
_state = "unloaded"  # unloaded | loaded | unavailable
_why = ""
_origin = ""  # "prebuilt x86-64-v3" | "built here (-march=native)"
_lock = threading.Lock()


def _cache_dirs() -> list[Path]:
    env = os.environ.get(ENV_CACHE)
    if env:
        return [Path(env)]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return [
        Path(base) / "modeldeploy" / "cpu_kernels",
        Path(tempfile.gettempdir()) / "modeldeploy-cpu-kernels",
    ]


def _compiler() -> str | None:
    return cpu_build.compiler()


def _object() -> tuple[Path, str]:
    """(shared object, where it came from): the image's prebuilt one for this CPU, else one built here."""
    prebuilt = os.environ.get(cpu_build.ENV_PREBUILT)
    if prebuilt:
        found = cpu_build.find_prebuilt(Path(prebuilt))
        if found is not None:
            return found[0], f"prebuilt {found[1]}"
        log.warning(
            "CPU paged attention: no prebuilt object in %s for this source (%s) and CPU (levels %s)",
            prebuilt,
            cpu_build.source_hash(),
            ", ".join(cpu_build.levels_of(cpu_build.cpu_flags())) or "none",
        )
    if _compiler() is None:
        raise RuntimeError("no C++ compiler on PATH (g++, c++, clang++; or set CXX)")
    return cpu_build.build_here(_cache_dirs()), "built here (-march=native)"


def _signatures() -> dict[str, tuple[list[Any], Any]]:
    """The C functions' (argtypes, restype), as cpu/paged_attention.cpp declares them (ABI 5)."""
    i, i64, p, f = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    return {
        "md_paged_decode": ([i, p, i64, p, p, p, i64, p, p, i, i, i, i, i, f, i], None),
        "md_paged_prefill": ([i, p, i64, p, p, p, i64, p, p, p, i, i, i, i, i, i, f, i], None),
        "md_write_kv": ([i, p, i64, p, i64, p, p, p, i, i64, i64], i),
        "md_rotary": ([i, p, p, i64, i, p, i64, i, i, i, p, i64], i),
        "md_rms_norm": ([i, p, i64, p, i64, p, p, p, i, i, f, i], None),
        "md_silu_and_mul": ([i, p, i64, p, i, i, i], None),
    }


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
                lib = cpu_build.open_library(path, "md_abi_version", 5, _signatures())
                _lib, _state, _origin = lib, "loaded", origin
            except Exception as e:  # noqa: BLE001  (any failure means: use the twins)
                _state, _why = "unavailable", str(e)
        if _state == "loaded":
            log.info("CPU paged attention: in-place C++ kernel (%s, %s)", SOURCE.name, _origin)
        else:
            log.warning("CPU paged attention: torch reference twins (gather + SDPA): %s", _why)
        return _lib


def available() -> bool:
    return _load() is not None


def path_in_use() -> str:
    """'cpp' or 'reference' (loads on first call)."""
    return "cpp" if available() else "reference"


def build() -> dict[str, str]:
    """Which CPU attention this process runs and why, for /v1/bundle (loads on first call)."""
    if available():
        return {"path": "cpp", "origin": _origin}
    return {"path": "reference", "why": _why}


def _supported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    return (
        q.device.type == "cpu"
        and q.dtype in DTYPES
        and k_cache.dtype == q.dtype == v_cache.dtype
        and q.dim() == 3
        and k_cache.dim() == 4
        and v_cache.shape == k_cache.shape
        and k_cache.shape[3] == q.shape[2]
        and q.shape[1] % k_cache.shape[2] == 0
        and q.shape[2] % 8 == 0
        and 0 < k_cache.shape[1] <= 64
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and q.stride(2) == 1
        and q.stride(1) == q.shape[2]
    )


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale, *, out=None):
    """`out` [B, H, D] contiguous may be given (written in place)."""
    lib = _load()
    if lib is None or not _supported(q, k_cache, v_cache):
        return reference.paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale)
    B, H, D = q.shape
    if out is None:
        out = torch.empty(B, H, D, dtype=q.dtype)
    if B == 0:
        return out
    tables, lens = _i32(block_tables), _i32(context_lens)
    lib.md_paged_decode(
        DTYPES[q.dtype], q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
        tables.data_ptr(), tables.stride(0), lens.data_ptr(), out.data_ptr(),
        B, H, k_cache.shape[2], D, k_cache.shape[1], float(scale), torch.get_num_threads(),
    )  # fmt: skip
    return out


def paged_attention_prefill(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, *, out=None
):
    lib = _load()
    if lib is None or not _supported(q, k_cache, v_cache):
        return reference.paged_attention_prefill(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale
        )
    T, H, D = q.shape
    if out is None:
        out = torch.empty(T, H, D, dtype=q.dtype)
    if T == 0:
        return out
    tables, cu, lens = _i32(block_tables), _i32(cu_seqlens_q), _i32(context_lens)
    lib.md_paged_prefill(
        DTYPES[q.dtype], q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
        tables.data_ptr(), tables.stride(0), cu.data_ptr(), lens.data_ptr(), out.data_ptr(),
        lens.shape[0], H, k_cache.shape[2], D, k_cache.shape[1], prefill_tile(H // k_cache.shape[2], q.dtype),
        float(scale),
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def _rows_packed(t: torch.Tensor) -> bool:
    """[T, Hkv, D] whose token rows are packed (token stride free: k/v may be views of qkv)."""
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]


def write_kv(k, v, k_cache, v_cache, slot_mapping):
    """One row copy per token into its slot (-1 skips); the twin's boolean mask, nonzero and
    index_put cost more than the copy itself at decode batch sizes."""
    lib = _load()
    if (
        lib is None
        or k.device.type != "cpu"
        or not all(t.dtype == k.dtype for t in (v, k_cache, v_cache))
        or not (_rows_packed(k) and _rows_packed(v) and v.shape == k.shape)
        or not (k_cache.is_contiguous() and v_cache.is_contiguous())
        or k_cache.shape[2:] != k.shape[1:]
        or v_cache.shape != k_cache.shape
        or slot_mapping.shape != k.shape[:1]
    ):
        return reference.write_kv(k, v, k_cache, v_cache, slot_mapping)
    slots = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()
    slots = slots.contiguous()
    bad = lib.md_write_kv(
        k.element_size(), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
        k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(), k.shape[0], k.shape[1] * k.shape[2],
        k_cache.shape[0] * k_cache.shape[1],
    )  # fmt: skip
    if bad:
        raise IndexError(
            f"write_kv: {bad} slot(s) outside the cache ({k_cache.shape[0] * k_cache.shape[1]} slots)"
        )
    return None


def rotary_embedding(positions, q, k, cos_sin_cache):
    """In place, bit-equal to the twin in float32 (same roundings, no FMA contraction)."""
    lib = _load()
    if (
        lib is None
        or q.device.type != "cpu"
        or q.dtype not in DTYPES
        or k.dtype != q.dtype
        or not (_rows_packed(q) and _rows_packed(k))
        or k.shape[2] != q.shape[2]
        or q.shape[2] % 2
        or q.shape[0] != k.shape[0]
        or positions.shape != q.shape[:1]
        or cos_sin_cache.dtype != torch.float32
        or not cos_sin_cache.is_contiguous()
        or cos_sin_cache.shape[-1] != q.shape[2]
    ):
        return reference.rotary_embedding(positions, q, k, cos_sin_cache)
    pos = positions if positions.dtype == torch.int64 else positions.long()
    pos = pos.contiguous()
    bad = lib.md_rotary(
        DTYPES[q.dtype], pos.data_ptr(), q.data_ptr(), q.stride(0), q.shape[1], k.data_ptr(), k.stride(0),
        k.shape[1], q.shape[0], q.shape[2], cos_sin_cache.data_ptr(), cos_sin_cache.shape[0],
    )  # fmt: skip
    if bad:
        raise IndexError(
            f"rotary_embedding: {bad} position(s) outside the cos/sin cache ({cos_sin_cache.shape[0]})"
        )
    return None


def _cpu_rows(x: torch.Tensor) -> bool:
    """A CPU [rows, E] tensor of a kernel dtype whose elements are contiguous (any row stride)."""
    return x.device.type == "cpu" and x.dtype in DTYPES and x.dim() == 2 and x.stride(1) == 1


def rms_norm(x, weight, eps, residual=None):
    """(x + residual) RMS-normalised and scaled, and the new residual, in one call: two passes per
    row where the twin makes about six and allocates four temporaries (8 % of a 1-thread decode
    step, bench/results/profile_decode_cpu.md). Rows [T, E] with contiguous elements; anything
    else (q/k norm's [T, H, D] views, float16) goes to the twin. Not bit-equal to the twin: the
    sum of squares is reduced in another order (float32 either way)."""
    lib = _load()
    if (
        lib is None
        or not _cpu_rows(x)
        or weight.dtype != x.dtype
        or weight.shape != x.shape[1:]
        or not weight.is_contiguous()
        or (
            residual is not None
            and (residual.dtype != x.dtype or residual.shape != x.shape or residual.stride(1) != 1)
        )
    ):
        return reference.rms_norm(x, weight, eps, residual)
    out = torch.empty(x.shape, dtype=x.dtype)
    new = torch.empty(x.shape, dtype=x.dtype) if residual is not None else None
    lib.md_rms_norm(
        DTYPES[x.dtype], x.data_ptr(), x.stride(0),
        residual.data_ptr() if residual is not None else None,
        residual.stride(0) if residual is not None else 0,
        new.data_ptr() if new is not None else None, weight.data_ptr(), out.data_ptr(),
        x.shape[0], x.shape[1], float(eps), torch.get_num_threads(),
    )  # fmt: skip
    return out, new


def silu_and_mul(x):
    """silu(x[:, :I]) * x[:, I:] in one pass with a vectorised exp, where the twin runs silu into a
    temporary and then a multiply (3.7 % of the engine bench's wall time). Rows [T, 2I] with
    contiguous elements; anything else goes to the twin. Not bit-equal to the twin: exp within
    2 ulp of torch's."""
    lib = _load()
    if lib is None or not _cpu_rows(x) or x.shape[1] % 2:
        return reference.silu_and_mul(x)
    rows, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, inter, dtype=x.dtype)
    if rows:
        lib.md_silu_and_mul(
            DTYPES[x.dtype], x.data_ptr(), x.stride(0), out.data_ptr(), rows, inter, torch.get_num_threads()
        )
    return out
