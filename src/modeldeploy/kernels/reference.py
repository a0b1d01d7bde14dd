"""Torch reference twins of the CUDA kernels.

Each function has the exact signature of its CuPy twin in `modeldeploy.kernels`,
runs on any device, and is what CI (no GPU) exercises. Shapes:
  T tokens, B sequences, H query heads, Hkv kv heads, D head dim,
  N blocks, S block size, M max blocks per sequence.
KV cache per layer: k_cache / v_cache [N, S, Hkv, D].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(x + residual) normalised by RMS then scaled; returns (out, new_residual).

    Matches HF LlamaRMSNorm: the statistics are taken in float32 and the result is
    cast back before the weight multiply.
    """
    if residual is not None:
        x = x + residual
        residual = x
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype), residual


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Rotate q [T, H, D] and k [T, Hkv, D] in place (NeoX layout: halves, not pairs).

    cos_sin_cache [max_pos, D] float32 holds cos in [:, :D/2] and sin in [:, D/2:].
    """
    cs = cos_sin_cache[positions]  # [T, D]
    half = cs.shape[-1] // 2
    cos = torch.cat([cs[:, :half], cs[:, :half]], -1).unsqueeze(1)  # [T, 1, D]
    sin = torch.cat([cs[:, half:], cs[:, half:]], -1).unsqueeze(1)
    for t in (q, k):
        cos_t, sin_t = cos.to(t.dtype), sin.to(t.dtype)
        x1, x2 = t[..., :half], t[..., half:]
        rotated = torch.cat([-x2, x1], dim=-1)
        t.copy_(t * cos_t + rotated * sin_t)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] -> silu(x[:, :I]) * x[:, I:]  [T, I]."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter k, v [T, Hkv, D] into the caches at flat slots (block * S + offset); -1 skips."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]


def _blocks(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Contiguous copy [*tables.shape, S, Hkv, D] of the blocks listed in `tables`.

    index_select over whole blocks (one row copy each) rather than advanced indexing on the
    4-D cache: 3-6x faster on CPU (bench/results/paged_attention_cpu.md), same values.
    Padding entries past a sequence's length (-1 in the tests) read block 0; they are masked.
    """
    index = tables.reshape(-1).long().clamp_min(0)
    flat = cache.reshape(cache.shape[0], -1).index_select(0, index)
    return flat.view(*tables.shape, *cache.shape[1:])


def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """Contiguous [length, Hkv, D] copy of one sequence's cached keys or values."""
    blocks = block_table[: (length + cache.shape[1] - 1) // cache.shape[1]]
    return _blocks(cache, blocks).reshape(-1, *cache.shape[2:])[:length]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None
) -> torch.Tensor:
    """q [Q, H, D], k/v [L, Hkv, D], mask [Q, L] (True = attend) -> [Q, H, D].

    torch's fused SDPA in float32 (one pass over K/V; GQA without repeating K/V).
    """
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None],
        k.float().transpose(0, 1)[None],
        v.float().transpose(0, 1)[None],
        attn_mask=None if mask is None else mask[None, None],
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).to(q.dtype)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """A fresh prompt attending causally to itself: q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]
    (float32 math, like the paged twins; GQA without repeating K/V)."""
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None],
        k.float().transpose(0, 1)[None],
        v.float().transpose(0, 1)[None],
        is_causal=True,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).to(q.dtype)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence: q [B, H, D] over its first context_lens[b] cached tokens."""
    B, H, D = q.shape
    if B == 0:
        return torch.empty_like(q)
    S, Hkv = k_cache.shape[1], k_cache.shape[2]
    nblk = (int(context_lens.max()) + S - 1) // S
    tables = block_tables[:, :nblk]
    k = _blocks(k_cache, tables).reshape(B, nblk * S, Hkv, D).transpose(1, 2)  # [B, Hkv, L, D]
    v = _blocks(v_cache, tables).reshape(B, nblk * S, Hkv, D).transpose(1, 2)
    valid = torch.arange(nblk * S, device=q.device)[None, :] < context_lens[:, None]  # [B, L]
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None],
        k.float(),
        v.float(),
        attn_mask=valid[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    return out[:, :, 0].to(q.dtype)  # [B, H, D]


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of new tokens over cached prefix + themselves.

    q [T, H, D] packs the new tokens of B sequences (cu_seqlens_q [B+1]); sequence b's new
    tokens are its last (cu[b+1]-cu[b]) of context_lens[b] tokens, all already in the cache.
    """
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    for b in range(len(lens)):
        s, e, L = cu[b], cu[b + 1], lens[b]
        if e == s:
            continue
        k = _gather(k_cache, block_tables[b], L)
        v = _gather(v_cache, block_tables[b], L)
        qpos = torch.arange(L - (e - s), L, device=q.device)
        mask = torch.arange(L, device=q.device)[None, :] <= qpos[:, None]  # [Q, L]
        out[s:e] = _attend(q[s:e], k, v, scale, mask)
    return out


def lora_apply(
    out: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scales: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Add each token's LoRA delta to `out` in place, grouped by adapter (SGMV: one pair of
    GEMMs per run of consecutive tokens with the same adapter, over those rows only; never one
    pass per adapter over the whole batch). Any order of `slots` is correct; the engine sorts
    rows by adapter so each adapter is one or two runs.

    out [T, N], x [T, K], a [L, R, K] (lora_A per slot), b [L, R, N] (lora_B transposed, per
    slot: the CUDA expand reads it coalesced),
    scales [L] float32, slots [T] int (slot of each token's adapter, -1 = base: no delta).
    Order of operations as peft's Linear: out + (B (A x)) * scale, rounded per op.
    """
    values, counts = torch.unique_consecutive(slots, return_counts=True)
    start = 0
    for s, n in zip(values.tolist(), counts.tolist(), strict=True):
        if s >= 0:
            rows = slice(start, start + n)
            out[rows] += (F.linear(x[rows], a[s]) @ b[s]) * scales[s].to(out.dtype)
        start += n
