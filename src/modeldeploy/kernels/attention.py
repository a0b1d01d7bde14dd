"""Paged attention (decode and prefill) on CUDA (cuda/attention.cu).
Twins: `reference.paged_attention_decode`, `reference.paged_attention_prefill`.

Design: one kernel serves both. A block = (query token, kv head, key partition); the GROUP
query heads sharing a kv head are computed together, so each cached K/V byte is read once
per kv head (GQA). Prefill is the same kernel with a causal key range per query token: the
new tokens' K/V are already in the paged cache, so no separate SDPA path is needed.
Split-K: when (queries x kv heads) cannot fill the GPU (small-batch decode on long
contexts), keys are cut into partitions merged by a second, tiny kernel.
No host sync: the partition count comes from the block-table width, not context_lens.max().
"""

from __future__ import annotations

import math
from functools import cache

import torch

from modeldeploy.kernels import build, reference
from modeldeploy.kernels.launch import dtype_name, f32, i32, i64, launch, ptr

THREADS = 128  # WARPS * 32 in attention.cu
MIN_PARTITION = 128  # keys; below this a partition's fixed cost dominates
# Keys per warp per step. 8 is compiled only for build.ATTN_UNROLL8 (fp16/bf16, d128, group
# 4/8); the GPU check times both, and this module attribute picks (default: build's).
UNROLL = build.ATTN_UNROLL


@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def partitions(base_blocks: int, max_keys: int, sm_count: int) -> tuple[int, int]:
    """(num_partitions, partition_size) so that blocks ~ 2 waves of the GPU."""
    target = 2 * sm_count
    if base_blocks >= target or max_keys <= MIN_PARTITION:
        return 1, max(max_keys, 1)
    p = min(-(-target // base_blocks), -(-max_keys // MIN_PARTITION))
    size = (-(-max_keys // p) + 15) // 16 * 16  # keys per partition, whole cache blocks
    return -(-max_keys // size), size


def _supported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        return False
    h, d, hkv = q.shape[1], q.shape[2], k_cache.shape[2]
    vec_bytes = d // 32 * q.element_size()  # one lane's load: must be aligned
    return (
        dtype_name(q) in build.CTYPES
        and k_cache.dtype == q.dtype == v_cache.dtype
        and d in build.ATTN_HEAD_DIMS
        and k_cache.shape[3] == d
        and h % hkv == 0
        and h // hkv in build.ATTN_GROUPS
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and k_cache.data_ptr() % vec_bytes == 0
        and v_cache.data_ptr() % vec_bytes == 0
    )


def _attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    scale: float,
    out: torch.Tensor | None,
) -> torch.Tensor:
    Q, H, D = q.shape
    _, S, hkv, _ = k_cache.shape
    dt = dtype_name(q)
    if out is None:
        out = torch.empty(Q, H, D, dtype=q.dtype, device=q.device)
    if Q == 0:
        return out
    vec_bytes = D // 32 * q.element_size()
    if not (
        q.stride(2) == 1
        and q.stride(1) == D
        and q.data_ptr() % vec_bytes == 0
        and (q.stride(0) * q.element_size()) % vec_bytes == 0
    ):
        q = q.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    cu = cu_seqlens_q.to(torch.int32).contiguous() if cu_seqlens_q is not None else None
    num_seqs = lens.shape[0]
    P, size = partitions(Q * hkv, tables.shape[1] * S, _sm_count(q.device))
    part_out = part_max = part_sum = None
    if P > 1:
        part_out = torch.empty(Q, H, P, D, dtype=torch.float32, device=q.device)
        part_max = torch.empty(Q, H, P, dtype=torch.float32, device=q.device)
        part_sum = torch.empty(Q, H, P, dtype=torch.float32, device=q.device)
    unroll = UNROLL if (dt, D, H // hkv) in build.ATTN_UNROLL8 else build.ATTN_UNROLL
    launch(
        "attention",
        build.attention_name(dt, D, H // hkv, unroll),
        q.device,
        grid=(Q, hkv, P),
        block=(THREADS,),
        args=(
            ptr(out),
            ptr(part_out),
            ptr(part_max),
            ptr(part_sum),
            ptr(q),
            i64(q.stride(0)),
            ptr(k_cache),
            ptr(v_cache),
            ptr(tables),
            i32(tables.stride(0)),
            ptr(lens),
            ptr(cu),
            i32(num_seqs),
            i32(S),
            i32(size),
            f32(scale * math.log2(math.e)),
        ),
    )
    if P > 1:
        launch(
            "attention",
            build.attention_reduce_name(dt),
            q.device,
            grid=(Q * H,),
            block=(D,),
            args=(ptr(out), ptr(part_out), ptr(part_max), ptr(part_sum), i32(P), i32(D)),
        )
    return out


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`out` [B, H, D] contiguous may be preallocated (tests poison it)."""
    if not _supported(q, k_cache, v_cache):
        return reference.paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale)
    return _attention(q, k_cache, v_cache, block_tables, context_lens, None, scale, out)


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    if not _supported(q, k_cache, v_cache):
        return reference.paged_attention_prefill(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale
        )
    return _attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale, out)
