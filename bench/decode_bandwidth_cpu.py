"""Decode at batch 1 on the real model, against the memory bandwidth it is bound by (issue 38).

A float32 decode step of SmolLM2-135M reads every weight once: 425 MB in the layers' 120 GEMMs
(30 layers x qkv, o, gate_up, down) and 113 MB in the tied head. At batch 1 each GEMM is a GEMV, so
the step's floor is those bytes over the machine's memory bandwidth. This prints three things, each
measured in this run:

1. the engine's decode step (median of 60) at `--batch` and torch.profiler's top ops over 10 more;
2. the same GEMV shapes, 30 distinct weights each (so they stream from memory, as in the model,
   instead of sitting in cache as one repeated weight would), through torch's BLAS (`F.linear`,
   MKL), `torch.mv` and oneDNN on a packed weight (`kernels.cpu_gemm`, what the engine uses), and
   the 49152 x 576 head through `mm`/`mv`/`linear` with the cache flushed between calls;
3. the machine's streaming read rate (`sum` over 256 MB), the bandwidth those should approach.

    .venv/bin/python bench/decode_bandwidth_cpu.py [--batch 1] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

LAYERS = 30
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
HEAD = (49152, 576)


def median_s(fn: Callable[[], object], n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def engine_step(batch: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    from modeldeploy.runtime import LLM, SamplingParams
    from modeldeploy_dev.real_model import cached_real_model

    llm = LLM(
        cached_real_model(),
        dtype="float32",
        max_num_seqs=max(8, batch),
        max_num_batched_tokens=2048,
        max_model_len=2048,
        kv_cache_cpu_bytes=1 << 30,
    )
    eng = llm.engine
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"r{i}", list(range(100, 300)), params)
    for _ in range(5):  # prefill, then a few decode steps
        eng.step()
    step = median_s(eng.step, 60)
    print(f"engine decode step, batch {batch}, 200-token prompts: median {step * 1e3:.1f} ms")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            eng.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=6))


def gemv_rates() -> None:
    from modeldeploy.kernels import cpu_gemm

    ws = {n: [torch.randn(N, K) for _ in range(LAYERS)] for n, (N, K) in SHAPES.items()}
    packed = {n: [cpu_gemm.pack(w) for w in ww] for n, ww in ws.items()}
    xs = {n: torch.randn(1, K) for n, (_, K) in SHAPES.items()}
    mb = sum(w.numel() * 4 for ww in ws.values() for w in ww) / 1e6
    ways: dict[str, Callable[[str, int], object]] = {
        "BLAS F.linear": lambda n, i: F.linear(xs[n], ws[n][i]),
        "torch.mv": lambda n, i: torch.mv(ws[n][i], xs[n][0]),
        "oneDNN packed": lambda n, i: cpu_gemm.linear(xs[n], packed[n][i]),
    }
    print(f"\nthe layers' GEMVs, {LAYERS} x {list(SHAPES)} ({mb:.0f} MB), median of 15 passes:")
    for name, fn in ways.items():
        s = median_s(lambda fn=fn: [fn(n, i) for i in range(LAYERS) for n in SHAPES], 15)
        print(f"  {name:14s} {s * 1e3:6.2f} ms  {mb / 1e3 / s:5.1f} GB/s")
    head, x = torch.randn(*HEAD), torch.randn(1, HEAD[1])
    flush = torch.randn(64 << 20)
    hmb = head.numel() * 4 / 1e6
    print(f"the head {HEAD[0]} x {HEAD[1]} ({hmb:.0f} MB), cache flushed before each call:")
    for name, fn in {
        "mm": lambda: x @ head.t(),
        "mv": lambda: torch.mv(head, x[0]),
        "F.linear": lambda: F.linear(x, head),
    }.items():
        ts = []
        for _ in range(15):
            flush.add_(1.0)
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        s = statistics.median(ts)
        print(f"  {name:14s} {s * 1e3:6.2f} ms  {hmb / 1e3 / s:5.1f} GB/s")
    big = torch.randn(64 << 20)
    print(f"streaming read (sum over 256 MB): {256 / 1e3 / median_s(big.sum, 10):.1f} GB/s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1, help="decoding sequences (default 1)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    a = p.parse_args(argv)
    if a.batch < 1 or a.threads < 1:
        p.error("--batch and --threads must be at least 1")
    torch.set_num_threads(a.threads)
    engine_step(a.batch)
    gemv_rates()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
