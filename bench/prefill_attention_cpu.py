"""Prefill attention on CPU, on the real model's heads: the C++ kernel as of a git revision against
the working tree's, and torch SDPA where the prompt is fresh (issue 38: long prompts' TTFT).

    .venv/bin/python bench/prefill_attention_cpu.py --base REV [--base-tile 8] [--rounds 5]

SmolLM2-135M's attention (9 query heads over 3 KV heads of 64, 16-token KV blocks shuffled in a
paged cache, float32) for a fresh 1536-token prompt, a 512-token chunk after 1024 cached tokens,
and fresh 512- and 256-token prompts. `cpu/paged_attention.cpp` at REV (run with `--base-tile`
query tokens a task, what that revision's wrapper passed) and in the working tree (with
`cpu_attention.prefill_tile`), each built here with -march=native and -march=x86-64-v3 (the AVX2
code on an AVX-512 machine); the builds alternate round by round. Median ms, GFLOP/s of the
causal products (4 x D flops a query-key pair a head), ms for the model's 30 layers.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from decode_cpu import compile_source
from paged_attention_cpu import paged_problem, timeit

from modeldeploy.conformance.bench.report import git_revision
from modeldeploy.kernels import cpu_attention, cpu_build, reference

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "src/modeldeploy/kernels/cpu/paged_attention.cpp"
HKV, GROUP, D, BLOCK, LAYERS = 3, 3, 64, 16, 30
CASES = [(1536, 1536), (1536, 512), (512, 512), (256, 256)]  # (tokens in context, new tokens)


def build(source_text: str, out: Path, march: str) -> ctypes.CDLL:
    lib = compile_source(source_text, out, march)
    lib.md_paged_prefill.argtypes = cpu_attention._signatures()["md_paged_prefill"][0]
    lib.md_paged_prefill.restype = None
    return lib


def calls(libs: dict, q, kc, vc, table, cu, lens, threads: int) -> dict:
    """One zero-argument call per build, each with the tile its revision uses."""
    out = torch.empty_like(q)

    def call(lib: ctypes.CDLL, t: int) -> torch.Tensor:
        lib.md_paged_prefill(
            0, q.data_ptr(), q.stride(0), kc.data_ptr(), vc.data_ptr(), table.data_ptr(),
            table.stride(0), cu.data_ptr(), lens.data_ptr(), out.data_ptr(), 1, HKV * GROUP, HKV,
            D, BLOCK, t, D**-0.5, threads,
        )  # fmt: skip
        return out

    return {name: partial(call, lib, t) for name, (lib, t) in libs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision of the kernel source to compare against")
    ap.add_argument("--base-tile", type=int, default=8, help="query tokens a task at --base")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = subprocess.run(["git", "show", f"{args.base}:{SOURCE}"], capture_output=True, text=True, cwd=ROOT)
    if base.returncode != 0:
        raise SystemExit(f"--base: git show {args.base}:{SOURCE} failed: {base.stderr.strip()}")
    tile = cpu_attention.prefill_tile(GROUP, torch.float32)
    tmp = Path(tempfile.mkdtemp(prefix="prefill_attention_"))
    libs = {
        f"{args.base} native": (build(base.stdout, tmp / "base_native.so", "native"), args.base_tile),
        "tree native": (build((ROOT / SOURCE).read_text(), tmp / "tree_native.so", "native"), tile),
        f"{args.base} x86-64-v3": (build(base.stdout, tmp / "base_v3.so", "x86-64-v3"), args.base_tile),
        "tree x86-64-v3": (build((ROOT / SOURCE).read_text(), tmp / "tree_v3.so", "x86-64-v3"), tile),
    }
    gen = torch.Generator().manual_seed(0)
    rows = []
    for context, new in CASES:
        q, kc, vc, table, cu, lens = paged_problem([context], [new], HKV, GROUP, D, BLOCK, gen, spare=8)
        fns = calls(libs, q, kc, vc, table, cu, lens, args.threads)
        if new == context:
            keys = kc[table[0].long()].reshape(-1, HKV, D)[:context]
            vals = vc[table[0].long()].reshape(-1, HKV, D)[:context]
            fns["torch SDPA (fresh prompt)"] = partial(reference.causal_attention, q, keys, vals, D**-0.5)
        want = reference.paged_attention_prefill(q, kc, vc, table, cu, lens, D**-0.5)
        errors = {name: float((fn() - want).abs().max()) for name, fn in fns.items()}
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                times[name].append(timeit(fn, 0.3))
        pairs = sum(context - new + i + 1 for i in range(new))
        flop = 4 * D * pairs * HKV * GROUP
        for name, ts in times.items():
            ms = statistics.median(ts) * 1e3
            row = {"context": context, "new": new, "build": name, "ms": ms, "gflops": flop / ms / 1e6}
            row.update({"layers_ms": ms * LAYERS, "max_abs_err_vs_twin": errors[name]})
            rows.append(row)
            print(
                f"{context:5d} ctx {new:5d} new  {name:28s} {ms:7.2f} ms {row['gflops']:6.1f} GFLOP/s"
                f"  x{LAYERS} layers {row['layers_ms']:6.0f} ms  err {errors[name]:.1e}",
                flush=True,
            )
    if args.out:
        result = {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "git_rev": git_revision(),
            "base": args.base,
            "base_tile": args.base_tile,
            "tile": tile,
            "threads": args.threads,
            "load_avg_start": os.getloadavg()[0],
            "cpu": cpu_build.cpuinfo_line("model name").partition(":")[2].strip(),
            "rows": rows,
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
