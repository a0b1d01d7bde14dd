"""Rotary embedding in place, NeoX layout, on CUDA (cuda/rotary.cu).
Twin: `reference.rotary_embedding`."""

from __future__ import annotations

import torch

from modeldeploy.kernels import build, reference
from modeldeploy.kernels.launch import dtype_name, i32, i64, launch, ptr, threads_for


def _heads_contiguous(t: torch.Tensor) -> bool:
    """[T, H, D] whose heads are packed rows (token stride free: q/k may be views of qkv)."""
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    dt = dtype_name(q)
    if (
        dt not in build.CTYPES
        or k.dtype != q.dtype
        or not _heads_contiguous(q)
        or not _heads_contiguous(k)
        or k.shape[2] != q.shape[2]
        or q.shape[0] != k.shape[0]
        or cos_sin_cache.dtype != torch.float32
        or cos_sin_cache.shape[-1] != q.shape[2]
    ):
        return reference.rotary_embedding(positions, q, k, cos_sin_cache)
    T, hq, d = q.shape
    if T == 0:
        return None
    positions = positions.to(torch.int64).contiguous()
    cos_sin_cache = cos_sin_cache.contiguous()
    hk = k.shape[1]
    vec = build.ROTARY_VEC
    vbytes = vec * q.element_size()
    if (
        (d // 2) % vec
        or any(
            x % vbytes
            for x in (
                q.data_ptr(),
                k.data_ptr(),
                q.stride(0) * q.element_size(),
                k.stride(0) * k.element_size(),
                d * q.element_size(),
            )
        )
        or cos_sin_cache.data_ptr() % 16
    ):
        vec = 1
    launch(
        "rotary",
        build.rotary_name(dt, vec),
        q.device,
        grid=(T,),
        block=(threads_for((hq + hk) * d // 2 // vec, cap=512),),
        args=(
            ptr(q),
            i64(q.stride(0)),
            ptr(k),
            i64(k.stride(0)),
            ptr(positions),
            ptr(cos_sin_cache),
            i32(hq),
            i32(hk),
            i32(d),
        ),
    )
    return None
