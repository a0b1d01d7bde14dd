"""SiLU-and-mul (SwiGLU) on CUDA (cuda/activation.cu). Twin: `reference.silu_and_mul`."""

from __future__ import annotations

import torch

from modeldeploy.kernels import build, reference
from modeldeploy.kernels.launch import dtype_name, i32, i64, launch, ptr, rows, vec_for

THREADS = 256


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:]  [..., I] (into contiguous `out` if given)."""
    dt = dtype_name(x)
    if dt not in build.CTYPES or x.shape[-1] % 2:
        return reference.silu_and_mul(x)
    inter = x.shape[-1] // 2
    if out is None:
        out = torch.empty(*x.shape[:-1], inter, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x2 = rows(x)
    vec = vec_for(dt, inter, x2.stride(0), x2, out)
    launch(
        "activation",
        build.silu_and_mul_name(dt, vec),
        x.device,
        grid=(x2.shape[0], -(-inter // (THREADS * vec))),
        block=(THREADS,),
        args=(ptr(out), ptr(x2), i64(x2.stride(0)), i32(inter)),
    )
    return out
