"""CPU paged attention: the options for reading the KV blocks, timed against the gather baseline.

Options (each against the same random paged cache, block tables shuffled):
  gather-index   the plain gather: `k_cache[tables]` (aten::index) into a contiguous copy + SDPA
  gather-select  the same copy through `index_select` on a [N, S*Hkv*D] view, then SDPA
                 (what `reference.py` does now: the fallback where no compiler exists)
  cpp-inplace    kernels/cpu_attention.py: the C++/OpenMP kernel walking the block table
  flex           torch FlexAttention (torch.compile, CPU) over the whole cache with a block mask
                 mapping each query to its sequence's pages (decode only; --flex, it compiles)

Timings interleave the options round by round (the machine is shared); each figure is the
median over rounds, and the ratio is the baseline's median over the option's, same run.

    .venv/bin/python bench/paged_attention_cpu.py --threads 2 --rounds 7 --flex \
        --out bench/results/paged_attention_cpu_t2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from modeldeploy.kernels import cpu_attention, reference


def gather_index_decode(q, k_cache, v_cache, block_tables, context_lens, scale):
    """The decode twin before this change (aten::index gather)."""
    B, H, D = q.shape
    S, Hkv = k_cache.shape[1], k_cache.shape[2]
    nblk = (int(context_lens.max()) + S - 1) // S
    tables = block_tables[:, :nblk]
    k = k_cache[tables].reshape(B, nblk * S, Hkv, D).transpose(1, 2)
    v = v_cache[tables].reshape(B, nblk * S, Hkv, D).transpose(1, 2)
    valid = torch.arange(nblk * S)[None, :] < context_lens[:, None]
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None],
        k.float(),
        v.float(),
        attn_mask=valid[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    return out[:, :, 0].to(q.dtype)


def gather_index_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """The prefill twin before this change (per-sequence aten::index gather)."""
    out = torch.empty_like(q)
    cu, lens = cu_seqlens_q.tolist(), context_lens.tolist()
    S = k_cache.shape[1]
    for b in range(len(lens)):
        s, e, L = cu[b], cu[b + 1], lens[b]
        if e == s:
            continue
        blocks = block_tables[b][: (L + S - 1) // S]
        k = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:L]
        v = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:L]
        qpos = torch.arange(L - (e - s), L)
        mask = torch.arange(L)[None, :] <= qpos[:, None]
        out[s:e] = reference._attend(q[s:e], k, v, scale, mask)
    return out


class FlexDecode:
    """FlexAttention over the whole cache as one KV sequence; a mask maps query b to its pages.
    The block mask depends on the block tables, so a real engine rebuilds it every step:
    `mask_s` is that cost, reported apart from the attention time."""

    def __init__(self, q, k_cache, v_cache, tables, lens):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        N, S, Hkv, D = k_cache.shape
        B = q.shape[0]
        owner = torch.full((N,), -1, dtype=torch.int64)
        logical = torch.zeros(N, dtype=torch.int64)
        for b in range(B):
            n = (int(lens[b]) + S - 1) // S
            owner[tables[b, :n].long()] = b
            logical[tables[b, :n].long()] = torch.arange(n)
        lens64 = lens.long()

        def mask_mod(b, h, q_idx, kv_idx):
            blk = kv_idx // S
            return (owner[blk] == q_idx) & (logical[blk] * S + kv_idx % S < lens64[q_idx])

        t = time.perf_counter()
        self.block_mask = create_block_mask(mask_mod, 1, None, B, N * S, device="cpu")
        self.mask_s = time.perf_counter() - t
        self.k = k_cache.view(1, N * S, Hkv, D).transpose(1, 2)
        self.v = v_cache.view(1, N * S, Hkv, D).transpose(1, 2)
        self.fn = torch.compile(flex_attention, dynamic=False)
        t = time.perf_counter()
        self(q, None, None, None, None, 0.125)
        self.compile_s = time.perf_counter() - t

    def __call__(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        Q = q.unsqueeze(0).transpose(1, 2)
        out = self.fn(Q, self.k, self.v, block_mask=self.block_mask, scale=scale, enable_gqa=True)
        return out[0].transpose(0, 1)


def paged_problem(lens, new, hkv, group, d, block_size, gen, spare=64):
    per_seq = [-(-L // block_size) for L in lens]
    n_blocks = sum(per_seq) + spare
    perm = torch.randperm(n_blocks, generator=gen)
    tables = torch.zeros(len(lens), max(per_seq) + 2, dtype=torch.int32)
    used = 0
    for b, n in enumerate(per_seq):
        tables[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    k_cache = torch.randn(n_blocks, block_size, hkv, d, generator=gen)
    v_cache = torch.randn(n_blocks, block_size, hkv, d, generator=gen)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hkv * group, d, generator=gen)
    return q, k_cache, v_cache, tables, cu, lens_t


def timeit(fn, min_s: float) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_s:
            return dt / n


def run_case(title: str, kind: str, problem, args) -> dict:
    q, kc, vc, tables, cu, ctx = problem
    if kind == "decode":
        opts = {
            "gather-index": lambda: gather_index_decode(q, kc, vc, tables, ctx, 0.125),
            "gather-select": lambda: reference.paged_attention_decode(q, kc, vc, tables, ctx, 0.125),
            "cpp-inplace": lambda: cpu_attention.paged_attention_decode(q, kc, vc, tables, ctx, 0.125),
        }
    else:
        opts = {
            "gather-index": lambda: gather_index_prefill(q, kc, vc, tables, cu, ctx, 0.125),
            "gather-select": lambda: reference.paged_attention_prefill(q, kc, vc, tables, cu, ctx, 0.125),
            "cpp-inplace": lambda: cpu_attention.paged_attention_prefill(q, kc, vc, tables, cu, ctx, 0.125),
        }
    extra = {}
    if kind == "decode" and args.flex:
        flex = FlexDecode(q, kc, vc, tables, ctx)
        opts["flex"] = lambda: flex(q, kc, vc, tables, ctx, 0.125)
        extra = {"flex_compile_s": flex.compile_s, "flex_block_mask_s": flex.mask_s}
    base = opts["gather-index"]()
    errs = {k: float((f() - base).abs().max()) for k, f in opts.items()}
    times: dict[str, list[float]] = {k: [] for k in opts}
    for _ in range(args.rounds):
        for k, f in opts.items():
            times[k].append(timeit(f, args.min_s))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "case": title,
        "ms": {k: v * 1e3 for k, v in med.items()},
        "ratio_vs_gather_index": {k: med["gather-index"] / v for k, v in med.items()},
        "spread_ms": {k: [min(v) * 1e3, max(v) * 1e3] for k, v in times.items()},
        "max_abs_diff_vs_baseline": errs,
        **extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-s", type=float, default=0.3, help="seconds per option per round")
    ap.add_argument("--flex", action="store_true", help="also time FlexAttention (compiles, ~20 s per shape)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert cpu_attention.available(), cpu_attention._why
    gen = torch.Generator().manual_seed(args.seed)
    hkv, group, d, bs = 2, 3, 64, 16  # the engine bench model: 6 heads / 2 kv heads, d64, block 16

    def ragged(n, lo, hi):
        return torch.randint(lo, hi, (n,), generator=gen).tolist()

    cases = []
    for B, lo, hi in ((32, 32, 768), (64, 32, 768), (8, 1024, 4096)):
        lens = ragged(B, lo, hi)
        cases.append((f"decode B={B}, ctx {lo}-{hi} (mean {sum(lens) / B:.0f})", "decode", lens, [1] * B))
    lens = ragged(8, 300, 500)
    cases.append(("prefill 8 x (cached prefix + 64 new)", "prefill", lens, [64] * 8))
    cases.append(("prefill 4 x 512 fresh", "prefill", [512] * 4, [512] * 4))
    lens = ragged(48, 32, 768)
    new = [1] * 40 + [64] * 8  # a mixed chunked step: decodes carried as 1-token prefills
    cases.append(("prefill 40 x 1 + 8 x 64 (chunked step)", "prefill", lens, new))

    rows = []
    for title, kind, lens, new in cases:
        row = run_case(title, kind, paged_problem(lens, new, hkv, group, d, bs, gen), args)
        rows.append(row)
        print(json.dumps(row), flush=True)

    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    names = ["gather-index", "gather-select", "cpp-inplace"] + (["flex"] if args.flex else [])
    print(
        f"\n{time.strftime('%Y-%m-%d')}, {rev}, {args.threads} threads, "
        f"median of {args.rounds} interleaved rounds\n"
    )
    print("| case | " + " | ".join(f"{n} ms (x)" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for r in rows:
        cells = [
            f"{r['ms'][n]:.2f} ({r['ratio_vs_gather_index'][n]:.2f}x)" if n in r["ms"] else "-" for n in names
        ]
        print(f"| {r['case']} | " + " | ".join(cells) + " |")
    if args.out:
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "git_rev": rev,
            "args": vars(args) | {"out": str(args.out)},
            "rows": rows,
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
