"""Decode on CPU at small batches, on the real model: the GEMV kernel against an older build of
itself, and the engine's decode step with its static-call replay on and off (issue 38).

    .venv/bin/python bench/decode_cpu.py kernel --base REV [--rows 1,2,4,8] [--rounds 5]
    .venv/bin/python bench/decode_cpu.py replay --model DIR [--batches 1,4,8,16] [--rounds 5]

`kernel`: cpu/quant_gemm.cpp as of git revision REV and as in the working tree, each built here
(-march=native, and -march=x86-64-v3 for the AVX2 code on an AVX-512 machine), run on the shapes
of SmolLM2-135M's layers (30 distinct copies of qkv, o, gate_up and down, so they stream from
memory as in the model; random weights quantized by gguf-py) and its 49152 x 576 head, Q4_1, Q8_0
and float32; the builds alternate round by round. For float32 also oneDNN on packed weights and
MKL (`F.linear`), what the engine uses at more rows. Median ms and GB/s of weight bytes read.

`replay`: one engine on DIR (the float32 directory, or a directory holding one .gguf), decode steps
of B sequences (64-token prompts), the runner's CpuDecode switched on and off round by round (the
same engine, so the same weights and cache). Median ms a step. Run it twice for float32, with and
without MODELDEPLOY_CPU_GEMM=0, to compare oneDNN-packed and plain layer weights.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "src/modeldeploy/kernels/cpu/quant_gemm.cpp"
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
HEAD = (49152, 576)
ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731


def compile_source(source_text: str, out: Path, march: str) -> ctypes.CDLL:
    """A kernel source's text (any revision's) built here for `march` and loaded."""
    from modeldeploy.kernels import cpu_build

    src = out.with_suffix(".cpp")
    src.write_text(source_text)
    cxx = cpu_build.compiler()
    if cxx is None:
        raise SystemExit("kernel: needs a C++ compiler")
    cpu_build.compile_to(cxx, out, (f"-march={march}",), source=src)
    return ctypes.CDLL(str(out))


def build(source_text: str, out: Path, march: str) -> ctypes.CDLL:
    lib = compile_source(source_text, out, march)
    i, i64, p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    lib.mdq_linear.argtypes = [i, p, i64, i64, p, p, p, i64, p, i]
    return lib


def kernel(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from gguf import GGMLQuantizationType as QT
    from gguf import quants

    from modeldeploy.kernels import cpu_gemm, quant

    torch.set_num_threads(args.threads)
    base = subprocess.run(["git", "show", f"{args.base}:{SOURCE}"], capture_output=True, text=True, cwd=ROOT)
    if base.returncode != 0:
        raise SystemExit(f"--base: git show {args.base}:{SOURCE} failed: {base.stderr.strip()}")
    tmp = Path(tempfile.mkdtemp(prefix="decode_cpu_"))
    here = (ROOT / SOURCE).read_text()
    libs = {
        f"{args.base} native": build(base.stdout, tmp / "base_native.so", "native"),
        "tree native": build(here, tmp / "tree_native.so", "native"),
        "tree x86-64-v3": build(here, tmp / "tree_v3.so", "x86-64-v3"),
    }
    rng = np.random.default_rng(0)

    def q(fmt: str, n: int, k: int) -> quant.QuantLinear:
        w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
        return quant.from_gguf(fmt, quants.quantize(w, QT[fmt]), k)

    weights: dict[str, list] = {}
    for fmt in ("Q4_1", "Q8_0"):
        one = [q(fmt, n, k) for n, k in SHAPES]
        copy = lambda w: quant.QuantLinear(  # noqa: E731
            w.qweight.clone(), w.scales.clone(), None if w.zeros is None else w.zeros.clone(), w.fmt
        )
        weights[fmt] = [copy(w) for _ in range(30) for w in one]
    weights["F32"] = [torch.randn(n, k) * 0.05 for _ in range(30) for n, k in SHAPES]
    weights["head Q8_0"] = [q("Q8_0", *HEAD)]
    weights["head F32"] = [torch.randn(*HEAD) * 0.05]
    packed = [cpu_gemm.pack(w) for w in weights["F32"]]

    def nbytes(ws: list) -> int:
        return sum(w.numel() * 4 if isinstance(w, torch.Tensor) else w.nbytes for w in ws)

    def run(lib: ctypes.CDLL, ws: list, rows: int) -> None:
        for w in ws:
            if isinstance(w, torch.Tensor):
                x, out = torch.randn(rows, w.shape[1]), torch.empty(rows, w.shape[0])
                n, k = w.shape
                lib.mdq_linear(
                    32, x.data_ptr(), rows, k, w.data_ptr(), None, None, n, out.data_ptr(), args.threads
                )
            else:
                x, out = torch.randn(rows, w.in_features), torch.empty(rows, w.out_features)
                z = None if w.zeros is None else w.zeros.data_ptr()
                qw, sc, n, k = w.qweight.data_ptr(), w.scales.data_ptr(), w.out_features, w.in_features
                lib.mdq_linear(w.bits, x.data_ptr(), rows, k, qw, sc, z, n, out.data_ptr(), args.threads)

    def torch_way(name: str, rows: int) -> None:
        for w, p in zip(weights["F32"], packed, strict=True):
            x = torch.randn(rows, w.shape[1])
            cpu_gemm.linear(x, p) if name == "oneDNN packed" else F.linear(x, w)

    res: dict = {"threads": args.threads, "rows": {}, "builds": list(libs)}
    for rows in args.rows:
        for what, ws in weights.items():
            ways = list(libs) + (["oneDNN packed", "MKL F.linear"] if what == "F32" else [])
            t: dict[str, list[float]] = {w: [] for w in ways}
            for r in range(args.rounds):
                for way in ways if r % 2 == 0 else ways[::-1]:
                    t0 = time.perf_counter()
                    run(libs[way], ws, rows) if way in libs else torch_way(way, rows)
                    t[way].append(time.perf_counter() - t0)
            mb = nbytes(ws) / 1e6
            med = {w: statistics.median(v) for w, v in t.items()}
            row = {w: {"ms": round(s * 1e3, 2), "gb_s": round(mb / 1e3 / s, 1)} for w, s in med.items()}
            res["rows"].setdefault(str(rows), {})[what] = {"mb": round(mb, 1), **row}
            print(rows, what, f"{mb:.1f} MB", {w: v["ms"] for w, v in row.items()}, flush=True)
    return res


def replay(args: argparse.Namespace) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from serving_real_cpu import _decode_round

    from modeldeploy.runtime import LLM

    torch.set_num_threads(args.threads)
    llm = LLM(
        str(args.model),
        dtype="float32",
        max_num_seqs=max(args.batches),
        max_num_batched_tokens=2048,
        max_model_len=2048,
        kv_cache_cpu_bytes=1 << 30,
    )
    eng = llm.engine
    c = eng.runner.cpu_decode
    if c is None:
        raise SystemExit(f"replay: this engine's decode steps stay generic ({eng.runner.decode_steps})")
    ms: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for way in ("replayed", "generic") if r % 2 == 0 else ("generic", "replayed"):
            eng.runner.cpu_decode = c if way == "replayed" else None
            for b in args.batches:
                tok_s = _decode_round(eng, b, args.steps, f"{r}-{way}-{b}")
                ms.setdefault(f"{way} b{b}", []).append(1e3 * b / tok_s)
        print("round", r, {k: round(v[-1], 2) for k, v in ms.items()}, flush=True)
    eng.close()
    return {
        "model": str(args.model),
        "threads": args.threads,
        "env": {k: v for k, v in os.environ.items() if k.startswith("MODELDEPLOY_CPU")},
        "kernels": eng.info()["kernels"],
        "step_ms_median": {k: round(statistics.median(v), 2) for k, v in sorted(ms.items())},
        "step_ms": {k: [round(x, 2) for x in v] for k, v in sorted(ms.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kernel")
    k.add_argument("--base", required=True, help="git revision of the kernel source to compare against")
    k.add_argument("--rows", type=ints, default=[1, 2, 4, 8, 16])
    k.add_argument("--rounds", type=int, default=5)
    k.add_argument("--threads", type=int, default=2)
    r = sub.add_parser("replay")
    r.add_argument("--model", type=Path, required=True)
    r.add_argument("--batches", type=ints, default=[1, 4, 8, 16])
    r.add_argument("--steps", type=int, default=24, help="decode steps timed per round and batch")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--threads", type=int, default=2)
    for p in (k, r):
        p.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    res = {"kernel": kernel, "replay": replay}[args.cmd](args)
    res["git"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    res["command"] = " ".join(sys.argv)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
