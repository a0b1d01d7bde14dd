"""The torch twins (kernels/reference.py) against plain float64 loops written here.

The twins are what CI runs and what the CuPy kernels are checked against on a GPU, so they
are anchored to an independent, obviously-correct implementation: explicit Python loops
over sequences, heads and tokens in float64.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from modeldeploy.kernels import dispatch, reference


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    assert torch.isfinite(a).all(), "non-finite output"
    return float((a - ref).norm() / ref.norm().clamp_min(1e-30))


TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


# ---- float64 oracles -----------------------------------------------------------------
def rms_norm64(x, w, eps, residual=None):
    h = x.double() + (residual.double() if residual is not None else 0)
    out = torch.empty_like(h)
    for r in range(h.shape[0]):
        row = h[r]
        out[r] = row / math.sqrt(float((row * row).sum()) / row.numel() + eps) * w.double()
    return out, h


def rotary64(positions, x, cache):
    x = x.double().clone()
    half = cache.shape[1] // 2
    for t in range(x.shape[0]):
        c = cache[positions[t], :half].double()
        s = cache[positions[t], half:].double()
        for h in range(x.shape[1]):
            x1, x2 = x[t, h, :half].clone(), x[t, h, half:].clone()
            x[t, h, :half] = x1 * c - x2 * s
            x[t, h, half:] = x2 * c + x1 * s
    return x


def attend64(q, keys, values, scale):
    """q [D], keys/values [L, D] -> softmax(q.k * scale) @ v, all float64."""
    scores = [float(q @ keys[j]) * scale for j in range(keys.shape[0])]
    m = max(scores)
    w = [math.exp(s - m) for s in scores]
    total = sum(w)
    return sum(wj / total * values[j] for j, wj in enumerate(w))


def token_kv(cache, table, t):
    """Cached row [Hkv, D] of token t through the block table."""
    S = cache.shape[1]
    return cache[int(table[t // S]), t % S].double()


def decode64(q, k_cache, v_cache, tables, lens, scale):
    B, H, D = q.shape
    group = H // k_cache.shape[2]
    out = torch.zeros(B, H, D, dtype=torch.float64)
    for b in range(B):
        L = int(lens[b])
        ks = torch.stack([token_kv(k_cache, tables[b], t) for t in range(L)])
        vs = torch.stack([token_kv(v_cache, tables[b], t) for t in range(L)])
        for h in range(H):
            out[b, h] = attend64(q[b, h].double(), ks[:, h // group], vs[:, h // group], scale)
    return out


def prefill64(q, k_cache, v_cache, tables, cu, lens, scale):
    T, H, D = q.shape
    group = H // k_cache.shape[2]
    out = torch.zeros(T, H, D, dtype=torch.float64)
    for b in range(len(lens)):
        s, e, L = int(cu[b]), int(cu[b + 1]), int(lens[b])
        ks = torch.stack([token_kv(k_cache, tables[b], t) for t in range(L)])
        vs = torch.stack([token_kv(v_cache, tables[b], t) for t in range(L)])
        for i in range(s, e):
            pos = L - (e - i)  # this query's own position: sees keys 0..pos
            for h in range(H):
                out[i, h] = attend64(
                    q[i, h].double(), ks[: pos + 1, h // group], vs[: pos + 1, h // group], scale
                )
    return out


# ---- random paged-cache problems -----------------------------------------------------
def paged_problem(lens, hkv, group, d, block_size, dtype, gen, spare_blocks=5):
    """Caches with random content, block tables that point at shuffled, non-contiguous
    blocks (padding entries -1), context lengths `lens`."""
    per_seq = [-(-L // block_size) for L in lens]
    n_blocks = sum(per_seq) + spare_blocks
    perm = torch.randperm(n_blocks, generator=gen)
    M = max(per_seq) + 1
    tables = torch.full((len(lens), M), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(per_seq):
        tables[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    k_cache = torch.randn(n_blocks, block_size, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(n_blocks, block_size, hkv, d, generator=gen).to(dtype)
    return k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


# ---- tests ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (7, 96), (16, 1024)])
def test_rms_norm(dtype, with_residual, rows, hidden):
    gen = torch.Generator().manual_seed(rows * hidden + with_residual)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    res = torch.randn(rows, hidden, generator=gen).to(dtype) if with_residual else None
    out, new_res = reference.rms_norm(x, w, 1e-5, res)
    exp_out, exp_res = rms_norm64(x, w, 1e-5, res)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, exp_out) < TOL[dtype]
    if with_residual:
        assert rel_err(new_res, exp_res) < TOL[dtype]
    else:
        assert new_res is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,hq,hk,d", [(1, 4, 4, 64), (5, 8, 2, 128), (9, 6, 3, 32)])
def test_rotary_in_place(dtype, T, hq, hk, d):
    gen = torch.Generator().manual_seed(T * hq * d)
    max_pos = 64
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    cache = torch.cat([ang.cos(), ang.sin()], dim=-1).float()
    positions = torch.randint(0, max_pos, (T,), generator=gen)
    q = torch.randn(T, hq, d, generator=gen).to(dtype)
    k = torch.randn(T, hk, d, generator=gen).to(dtype)
    q_exp, k_exp = rotary64(positions, q, cache), rotary64(positions, k, cache)
    q_ptr = q.data_ptr()
    assert reference.rotary_embedding(positions, q, k, cache) is None
    assert q.data_ptr() == q_ptr  # really in place
    assert rel_err(q, q_exp) < TOL[dtype] and rel_err(k, k_exp) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,inter", [(1, 8), (13, 344)])
def test_silu_and_mul(dtype, rows, inter):
    gen = torch.Generator().manual_seed(rows + inter)
    x = (3 * torch.randn(rows, 2 * inter, generator=gen)).to(dtype)
    g, u = x[:, :inter].double(), x[:, inter:].double()
    expected = g / (1 + torch.exp(-g)) * u
    out = reference.silu_and_mul(x)
    assert out.shape == (rows, inter) and out.dtype == dtype
    assert rel_err(out, expected) < TOL[dtype]


@pytest.mark.parametrize("T,hkv,d,block_size", [(1, 1, 64, 16), (11, 2, 128, 16), (20, 4, 32, 8)])
def test_write_kv_scatters_and_skips(T, hkv, d, block_size):
    gen = torch.Generator().manual_seed(T)
    n_blocks = 6
    k_cache = torch.randn(n_blocks, block_size, hkv, d, generator=gen)
    v_cache = torch.randn(n_blocks, block_size, hkv, d, generator=gen)
    k0, v0 = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(n_blocks * block_size, generator=gen)[:T]
    slots[1::3] = -1  # padding tokens
    k = torch.randn(T, hkv, d, generator=gen)
    v = torch.randn(T, hkv, d, generator=gen)
    reference.write_kv(k, v, k_cache, v_cache, slots)
    exp_k, exp_v = k0.clone(), v0.clone()
    for t in range(T):
        s = int(slots[t])
        if s >= 0:
            exp_k[s // block_size, s % block_size] = k[t]
            exp_v[s // block_size, s % block_size] = v[t]
    assert torch.equal(k_cache, exp_k) and torch.equal(v_cache, exp_v)
    assert not torch.equal(k_cache, k0)  # something was written
    assert T == 1 or (slots == -1).any()  # and something skipped


DECODE_CASES = [  # lens, hkv, group, d, block_size
    ([1], 1, 1, 64, 16),
    ([17, 3, 40], 2, 4, 64, 16),
    ([33, 64, 1, 100], 4, 2, 128, 16),
    ([5, 50], 1, 8, 32, 8),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens,hkv,group,d,block_size", DECODE_CASES)
def test_paged_attention_decode(dtype, lens, hkv, group, d, block_size):
    gen = torch.Generator().manual_seed(sum(lens) * group + d)
    k_cache, v_cache, tables, ctx = paged_problem(lens, hkv, group, d, block_size, dtype, gen)
    q = torch.randn(len(lens), hkv * group, d, generator=gen).to(dtype)
    scale = d**-0.5
    out = reference.paged_attention_decode(q, k_cache, v_cache, tables, ctx, scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, decode64(q, k_cache, v_cache, tables, ctx, scale)) < TOL[dtype]


PREFILL_CASES = [  # lens, new tokens per sequence, hkv, group, d, block_size
    ([5], [5], 1, 1, 64, 16),  # plain prompt, no cached prefix
    ([20, 37, 3], [4, 37, 1], 2, 4, 64, 16),  # prefix + chunk, full prompt, decode-like
    ([40, 18], [0, 18], 2, 2, 128, 16),  # a sequence with no new tokens
    ([23, 9], [7, 9], 1, 8, 32, 8),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens,new,hkv,group,d,block_size", PREFILL_CASES)
def test_paged_attention_prefill(dtype, lens, new, hkv, group, d, block_size):
    gen = torch.Generator().manual_seed(sum(lens) + sum(new) * group + d)
    k_cache, v_cache, tables, ctx = paged_problem(lens, hkv, group, d, block_size, dtype, gen)
    cu = torch.tensor([0] + list(torch.tensor(new).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hkv * group, d, generator=gen).to(dtype)
    scale = d**-0.5
    out = reference.paged_attention_prefill(q, k_cache, v_cache, tables, cu, ctx, scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, prefill64(q, k_cache, v_cache, tables, cu, ctx, scale)) < TOL[dtype]


def test_prefill_last_token_equals_decode():
    """The last new token of a prompt sees the whole context: same result as decode."""
    gen = torch.Generator().manual_seed(7)
    lens = [19, 33]
    k_cache, v_cache, tables, ctx = paged_problem(lens, 2, 4, 64, 16, torch.float32, gen)
    cu = torch.tensor([0, 19, 52], dtype=torch.int32)
    q = torch.randn(52, 8, 64, generator=gen)
    pre = reference.paged_attention_prefill(q, k_cache, v_cache, tables, cu, ctx, 0.125)
    dec = reference.paged_attention_decode(q[[18, 51]], k_cache, v_cache, tables, ctx, 0.125)
    torch.testing.assert_close(pre[[18, 51]], dec, rtol=1e-5, atol=1e-6)


def test_dispatch_uses_twins_on_cpu():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 16, generator=gen)
    w = torch.randn(16, generator=gen)
    torch.testing.assert_close(  # the C++ RMSNorm when built (its own tests below), else the twin
        dispatch.rms_norm(x, w, 1e-6)[0], reference.rms_norm(x, w, 1e-6)[0], rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(  # likewise the C++ SiLU-and-mul (exp within 2 ulp of torch's)
        dispatch.silu_and_mul(x), reference.silu_and_mul(x), rtol=1e-6, atol=1e-6
    )


# ---- the CPU in-place kernel (kernels/cpu_attention.py) against the oracles and the twins ----
from modeldeploy.kernels import cpu_attention  # noqa: E402

needs_cpp = pytest.mark.skipif(
    not cpu_attention.available(), reason=f"CPU kernel not built: {cpu_attention._why}"
)


def test_cpu_kernel_builds_where_a_compiler_exists():
    """A broken build must not pass silently as 'the fallback equals the reference'."""
    if cpu_attention._compiler() is None:
        pytest.skip("no C++ compiler")
    if os.environ.get(cpu_attention.ENV_SWITCH) == "0":
        pytest.skip(f"{cpu_attention.ENV_SWITCH}=0")
    assert cpu_attention.available(), cpu_attention._why
    assert cpu_attention.path_in_use() == "cpp"


CPU_DECODE_CASES = DECODE_CASES + [  # ragged, partial last blocks, GQA 3, head dims 40 / 256
    ([16, 31, 1, 257, 100, 64, 2], 2, 3, 64, 16),
    ([9, 70], 2, 4, 40, 16),
    ([130], 1, 2, 256, 32),
]


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens,hkv,group,d,block_size", CPU_DECODE_CASES)
def test_cpu_kernel_decode(dtype, lens, hkv, group, d, block_size):
    gen = torch.Generator().manual_seed(sum(lens) * group + d + 1)
    k_cache, v_cache, tables, ctx = paged_problem(lens, hkv, group, d, block_size, dtype, gen)
    q = torch.randn(len(lens), hkv * group, d, generator=gen).to(dtype)
    scale = d**-0.5
    out = cpu_attention.paged_attention_decode(q, k_cache, v_cache, tables, ctx, scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, decode64(q, k_cache, v_cache, tables, ctx, scale)) < TOL[dtype]
    ref = reference.paged_attention_decode(q, k_cache, v_cache, tables, ctx, scale)
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@needs_cpp
def test_cpu_kernel_decode_softmax_over_a_wide_score_range():
    """Scores spread over hundreds (most exps far below ln(FLT_MIN), a few near the max): the
    vectorised exp's clamping must neither blow up nor lose the dominant keys."""
    gen = torch.Generator().manual_seed(7)
    lens = [1, 9, 200, 333]
    k_cache, v_cache, tables, ctx = paged_problem(lens, 2, 3, 64, 16, torch.float32, gen)
    q = 40 * torch.randn(len(lens), 6, 64, generator=gen)
    out = cpu_attention.paged_attention_decode(q, k_cache, v_cache, tables, ctx, 0.125)
    exact = decode64(q, k_cache, v_cache, tables, ctx, 0.125)
    assert rel_err(out, exact) < 1e-5
    # float32 scores of this size carry ~1e-5 absolute rounding into exp, in the twin too: the
    # kernel must be as close to float64 as the twin is, not equal to it
    ref = reference.paged_attention_decode(q, k_cache, v_cache, tables, ctx, 0.125)
    worst, worst_ref = (out.double() - exact).abs().max(), (ref.double() - exact).abs().max()
    assert worst <= 2 * worst_ref + 1e-6, (worst, worst_ref)
    q[2, 4, 0] = float("nan")  # a broken model's NaN surfaces in its row, never as a finite answer
    out = cpu_attention.paged_attention_decode(q, k_cache, v_cache, tables, ctx, 0.125)
    assert torch.isnan(out[2, 4]).all()
    assert torch.isfinite(out[2, [0, 1, 2, 3, 5]]).all() and torch.isfinite(out[[0, 1, 3]]).all()


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,inter", [(1, 8), (13, 344), (3, 13), (70, 768)])
def test_cpu_kernel_silu_and_mul_matches_the_oracle_and_the_twin(dtype, rows, inter):
    """Rows as a view with a wider stride; gates out to +-100 (exp's clamped lanes); 13 exercises
    the scalar tail, 70 x 768 the threaded path."""
    gen = torch.Generator().manual_seed(rows * inter)
    wide = (4 * torch.randn(rows, 2 * inter + 8, generator=gen)).to(dtype)
    wide[0, :4] = torch.tensor([-100.0, 100.0, -88.5, 88.5]).to(dtype)
    x = wide[:, : 2 * inter]
    out = cpu_attention.silu_and_mul(x)
    assert out.shape == (rows, inter) and out.dtype == dtype
    g, u = x[:, :inter].double(), x[:, inter:].double()
    assert rel_err(out, g / (1 + torch.exp(-g)) * u) < TOL[dtype]
    ref = reference.silu_and_mul(x)
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    else:  # one bfloat16 rounding apart at most
        torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
    assert dispatch._impl("silu_and_mul", x) is cpu_attention.silu_and_mul
    x = x.clone()
    x[-1, 0] = float("nan")  # NaN in, NaN out (exp's clamping must not turn it into a number)
    assert torch.isnan(cpu_attention.silu_and_mul(x)[-1, 0])
    h = torch.randn(3, 16, generator=gen).half()  # float16: the twin's
    assert torch.equal(cpu_attention.silu_and_mul(h), reference.silu_and_mul(h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,hkv,group,d", [(1, 1, 1, 64), (37, 2, 4, 64), (300, 3, 3, 64), (9, 1, 8, 32)])
def test_causal_attention_of_a_fresh_prompt_equals_the_paged_prefill(dtype, T, hkv, group, d):
    """The fresh-prompt path (SDPA over the new K/V) attends to exactly what the paged prefill does
    when nothing is cached before the prompt: same result as the float64 oracle over the pages."""
    gen = torch.Generator().manual_seed(T * group + d)
    k_cache, v_cache, tables, ctx = paged_problem([T], hkv, group, d, 16, dtype, gen)
    slots = torch.tensor([int(tables[0, i // 16]) * 16 + i % 16 for i in range(T)])  # the prompt's own K/V
    k, v = k_cache.view(-1, hkv, d)[slots], v_cache.view(-1, hkv, d)[slots]
    q = torch.randn(T, hkv * group, d, generator=gen).to(dtype)
    cu = torch.tensor([0, T], dtype=torch.int32)
    out = dispatch.causal_attention(q, k, v, d**-0.5)
    assert out.dtype == dtype and out.shape == q.shape
    assert rel_err(out, prefill64(q, k_cache, v_cache, tables, cu, ctx, d**-0.5)) < TOL[dtype]
    into = torch.empty_like(q)
    assert dispatch.causal_attention(q, k, v, d**-0.5, out=into) is into and torch.equal(into, out)


CPU_PREFILL_CASES = PREFILL_CASES + [
    ([100, 45, 16, 300], [30, 45, 3, 17], 2, 3, 64, 16),  # cached prefixes, partial last blocks
    ([77], [77], 4, 1, 128, 16),  # fresh prompt longer than a query tile, MHA
    ([33, 250], [1, 250], 1, 4, 64, 32),
]


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens,new,hkv,group,d,block_size", CPU_PREFILL_CASES)
def test_cpu_kernel_prefill(dtype, lens, new, hkv, group, d, block_size):
    gen = torch.Generator().manual_seed(sum(lens) + sum(new) * group + d + 1)
    k_cache, v_cache, tables, ctx = paged_problem(lens, hkv, group, d, block_size, dtype, gen)
    cu = torch.tensor([0] + list(torch.tensor(new).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hkv * group, d, generator=gen).to(dtype)
    scale = d**-0.5
    out = cpu_attention.paged_attention_prefill(q, k_cache, v_cache, tables, cu, ctx, scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, prefill64(q, k_cache, v_cache, tables, cu, ctx, scale)) < TOL[dtype]
    ref = reference.paged_attention_prefill(q, k_cache, v_cache, tables, cu, ctx, scale)
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


LANE_CASES = [  # lens, new, hkv, group, d, block_size: tiles of 48+ rows take the lanes form
    ([300], [300], 3, 3, 64, 16),  # SmolLM2's heads, a fresh prompt
    ([1000, 70], [200, 70], 2, 4, 128, 32),  # cached prefix + chunk, D 128
    ([97, 40], [97, 9], 1, 8, 32, 8),  # D 32, small blocks, a short chunk on the dot form
    ([130], [130], 2, 1, 64, 64),  # MHA: 48-token tiles, 64-key blocks
]


def test_each_x86_level_attends_a_prefill_like_the_twin(tmp_path):
    """The prefill's float32 tiles run with query rows along the vector lanes, 16 with AVX-512,
    8 with AVX2 and the portable build: every level this CPU runs is built and checked against
    float64, on both forms (a tile's last few tokens and decode's rows keep the dot form)."""
    import ctypes
    import platform

    from modeldeploy.kernels import cpu_build

    if cpu_build.compiler() is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs a C++ compiler on x86-64")
    levels = cpu_build.levels_of(cpu_build.cpu_flags())
    built = cpu_build.build_prebuilt(tmp_path, levels, (cpu_build.SOURCE,))
    for level, path in zip(levels, built, strict=True):
        lib = ctypes.CDLL(str(path))
        argtypes, _ = cpu_attention._signatures()["md_paged_prefill"]
        lib.md_paged_prefill.argtypes = argtypes
        lib.md_paged_prefill.restype = None
        for lens, new, hkv, group, d, block_size in LANE_CASES:
            gen = torch.Generator().manual_seed(sum(lens) + d)
            k_cache, v_cache, tables, ctx = paged_problem(lens, hkv, group, d, block_size, torch.float32, gen)
            tables = tables.clamp_min(0).to(torch.int32)
            cu = torch.tensor([0] + list(torch.tensor(new).cumsum(0)), dtype=torch.int32)
            q = torch.randn(int(cu[-1]), hkv * group, d, generator=gen)
            out = torch.full_like(q, float("nan"))
            tile = cpu_attention.prefill_tile(group, torch.float32)
            assert tile * group >= 32, (tile, group)  # the lanes form at 16 lanes too
            lib.md_paged_prefill(
                0, q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                tables.data_ptr(), tables.stride(0), cu.data_ptr(), ctx.to(torch.int32).data_ptr(),
                out.data_ptr(), len(lens), hkv * group, hkv, d, block_size, tile, d**-0.5, 2,
            )  # fmt: skip
            exact = prefill64(q, k_cache, v_cache, tables, cu, ctx, d**-0.5)
            assert rel_err(out, exact) < TOL[torch.float32], (level, lens, new, d)


@needs_cpp
def test_cpu_kernel_random_tables_strided_q_and_int64_metadata():
    """Engine-like inputs: q a view of a wider tensor (token stride > H*D), int64 tables and
    lengths, padding entries pointing anywhere (0), many sequences of random lengths."""
    gen = torch.Generator().manual_seed(11)
    lens = torch.randint(1, 200, (23,), generator=gen).tolist()
    k_cache, v_cache, tables, ctx = paged_problem(lens, 2, 3, 64, 16, torch.float32, gen)
    tables = tables.clamp_min(0).long()
    wide = torch.randn(len(lens), 10 * 64, generator=gen)
    q = wide[:, : 6 * 64].view(len(lens), 6, 64)
    assert not q.is_contiguous()
    out = cpu_attention.paged_attention_decode(q, k_cache, v_cache, tables, ctx.long(), 0.125)
    ref = reference.paged_attention_decode(q, k_cache, v_cache, tables, ctx, 0.125)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    # the same sequences as a prefill of their last 5 tokens each (prefix cached)
    new = [min(5, L) for L in lens]
    cu = torch.tensor([0] + list(torch.tensor(new).cumsum(0)))
    qp = torch.randn(int(cu[-1]), 6, 64, generator=gen)
    out = cpu_attention.paged_attention_prefill(qp, k_cache, v_cache, tables, cu, ctx.long(), 0.125)
    ref = reference.paged_attention_prefill(qp, k_cache, v_cache, tables, cu, ctx, 0.125)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_cpu_kernel_falls_back_without_a_compiler(monkeypatch, caplog):
    """No compiler (the slim runtime image): the twins, and a log line saying so."""
    monkeypatch.setattr(cpu_attention, "_state", "unloaded")
    monkeypatch.setattr(cpu_attention, "_lib", None)
    monkeypatch.setattr(cpu_attention, "_compiler", lambda: None)
    monkeypatch.setattr(dispatch, "_cpu_checked", False)
    monkeypatch.setattr(dispatch, "_CPU", {})
    with caplog.at_level("WARNING", logger="modeldeploy.kernels"):
        assert not cpu_attention.available()
    assert "torch reference twins" in caplog.text and "no C++ compiler" in caplog.text
    assert dispatch._impl("paged_attention_decode", torch.zeros(1)) is reference.paged_attention_decode
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache, tables, ctx = paged_problem([20, 3], 2, 2, 64, 16, torch.float32, gen)
    q = torch.randn(2, 4, 64, generator=gen)
    out = cpu_attention.paged_attention_decode(q, k_cache, v_cache, tables, ctx, 0.125)
    ref = reference.paged_attention_decode(q, k_cache, v_cache, tables, ctx, 0.125)
    assert torch.equal(out, ref)


def test_prebuilt_kernel_loads_without_a_compiler(monkeypatch, tmp_path, caplog):
    """The runtime image: objects prebuilt per x86-64 level (kernels/cpu_build.py), no compiler at
    run time; the best level for this CPU is loaded (with the libgomp shipped beside it) and agrees
    with the oracle; /v1/bundle's description says prebuilt."""
    from modeldeploy.kernels import cpu_build

    if cpu_build.compiler() is None:
        pytest.skip("no C++ compiler to prebuild with")
    levels = cpu_build.levels_of(cpu_build.cpu_flags())
    if not levels:
        pytest.skip("not an x86-64 CPU: no prebuilt levels")
    built = cpu_build.build_prebuilt(tmp_path, levels[:1])
    assert [b.name for b in built] == [cpu_build.prebuilt_name(levels[0])]
    assert (tmp_path / "libgomp.so.1").is_file()
    assert all(
        b.stat().st_mode & 0o005 == 0o005 for b in built
    )  # loadable by any user (the image's is not root)
    monkeypatch.setenv(cpu_build.ENV_PREBUILT, str(tmp_path))
    monkeypatch.delenv(cpu_attention.ENV_SWITCH, raising=False)
    monkeypatch.setattr(cpu_attention, "_state", "unloaded")
    monkeypatch.setattr(cpu_attention, "_lib", None)
    monkeypatch.setattr(cpu_attention, "_compiler", lambda: None)
    with caplog.at_level("INFO", logger="modeldeploy.kernels"):
        assert cpu_attention.available(), cpu_attention._why
    assert f"prebuilt {levels[0]}" in caplog.text
    assert dispatch.describe("cpu")["attention"] == {"path": "cpp", "origin": f"prebuilt {levels[0]}"}
    gen = torch.Generator().manual_seed(11)
    k_cache, v_cache, tables, ctx = paged_problem([40, 7, 130], 2, 2, 64, 16, torch.float32, gen)
    q = torch.randn(3, 4, 64, generator=gen)
    out = cpu_attention.paged_attention_decode(q, k_cache, v_cache, tables, ctx, 0.125)
    assert rel_err(out, decode64(q, k_cache, v_cache, tables, ctx, 0.125)) < TOL[torch.float32]


def test_prebuilt_objects_of_other_source_or_a_higher_level_are_not_picked(tmp_path):
    from modeldeploy.kernels import cpu_build

    v3 = "flags : " + " ".join(cpu_build._LEVEL_NEEDS["x86-64-v3"])
    if cpu_build.levels_of(v3) != ["x86-64-v3", "x86-64-v2"]:
        pytest.skip("not an x86-64 machine")
    assert cpu_build.levels_of("flags : sse2") == []
    (tmp_path / cpu_build.prebuilt_name("x86-64-v4")).write_bytes(b"")
    (tmp_path / "paged_attention_0000000000000000_x86-64-v3.so").write_bytes(b"")  # other source
    assert cpu_build.find_prebuilt(tmp_path, v3) is None  # v4 needs AVX-512; v3's is stale
    (tmp_path / cpu_build.prebuilt_name("x86-64-v2")).write_bytes(b"")
    assert cpu_build.find_prebuilt(tmp_path, v3) == (
        tmp_path / cpu_build.prebuilt_name("x86-64-v2"),
        "x86-64-v2",
    )


def test_cpu_kernel_unsupported_layouts_use_the_twin():
    """Head dims not a multiple of 8 and float16 go to the twin (same results either way)."""
    gen = torch.Generator().manual_seed(6)
    for d, dtype in ((36, torch.float32), (64, torch.float16)):
        k_cache, v_cache, tables, ctx = paged_problem([20, 3], 1, 2, d, 16, dtype, gen)
        q = torch.randn(2, 2, d, generator=gen).to(dtype)
        out = cpu_attention.paged_attention_decode(q, k_cache, v_cache, tables, ctx, 0.125)
        ref = reference.paged_attention_decode(q, k_cache, v_cache, tables, ctx, 0.125)
        assert torch.equal(out, ref)


@needs_cpp
def test_dispatch_uses_the_cpu_kernel_for_attention():
    q = torch.zeros(1, 2, 64)
    assert dispatch._impl("paged_attention_decode", q) is cpu_attention.paged_attention_decode
    assert dispatch._impl("paged_attention_prefill", q) is cpu_attention.paged_attention_prefill


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_kernel_write_kv_equals_twin(dtype):
    """k and v as views of a fused qkv row (token stride > Hkv*D), -1 slots skipped."""
    gen = torch.Generator().manual_seed(9)
    T, hkv, d, n_blocks, S = 13, 2, 64, 7, 16
    qkv = torch.randn(T, (4 + 2 * hkv) * d, generator=gen).to(dtype)
    _, k, v = qkv.split([4 * d, hkv * d, hkv * d], dim=-1)
    k, v = k.reshape(T, hkv, d), v.reshape(T, hkv, d)
    assert not k.is_contiguous()
    slots = torch.randperm(n_blocks * S, generator=gen)[:T]
    slots[2::4] = -1
    caches = [torch.randn(n_blocks, S, hkv, d, generator=gen).to(dtype) for _ in range(2)]
    ref = [c.clone() for c in caches]
    assert cpu_attention.write_kv(k, v, caches[0], caches[1], slots) is None
    reference.write_kv(k, v, ref[0], ref[1], slots)
    assert torch.equal(caches[0], ref[0]) and torch.equal(caches[1], ref[1])
    assert dispatch._impl("write_kv", k) is cpu_attention.write_kv
    with pytest.raises(IndexError):
        cpu_attention.write_kv(k, v, caches[0], caches[1], torch.full((T,), n_blocks * S))


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,hq,hk,d", [(1, 4, 4, 64), (5, 8, 2, 128), (9, 6, 3, 32), (7, 6, 2, 40)])
def test_cpu_kernel_rotary_equals_twin_bit_for_bit(dtype, T, hq, hk, d):
    """Same roundings as the twin: equal, not close (greedy equality with transformers rests on it)."""
    gen = torch.Generator().manual_seed(T * hq * d + 1)
    max_pos = 64
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    cache = torch.cat([ang.cos(), ang.sin()], dim=-1).float()
    positions = torch.randint(0, max_pos, (T,), generator=gen)
    qkv = torch.randn(T, (hq + 2 * hk) * d, generator=gen).to(dtype)
    q = qkv[:, : hq * d].reshape(T, hq, d)  # a view: token stride wider than H*D
    k = torch.randn(T, hk, d, generator=gen).to(dtype)
    q_ref, k_ref = q.clone(), k.clone()
    reference.rotary_embedding(positions, q_ref, k_ref, cache)
    assert cpu_attention.rotary_embedding(positions, q, k, cache) is None
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    assert dispatch._impl("rotary_embedding", q) is cpu_attention.rotary_embedding
    with pytest.raises(IndexError):
        cpu_attention.rotary_embedding(torch.full((T,), max_pos), q, k, cache)


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "T,E,with_residual", [(1, 384, True), (37, 576, True), (300, 512, False), (5, 20, True)]
)
def test_cpu_kernel_rms_norm_matches_the_oracle_and_the_twin(dtype, T, E, with_residual):
    """x as a view with a wider row stride; the new residual is the rounded sum, bit-equal to the
    twin's; the output within the dtype's tolerance of float64 and close to the twin (the sum of
    squares is reduced in another order). 300 x 512 takes the threaded path."""
    gen = torch.Generator().manual_seed(T * E)
    wide = torch.randn(T, E + 16, generator=gen).to(dtype)
    x = wide[:, :E]
    assert T == 1 or not x.is_contiguous()  # one row is contiguous whatever its stride
    res = torch.randn(T, E, generator=gen).to(dtype) if with_residual else None
    w = (1 + 0.1 * torch.randn(E, generator=gen)).to(dtype)
    out, new = cpu_attention.rms_norm(x, w, 1e-6, res)
    ref_out, ref_new = reference.rms_norm(x, w, 1e-6, res)
    o64, h64 = rms_norm64(x, w, 1e-6, res)
    assert rel_err(out, o64) < TOL[dtype]
    assert rel_err(out, ref_out) < TOL[dtype]
    if dtype == torch.float32:
        assert (out - ref_out).abs().max() < 1e-5
    if with_residual:
        assert torch.equal(new, ref_new)
        assert rel_err(new, h64) < TOL[dtype]
    else:
        assert new is None
    assert dispatch._impl("rms_norm", x) is cpu_attention.rms_norm


@needs_cpp
def test_cpu_kernel_rms_norm_hands_other_layouts_to_the_twin():
    """q/k norm's [T, H, D] heads and float16 are not the kernel's: the twin answers, same result."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(4, 6, 64, generator=gen)
    w = torch.rand(64, generator=gen) + 0.5
    out, _ = cpu_attention.rms_norm(q, w, 1e-6)
    assert torch.equal(out, reference.rms_norm(q, w, 1e-6)[0])
    h = torch.randn(3, 64, generator=gen).half()
    out16, _ = cpu_attention.rms_norm(h, w.half(), 1e-6)
    assert torch.equal(out16, reference.rms_norm(h, w.half(), 1e-6)[0])


# ---- CPU linear layers through oneDNN with packed weights (kernels/cpu_gemm.py) ----
from modeldeploy.kernels import cpu_gemm  # noqa: E402


@pytest.fixture
def packing(monkeypatch):
    """oneDNN packing on whatever CPU this is (MODELDEPLOY_CPU_GEMM=1), decided afresh."""
    if cpu_gemm.onednn_missing():
        pytest.skip(cpu_gemm.onednn_missing())
    monkeypatch.setenv(cpu_gemm.ENV_SWITCH, "1")
    monkeypatch.setattr(cpu_gemm, "_state", None)
    yield
    monkeypatch.setattr(cpu_gemm, "_state", None)


@pytest.mark.parametrize("rows", [1, 3, 64, 333])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_float64_like_blas(rows, with_bias, packing):
    """One packing serves every row count (decode batches, prefill chunks); the error against
    float64 is of BLAS's size (float32 throughout, only the summation order differs); a strided
    input view (q/k/v split off a wider tensor) works. "BLAS's size" has a floor: where BLAS is
    luckily exact, float32's rounding, sqrt(K) eps times the products' magnitude, still allows
    oneDNN's other order (a CI machine's oneDNN kernel once missed 4x BLAS's error by 7 %)."""
    gen = torch.Generator().manual_seed(rows)
    w = 0.05 * torch.randn(640, 384, generator=gen)
    b = torch.randn(640, generator=gen) if with_bias else None
    packed = cpu_gemm.pack(w)
    assert isinstance(packed, cpu_gemm.PackedLinear) and (packed.out_features, packed.in_features) == (
        640,
        384,
    )
    x = torch.randn(rows, 400, generator=gen)[:, :384]
    exact = x.double() @ w.double().t() + (b.double() if b is not None else 0)
    out = dispatch.linear(x, packed, b)
    blas = torch.nn.functional.linear(x, w, b)
    assert out.shape == (rows, 640) and out.dtype == torch.float32
    magnitude = x.double().abs() @ w.double().abs().t() + (b.double().abs() if b is not None else 0)
    rounding = math.sqrt(w.shape[1]) * torch.finfo(torch.float32).eps * magnitude.max()
    assert (out.double() - exact).abs().max() <= max(4 * (blas.double() - exact).abs().max(), rounding)
    assert rel_err(out, exact) < 1e-6


def test_row_buckets_bound_the_shapes_oneDNN_sees_at_a_sixteenth_of_extra_rows():
    """Decode batches (up to 32 rows) keep their own shape; above, a prefill chunk of any length runs
    at one of 16 buckets per power of two, never more than 1/16 over: every row count a 2048-token
    step budget can make lands on 32 + 16 * 6 shapes, not ~2,080 (each a oneDNN primitive held for
    good: the soak's RSS creep, bench/results/soak.md)."""
    assert [cpu_gemm.padded_rows(r) for r in (1, 7, 32)] == [1, 7, 32]
    seen = set()
    for rows in range(1, 2081):
        p = cpu_gemm.padded_rows(rows)
        assert rows <= p <= rows + rows / 16, rows
        assert cpu_gemm.padded_rows(p) == p, rows  # a bucket is its own bucket
        seen.add(p)
    assert len(seen) <= 32 + 16 * 6 + 2, len(seen)


def test_pack_leaves_other_weights_alone_and_the_switch_turns_it_off(monkeypatch):
    """bfloat16, 1-D and (with MODELDEPLOY_CPU_GEMM=0) every weight stay plain tensors and run
    through F.linear; a wrong input width is an error naming both sizes."""
    gen = torch.Generator().manual_seed(1)
    w16 = torch.randn(8, 16, generator=gen).bfloat16()
    assert cpu_gemm.pack(w16) is w16
    w1 = torch.randn(16, generator=gen)
    assert cpu_gemm.pack(w1) is w1
    assert torch.equal(
        dispatch.linear(torch.ones(2, 16).bfloat16(), w16), torch.ones(2, 16).bfloat16() @ w16.t()
    )
    monkeypatch.setattr(cpu_gemm, "_state", None)
    monkeypatch.setenv(cpu_gemm.ENV_SWITCH, "0")
    w = torch.randn(8, 16, generator=gen)
    assert cpu_gemm.pack(w) is w
    assert cpu_gemm.path_in_use() == "blas (MODELDEPLOY_CPU_GEMM=0)"
    assert dispatch.describe("cpu")["linear"] == "blas (MODELDEPLOY_CPU_GEMM=0)"
    monkeypatch.setattr(cpu_gemm, "_state", None)
    monkeypatch.setenv(cpu_gemm.ENV_SWITCH, "1")
    if cpu_gemm.path_in_use() == "onednn":
        with pytest.raises(ValueError, match="input has 12 features, the weight takes 16"):
            dispatch.linear(torch.ones(2, 12), cpu_gemm.pack(w))
    monkeypatch.setattr(cpu_gemm, "_state", None)


@pytest.mark.parametrize(
    "env, vendor, want",
    [
        (None, "GenuineIntel", "blas (MODELDEPLOY_CPU_GEMM=auto on GenuineIntel: plain weights)"),
        ("auto", "GenuineIntel", "blas (MODELDEPLOY_CPU_GEMM=auto on GenuineIntel: plain weights)"),
        (None, "AuthenticAMD", "onednn"),
        ("1", "GenuineIntel", "onednn"),
        ("0", "AuthenticAMD", "blas (MODELDEPLOY_CPU_GEMM=0)"),
    ],
)
def test_the_float32_path_is_chosen_per_cpu_vendor_unless_the_switch_says(monkeypatch, env, vendor, want):
    """Unset or "auto": plain weights (MKL, the GEMV kernel at decode sizes) on Intel, packed for
    oneDNN elsewhere (bench/results/serving_real_cpu.md has both machines' measurements)."""
    if want == "onednn" and cpu_gemm.onednn_missing():
        want = f"blas ({cpu_gemm.onednn_missing()})"
    monkeypatch.setattr(cpu_gemm, "cpu_vendor", lambda: vendor)
    if env is None:
        monkeypatch.delenv(cpu_gemm.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(cpu_gemm.ENV_SWITCH, env)
    monkeypatch.setattr(cpu_gemm, "_state", None)
    try:
        assert cpu_gemm.path_in_use() == want
        w = torch.randn(8, 32)
        assert isinstance(cpu_gemm.pack(w), cpu_gemm.PackedLinear) == (want == "onednn")
    finally:
        monkeypatch.setattr(cpu_gemm, "_state", None)


def test_a_bad_switch_value_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv(cpu_gemm.ENV_SWITCH, "yes")
    monkeypatch.setattr(cpu_gemm, "_state", None)
    with pytest.raises(ValueError, match=r"MODELDEPLOY_CPU_GEMM='yes': expected one of auto, 1, 0"):
        cpu_gemm.path_in_use()
    monkeypatch.setattr(cpu_gemm, "_state", None)


def test_this_machines_vendor_is_read():
    """The vendor_id line of /proc/cpuinfo on Linux x86; "" where there is none (and then packing)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = (
        [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("vendor_id")]
        if cpuinfo.exists()
        else []
    )
    assert cpu_gemm.cpu_vendor() == (lines[0].split(":", 1)[1].strip() if lines else "")
