"""KV-cache write through a slot mapping on CUDA (cuda/cache.cu). Twin: `reference.write_kv`."""

from __future__ import annotations

import torch

from modeldeploy.kernels import build, reference
from modeldeploy.kernels.launch import dtype_name, i32, i64, launch, ptr, threads_for, vec_for


def _rows_packed(t: torch.Tensor) -> bool:
    """[T, Hkv, D] whose token rows are packed (token stride free: k/v may be views of qkv)."""
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    dt = dtype_name(k)
    if (
        dt not in build.CTYPES
        or not all(t.dtype == k.dtype for t in (v, k_cache, v_cache))
        or not _rows_packed(k)
        or not _rows_packed(v)
        or v.shape != k.shape
        or not k_cache.is_contiguous()
        or not v_cache.is_contiguous()
        or k_cache.shape[2:] != k.shape[1:]
        or v_cache.shape != k_cache.shape
    ):
        return reference.write_kv(k, v, k_cache, v_cache, slot_mapping)
    T = k.shape[0]
    if T == 0:
        return None
    width = k.shape[1] * k.shape[2]
    slots = slot_mapping.to(torch.int64).contiguous()
    vec = vec_for(dt, width, k.stride(0), v.stride(0), k, v, k_cache, v_cache)
    launch(
        "cache",
        build.write_kv_name(dt, vec),
        k.device,
        grid=(T,),
        block=(threads_for(width // vec, cap=256),),
        args=(
            ptr(k),
            i64(k.stride(0)),
            ptr(v),
            i64(v.stride(0)),
            ptr(k_cache),
            ptr(v_cache),
            ptr(slots),
            i32(width),
        ),
    )
    return None
