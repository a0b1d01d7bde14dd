"""Kernel-vs-twin checks on fresh random inputs, shared by the GPU tests
(tests/gpu/test_gpu_kernels.py) and the GPU kernel timings (bench/gpu/kernels.py).

Each `Problem` draws its inputs from a seed, runs the CuPy kernel with every output
poisoned with NaN beforehand, runs the torch twin on clones of the same inputs, and
reports the relative error ||kernel - twin|| / ||twin|| (NaN if anything was left
unwritten). `nbytes` is the least traffic the kernel must move (each input read once,
each output written once): the numerator of its memory roofline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from modeldeploy.kernels import reference

# ||kernel - twin|| / ||twin|| bounds. fp32: reordered sums only; fp16/bf16: the kernels
# reproduce the twins' roundings, so a few ulps (bf16 ulp ~ 0.4%) on a minority of elements.
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
NAN = float("nan")


@dataclass
class Problem:
    kernel: str  # dispatch name
    label: str  # shape summary
    dtype: torch.dtype
    setup: Callable[[int], dict]  # seed -> inputs (on the device)
    # (inputs, check) -> outputs. check=True: poison outputs first, return comparable tensors;
    # check=False: just the call, for timing.
    cuda: Callable[..., list[torch.Tensor]]
    twin: Callable[..., list[torch.Tensor]]
    nbytes: Callable[[dict], int]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return NAN
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def run(p: Problem, seed: int) -> dict:
    """Run one problem: {'kernel', 'label', 'dtype', 'rel_err', 'tol', 'ok'}."""
    inputs = p.setup(seed)
    twin_in = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    got = p.cuda(inputs)
    want = p.twin(twin_in)
    torch.cuda.synchronize()
    err = max(rel_err(g, w) for g, w in zip(got, want, strict=True))
    tol = 0.0 if p.kernel == "write_kv" else TOL[p.dtype]
    return {
        "kernel": p.kernel,
        "label": p.label,
        "dtype": str(p.dtype).removeprefix("torch."),
        "rel_err": err,
        "tol": tol,
        "ok": err == err and err <= tol,
    }


def _gen(seed: int, device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _poison(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, NAN, dtype=dtype, device=device)


# ---- problem families ------------------------------------------------------------------
def rms_norm_problem(rows: int, hidden: int, dtype, residual: bool, device="cuda") -> Problem:
    from modeldeploy.kernels import norm

    def setup(seed):
        g = _gen(seed, device)
        return {
            "x": torch.randn(rows, hidden, generator=g, device=device).to(dtype),
            "w": (1 + 0.1 * torch.randn(hidden, generator=g, device=device)).to(dtype),
            "r": (torch.randn(rows, hidden, generator=g, device=device).to(dtype) if residual else None),
        }

    def cuda(d, check=True):
        out = _poison((rows, hidden), dtype, device) if check else None
        res = _poison((rows, hidden), dtype, device) if residual and check else None
        o, r = norm.rms_norm(d["x"], d["w"], 1e-5, d["r"], out=out, residual_out=res)
        return [o, r] if residual else [o]

    def twin(d, check=True):
        o, r = reference.rms_norm(d["x"], d["w"], 1e-5, d["r"])
        return [o, r] if residual else [o]

    el = torch.tensor([], dtype=dtype).element_size()
    return Problem(
        "rms_norm",
        f"{rows}x{hidden}{'+res' if residual else ''}",
        dtype,
        setup,
        cuda,
        twin,
        lambda d: el * (rows * hidden * (4 if residual else 2) + hidden),
    )


def silu_and_mul_problem(rows: int, inter: int, dtype, device="cuda") -> Problem:
    from modeldeploy.kernels import activation

    def setup(seed):
        return {
            "x": (3 * torch.randn(rows, 2 * inter, generator=_gen(seed, device), device=device)).to(dtype)
        }

    el = torch.tensor([], dtype=dtype).element_size()
    return Problem(
        "silu_and_mul",
        f"{rows}x{inter}",
        dtype,
        setup,
        lambda d, check=True: [
            activation.silu_and_mul(d["x"], out=_poison((rows, inter), dtype, device) if check else None)
        ],
        lambda d, check=True: [reference.silu_and_mul(d["x"])],
        lambda d: el * rows * inter * 3,
    )


def rotary_problem(tokens: int, hq: int, hk: int, head_dim: int, dtype, device="cuda") -> Problem:
    """q and k are views into one qkv buffer, as the engine slices them."""
    from modeldeploy.kernels import rotary

    def setup(seed):
        g = _gen(seed, device)
        inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=device).double() / head_dim))
        ang = torch.arange(8192, device=device).double()[:, None] * inv[None, :]
        qkv = torch.randn(tokens, (hq + 2 * hk) * head_dim, generator=g, device=device).to(dtype)
        return {
            "pos": torch.randint(0, 8192, (tokens,), generator=g, device=device),
            "qkv": qkv,
            "cache": torch.cat([ang.cos(), ang.sin()], -1).float(),
        }

    def split(d):
        q = d["qkv"][:, : hq * head_dim].view(tokens, hq, head_dim)
        k = d["qkv"][:, hq * head_dim : (hq + hk) * head_dim].view(tokens, hk, head_dim)
        return q, k

    def call(fn):
        def f(d, check=True):
            q, k = split(d)
            fn(d["pos"], q, k, d["cache"])
            return [q, k]

        return f

    el = torch.tensor([], dtype=dtype).element_size()
    return Problem(
        "rotary_embedding",
        f"{tokens}t {hq}/{hk}h d{head_dim}",
        dtype,
        setup,
        call(rotary.rotary_embedding),
        call(reference.rotary_embedding),
        lambda d: tokens * ((hq + hk) * head_dim * 2 * el + head_dim * 4 + 8),
    )


def write_kv_problem(tokens: int, hkv: int, head_dim: int, dtype, device="cuda") -> Problem:
    """Caches start as NaN; k/v come from a qkv-like buffer; every 7th slot is -1."""
    from modeldeploy.kernels import cache

    n_blocks, S = tokens // 16 + 8, 16

    def setup(seed):
        g = _gen(seed, device)
        kv = torch.randn(tokens, 2 * hkv * head_dim + 64, generator=g, device=device).to(dtype)
        slots = torch.randperm(n_blocks * S, generator=g, device=device)[:tokens]
        slots[::7] = -1
        return {
            "kv": kv,
            "slots": slots,
            "kc": _poison((n_blocks, S, hkv, head_dim), dtype, device),
            "vc": _poison((n_blocks, S, hkv, head_dim), dtype, device),
        }

    def call(fn):
        def f(d, check=True):
            k = d["kv"][:, : hkv * head_dim].view(tokens, hkv, head_dim)
            v = d["kv"][:, hkv * head_dim : 2 * hkv * head_dim].view(tokens, hkv, head_dim)
            fn(k, v, d["kc"], d["vc"], d["slots"])
            if not check:
                return [d["kc"], d["vc"]]
            # Unwritten slots stay NaN in both: compare NaN-free through nan_to_num.
            return [d["kc"].nan_to_num(7.0), d["vc"].nan_to_num(7.0)]

        return f

    el = torch.tensor([], dtype=dtype).element_size()
    return Problem(
        "write_kv",
        f"{tokens}t {hkv}h d{head_dim}",
        dtype,
        setup,
        call(cache.write_kv),
        call(reference.write_kv),
        lambda d: int((d["slots"] >= 0).sum()) * 4 * hkv * head_dim * el + tokens * 8,
    )


def _paged(lens, hkv, head_dim, dtype, g, device, S=16):
    """Random caches; each sequence's blocks are scattered over a shuffled pool."""
    per_seq = [-(-L // S) for L in lens]
    n_blocks = sum(per_seq) + 4
    perm = torch.randperm(n_blocks, generator=g, device=device).to(torch.int32)
    tables = torch.full((len(lens), max(per_seq)), -1, dtype=torch.int32, device=device)
    used = 0
    for b, n in enumerate(per_seq):
        tables[b, :n] = perm[used : used + n]
        used += n
    kc = torch.randn(n_blocks, S, hkv, head_dim, generator=g, device=device).to(dtype)
    vc = torch.randn(n_blocks, S, hkv, head_dim, generator=g, device=device).to(dtype)
    return kc, vc, tables, torch.tensor(lens, dtype=torch.int32, device=device)


def decode_problem(lens: list[int], hkv: int, group: int, head_dim: int, dtype, device="cuda") -> Problem:
    from modeldeploy.kernels import attention

    H, B = hkv * group, len(lens)

    def setup(seed):
        g = _gen(seed, device)
        kc, vc, tables, ctx = _paged(lens, hkv, head_dim, dtype, g, device)
        return {
            "q": torch.randn(B, H, head_dim, generator=g, device=device).to(dtype),
            "kc": kc,
            "vc": vc,
            "tables": tables,
            "ctx": ctx,
        }

    def args(d):
        return d["q"], d["kc"], d["vc"], d["tables"], d["ctx"], head_dim**-0.5

    el = torch.tensor([], dtype=dtype).element_size()

    def cuda(d, check=True):
        out = _poison((B, H, head_dim), dtype, device) if check else None
        return [attention.paged_attention_decode(*args(d), out=out)]

    return Problem(
        "paged_attention_decode",
        f"B{B} L{max(lens)} {H}/{hkv}h d{head_dim}",
        dtype,
        setup,
        cuda,
        lambda d, check=True: [reference.paged_attention_decode(*args(d))],
        lambda d: el * (sum(lens) * hkv * head_dim * 2 + 2 * B * H * head_dim),
    )


def prefill_problem(
    lens: list[int], new: list[int], hkv: int, group: int, head_dim: int, dtype, device="cuda"
) -> Problem:
    from modeldeploy.kernels import attention

    H, T = hkv * group, sum(new)

    def setup(seed):
        g = _gen(seed, device)
        kc, vc, tables, ctx = _paged(lens, hkv, head_dim, dtype, g, device)
        cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=device)
        return {
            "q": torch.randn(T, H, head_dim, generator=g, device=device).to(dtype),
            "kc": kc,
            "vc": vc,
            "tables": tables,
            "cu": cu,
            "ctx": ctx,
        }

    def args(d):
        return d["q"], d["kc"], d["vc"], d["tables"], d["cu"], d["ctx"], head_dim**-0.5

    el = torch.tensor([], dtype=dtype).element_size()

    def cuda(d, check=True):
        out = _poison((T, H, head_dim), dtype, device) if check else None
        return [attention.paged_attention_prefill(*args(d), out=out)]

    return Problem(
        "paged_attention_prefill",
        f"L{lens} new{new} {H}/{hkv}h d{head_dim}",
        dtype,
        setup,
        cuda,
        lambda d, check=True: [reference.paged_attention_prefill(*args(d))],
        lambda d: el * (sum(lens) * hkv * head_dim * 2 + 2 * T * H * head_dim),
    )


def lora_problem(tokens: int, k: int, n: int, rank: int, slots: int, dtype, device="cuda") -> Problem:
    """Tokens spread over `slots` adapters and the base (-1), in no particular order; `out`
    starts as a random base output (the kernel adds to it, base rows must stay untouched)."""
    from modeldeploy.kernels import lora

    def setup(seed):
        g = _gen(seed, device)
        return {
            "out": torch.randn(tokens, n, generator=g, device=device).to(dtype),
            "x": torch.randn(tokens, k, generator=g, device=device).to(dtype),
            "a": (torch.randn(slots, rank, k, generator=g, device=device) / k**0.5).to(dtype),
            "b": torch.randn(slots, rank, n, generator=g, device=device).to(dtype),
            "scales": 0.5 + torch.rand(slots, generator=g, device=device),
            "slots": torch.randint(-1, slots, (tokens,), generator=g, device=device).to(torch.int32),
        }

    def call(fn):
        def f(d, check=True):
            fn(d["out"], d["x"], d["a"], d["b"], d["scales"], d["slots"])
            return [d["out"]]

        return f

    el = torch.tensor([], dtype=dtype).element_size()
    return Problem(
        "lora_apply",
        f"{tokens}t {k}->{n} r{rank} x{slots}",
        dtype,
        setup,
        call(lora.lora_apply),
        call(reference.lora_apply),
        lambda d: el * (tokens * (k + 2 * n) + slots * rank * (k + n)),
    )


DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def correctness_problems(device: str = "cuda") -> list[Problem]:
    """Several shapes per kernel and dtype, including scalar (unaligned) paths, GQA ratios,
    both head dims, ragged lengths, split-K (small batch, long context) and single-pass."""
    ps: list[Problem] = []
    for dt in DTYPES:
        ps += [
            rms_norm_problem(1, 4096, dt, False, device),
            rms_norm_problem(37, 4096, dt, True, device),
            rms_norm_problem(5, 100, dt, True, device),  # scalar path
            silu_and_mul_problem(3, 14336, dt, device),
            silu_and_mul_problem(17, 100, dt, device),
            rotary_problem(1, 32, 8, 128, dt, device),
            rotary_problem(50, 4, 2, 64, dt, device),
            rotary_problem(7, 3, 1, 36, dt, device),  # scalar path
            write_kv_problem(33, 8, 128, dt, device),
            write_kv_problem(20, 1, 36, dt, device),
            decode_problem([1, 17, 700, 33], 2, 4, 128, dt, device),  # split-K
            decode_problem([5, 200] * 40, 8, 4, 128, dt, device),  # one pass
            decode_problem([300, 64, 999], 1, 8, 64, dt, device),
            decode_problem([40, 16, 3], 4, 1, 64, dt, device),
            decode_problem([2000], 2, 16, 128, dt, device),
            prefill_problem([37, 80, 5], [37, 20, 1], 2, 4, 128, dt, device),
            prefill_problem([600, 50], [0, 50], 4, 2, 64, dt, device),
            prefill_problem([19], [19], 1, 1, 64, dt, device),
            lora_problem(37, 4096, 6144, 48, 3, dt, device),  # fused qkv, rank 16 x 3
            lora_problem(5, 100, 36, 8, 2, dt, device),  # odd sizes
        ]
    return ps


def bench_problems(device: str = "cuda") -> list[Problem]:
    """Llama-3-8B shapes in bf16, each input well past the 50-60 MB L2, for roofline timing."""
    bf = torch.bfloat16
    return [
        rms_norm_problem(16384, 4096, bf, True, device),
        silu_and_mul_problem(16384, 14336, bf, device),
        rotary_problem(65536, 32, 8, 128, bf, device),
        write_kv_problem(65536, 8, 128, bf, device),
        decode_problem([1024] * 64, 8, 4, 128, bf, device),
        decode_problem([4096] * 8, 8, 4, 128, bf, device),
        decode_problem([32768], 8, 4, 128, bf, device),  # split-K
        prefill_problem([1024] * 4, [1024] * 4, 8, 4, 128, bf, device),
        lora_problem(32, 4096, 14336, 16, 4, bf, device),  # mixed decode batch, gate_up-sized
    ]  # compute-bound
