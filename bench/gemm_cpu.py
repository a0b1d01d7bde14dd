"""CPU float32 linear layers: torch's F.linear (BLAS: MKL in the x86 wheels) against oneDNN with
the weight packed once (`kernels/cpu_gemm.py`, what the engine runs), on the engine bench's model
shapes (hidden 384: qkv 384->640, o 384->384, gate_up 384->1536, down 768->384) at decode and
prefill row counts, the two alternating per shape; and each one's error against float64.
`--shapes smollm2` takes the real model's layer shapes instead (hidden 576: qkv 576->960, o
576->576, gate_up 576->3072, down 1536->576); each row count also gets a line for its four shapes
together. oneDNN is measured whatever MODELDEPLOY_CPU_GEMM would choose on this CPU.

    .venv/bin/python bench/gemm_cpu.py --threads 2 --out bench/results/gemm_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from modeldeploy.conformance.bench.report import git_revision
from modeldeploy.kernels import cpu_gemm

SHAPE_SETS = {
    "bench": {"qkv": (384, 640), "o": (384, 384), "gate_up": (384, 1536), "down": (768, 384)},
    "smollm2": {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)},
}


def timed(fn, n: int) -> float:
    for _ in range(5):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,16,64,160,512,2048")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two paths per shape")
    ap.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="bench")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ[cpu_gemm.ENV_SWITCH] = "1"  # pack for oneDNN even where "auto" would not
    if cpu_gemm.path_in_use() != "onednn":
        raise SystemExit(f"oneDNN path unavailable: {cpu_gemm.path_in_use()}")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for m in (int(x) for x in args.rows.split(",")):
        per_rows = []
        for name, (k, n) in SHAPE_SETS[args.shapes].items():
            x = torch.randn(m, k, generator=gen)
            w = 0.05 * torch.randn(n, k, generator=gen)
            packed = cpu_gemm.pack(w)
            reps = max(20, int(2e8 / (2 * m * k * n)))
            blas, onednn = [], []
            for _ in range(args.rounds):
                blas.append(timed(lambda: F.linear(x, w), reps))  # noqa: B023
                onednn.append(timed(lambda: cpu_gemm.linear(x, packed), reps))  # noqa: B023
            exact = x.double() @ w.double().t()
            flop = 2 * m * k * n
            row = {
                "rows": m,
                "shape": name,
                "blas_gflops": flop / min(blas) / 1e9,
                "onednn_gflops": flop / min(onednn) / 1e9,
                "blas_max_err": float((F.linear(x, w).double() - exact).abs().max()),
                "onednn_max_err": float((cpu_gemm.linear(x, packed).double() - exact).abs().max()),
            }
            row["speedup"] = row["onednn_gflops"] / row["blas_gflops"]
            rows.append(row)
            per_rows.append((flop, min(blas), min(onednn)))
            print(
                f"{m:5d} {name:8s} BLAS {row['blas_gflops']:6.1f}  "
                f"oneDNN {row['onednn_gflops']:6.1f} GFLOP/s "
                f"({row['speedup']:.2f}x)  max err {row['blas_max_err']:.1e} / {row['onednn_max_err']:.1e}",
                flush=True,
            )
        flop, t_blas, t_onednn = (sum(c) for c in zip(*per_rows, strict=True))
        print(
            f"{m:5d} all      BLAS {flop / t_blas / 1e9:6.1f}  oneDNN {flop / t_onednn / 1e9:6.1f} GFLOP/s "
            f"({t_blas / t_onednn:.2f}x)",
            flush=True,
        )
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "git_rev": git_revision(),
        "threads": args.threads,
        "shapes": args.shapes,
        "cpu_vendor": cpu_gemm.cpu_vendor(),
        "load_avg_start": os.getloadavg()[0],
        "torch": torch.__version__,
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
