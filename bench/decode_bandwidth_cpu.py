"""Decode at batch 1 on the real model, against the memory bandwidth it is bound by (issue 38).

A float32 decode step of SmolLM2-135M reads every weight once: 425 MB in the layers' 120 GEMMs
(30 layers x qkv, o, gate_up, down) and 113 MB in the tied head. At batch 1 each GEMM is a GEMV, so
the step's floor is those bytes over the machine's memory bandwidth. This prints three things, each
measured in this run:

1. the engine's decode step (median of 60) at `--batch` and torch.profiler's top ops over 10 more;
   then the step with the head on the C++ streaming kernel (`dispatch.head_linear`, the default)
   against torch's `mm` (the kernel switched off), `--rounds` rounds alternating the two;
2. the same GEMV shapes, 30 distinct weights each (so they stream from memory, as in the model,
   instead of sitting in cache as one repeated weight would), through torch's BLAS (`F.linear`,
   MKL), `torch.mv`, oneDNN on a packed weight (`kernels.cpu_gemm`, what the engine uses) and the
   C++ streaming kernel on the plain weight (`cpu_quant.linear_float`); and the 49152 x 576 head
   at 1, 4, 8 and 16 rows through `mm`/`mv`/`linear` and the kernel, the cache flushed between calls;
3. the machine's streaming read rate (`sum` over 256 MB), the bandwidth those should approach.

    .venv/bin/python bench/decode_bandwidth_cpu.py [--batch 1] [--threads 2] [--rounds 5]
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


def engine_step(batch: int, rounds: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    from modeldeploy.kernels import cpu_quant
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
    params = SamplingParams(temperature=0, max_tokens=1500, ignore_eos=True)  # none ends in the run
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
    kernel_rows = cpu_quant.FLOAT_MAX_ROWS
    got: dict[str, list[float]] = {"head on the C++ kernel": [], "head on torch mm": []}
    ways = [("head on the C++ kernel", kernel_rows), ("head on torch mm", 0)]
    for r in range(rounds):  # each round in the other order: contexts grow, and steps with them
        for name, rows in ways if r % 2 == 0 else ways[::-1]:
            cpu_quant.FLOAT_MAX_ROWS = rows  # 0: streams_float refuses every call
            got[name].append(median_s(eng.step, 30))
    cpu_quant.FLOAT_MAX_ROWS = kernel_rows
    print(f"decode step, batch {batch}, {rounds} rounds alternating (median of 30 steps a round):")
    for name, ts in got.items():
        each = [round(t * 1e3, 1) for t in ts]
        print(f"  {name:24s} median {statistics.median(ts) * 1e3:6.1f} ms  rounds {each}")


def gemv_rates() -> None:
    from modeldeploy.kernels import cpu_gemm, cpu_quant

    ws = {n: [torch.randn(N, K) for _ in range(LAYERS)] for n, (N, K) in SHAPES.items()}
    packed = {n: [cpu_gemm.pack(w) for w in ww] for n, ww in ws.items()}
    xs = {n: torch.randn(1, K) for n, (_, K) in SHAPES.items()}
    mb = sum(w.numel() * 4 for ww in ws.values() for w in ww) / 1e6
    ways: dict[str, Callable[[str, int], object]] = {
        "BLAS F.linear": lambda n, i: F.linear(xs[n], ws[n][i]),
        "torch.mv": lambda n, i: torch.mv(ws[n][i], xs[n][0]),
        "oneDNN packed": lambda n, i: cpu_gemm.linear(xs[n], packed[n][i]),
        "C++ streaming": lambda n, i: cpu_quant.linear_float(xs[n], ws[n][i]),
    }
    print(f"\nthe layers' GEMVs, {LAYERS} x {list(SHAPES)} ({mb:.0f} MB), median of 15 passes:")
    for name, fn in ways.items():
        s = median_s(lambda fn=fn: [fn(n, i) for i in range(LAYERS) for n in SHAPES], 15)
        print(f"  {name:14s} {s * 1e3:6.2f} ms  {mb / 1e3 / s:5.1f} GB/s")
    head = torch.randn(*HEAD)
    flush = torch.randn(64 << 20)
    hmb = head.numel() * 4 / 1e6
    print(f"the head {HEAD[0]} x {HEAD[1]} ({hmb:.0f} MB), cache flushed before each call, median of 15:")
    for rows in (1, 4, 8, 16):
        x = torch.randn(rows, HEAD[1])
        heads: dict[str, Callable[[], object]] = {
            "mm": lambda x=x: x @ head.t(),
            "F.linear": lambda x=x: F.linear(x, head),
            "C++ streaming": lambda x=x: cpu_quant.linear_float(x, head),
        }
        if rows == 1:
            heads["mv"] = lambda x=x: torch.mv(head, x[0])
        for name, fn in heads.items():
            ts = []
            for _ in range(15):
                flush.add_(1.0)
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            s = statistics.median(ts)
            print(f"  {rows:2d} rows  {name:14s} {s * 1e3:6.2f} ms  {hmb / 1e3 / s:5.1f} GB/s")
    big = torch.randn(64 << 20)
    print(f"streaming read (sum over 256 MB): {256 / 1e3 / median_s(big.sum, 10):.1f} GB/s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1, help="decoding sequences (default 1)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="kernel/mm rounds of the engine step (default 5)")
    a = p.parse_args(argv)
    if a.batch < 1 or a.threads < 1 or a.rounds < 1:
        p.error("--batch, --threads and --rounds must be at least 1")
    torch.set_num_threads(a.threads)
    engine_step(a.batch, a.rounds)
    gemv_rates()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
