"""Multi-adapter LoRA delta on CUDA (cuda/lora.cu). Twin: `reference.lora_apply`.

Two launches per call whatever the number of adapters in the batch: shrink (x -> y = A x,
float32 [T, R]) and expand (out += scale * B y), each token reading its own adapter's
matrices by slot (BGMV). The twin groups rows by adapter instead (SGMV); both give the same
rows, which is what the checks compare.
"""

from __future__ import annotations

import torch

from modeldeploy.kernels import build, reference
from modeldeploy.kernels.launch import dtype_name, i32, i64, launch, ptr, rows

WARPS = 8  # shrink: rank rows per block
THREADS = 128  # expand: output columns per block
MAX_RANK = 1024  # expand stages y[t] in shared memory


def lora_apply(
    out: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scales: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """out [T, N] += per-token LoRA delta (in place); see `reference.lora_apply` for shapes."""
    dt = dtype_name(x)
    T, K = x.shape
    L, R, _ = a.shape
    N = b.shape[2]
    if (
        dt not in build.CTYPES
        or out.dtype != x.dtype
        or a.dtype != x.dtype
        or b.dtype != x.dtype
        or out.stride(-1) != 1
        or R > MAX_RANK
        or not (a.is_contiguous() and b.is_contiguous())
    ):
        return reference.lora_apply(out, x, a, b, scales, slots)
    if T == 0 or R == 0:
        return None
    x2 = rows(x)
    slots32 = slots.to(torch.int32).contiguous()
    scales32 = scales.to(torch.float32).contiguous()
    y = torch.empty(T, R, dtype=torch.float32, device=x.device)
    launch(
        "lora",
        build.lora_shrink_name(dt),
        x.device,
        grid=(T, -(-R // WARPS)),
        block=(32 * WARPS,),
        args=(ptr(y), ptr(x2), i64(x2.stride(0)), ptr(a), ptr(slots32), i32(R), i32(K)),
    )
    launch(
        "lora",
        build.lora_expand_name(dt),
        x.device,
        grid=(T, -(-N // THREADS)),
        block=(THREADS,),
        args=(ptr(out), i64(out.stride(0)), ptr(y), ptr(b), ptr(scales32), ptr(slots32), i32(N), i32(R)),
    )
    return None
