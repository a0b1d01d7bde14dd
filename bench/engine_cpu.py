"""Offline CPU throughput: our engine vs transformers `generate` with static batches.

Same random-weight model (hidden 384, 6 layers by default), same requests, same dtype,
same thread count. Each request has its own prompt length (32-512) and output length
(16-256); EOS is ignored on both sides so every request produces exactly its length.
transformers runs the requests in arrival order in static batches (left-padded, each
batch generating to its longest output; only the requested tokens count as output).

    .venv/bin/python bench/engine_cpu.py --requests 256 --out bench/results/engine_cpu.json

Each side also reports tokens per second of process CPU time (all threads), a reading less
distorted by other load on a shared machine than wall time. `--repeat N` alternates the two
sides N times (engine, transformers, engine, ...) on the shared machine and reports each pair's
ratio and their median; `attention` records which CPU paged attention the engine used (cpp: in
place; reference: the torch twins, MODELDEPLOY_CPU_KERNELS=0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch


def workload(n: int, seed: int, vocab: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [
        ([rng.randrange(5, vocab) for _ in range(rng.randint(32, 512))], rng.randint(16, 256))
        for _ in range(n)
    ]


def run_engine(model_dir: Path, reqs, max_num_seqs: int) -> dict:
    from modeldeploy.runtime import LLM, SamplingParams

    llm = LLM(
        model_dir,
        dtype="float32",
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2048,
        max_model_len=1024,
        kv_cache_cpu_bytes=1 << 30,
    )
    eng = llm.engine
    fwd = {"t": 0.0}
    run = eng.runner.run

    def timed_run(batch):
        t = time.perf_counter()
        try:
            return run(batch)
        finally:
            fwd["t"] += time.perf_counter() - t

    eng.runner.run = timed_run
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for _, m in reqs]
    t0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate([p for p, _ in reqs], params)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    toks = sum(len(o.token_ids) for o in outs)
    assert toks == sum(m for _, m in reqs)
    s = eng.stats()
    return {
        "wall_s": wall,
        "output_tokens": toks,
        "tok_per_s": toks / wall,
        "cpu_s": cpu,
        "tok_per_cpu_s": toks / cpu,
        "steps": s.steps_total,
        "forward_s": fwd["t"],
        "outside_forward_share": 1 - fwd["t"] / wall,
        "preemptions": s.preemptions_total,
    }


def run_hf(model_dir: Path, reqs, batch_size: int) -> dict:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = hf.generation_config.pad_token_id
    useful = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for i in range(0, len(reqs), batch_size):
            chunk = reqs[i : i + batch_size]
            width = max(len(p) for p, _ in chunk)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk])
            new = max(m for _, m in chunk)
            hf.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=pad,
            )
            useful += sum(m for _, m in chunk)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "wall_s": wall,
        "output_tokens": useful,
        "tok_per_s": useful / wall,
        "cpu_s": cpu,
        "tok_per_cpu_s": useful / cpu,
        "batch_size": batch_size,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--hidden-size", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="alternate engine / transformers runs N times")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    from modeldeploy.runtime.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(
            Path(tmp) / "m",
            "llama",
            0,
            hidden_size=args.hidden_size,
            num_layers=args.layers,
            num_heads=6,
            num_kv_heads=2,
        )
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        reqs = workload(args.requests, args.seed, vocab)
        pairs = []
        for _ in range(args.repeat):
            ours = run_engine(model_dir, reqs, args.max_num_seqs)
            print("engine      ", json.dumps(ours), flush=True)
            hf = run_hf(model_dir, reqs, args.hf_batch_size)
            print("transformers", json.dumps(hf), flush=True)
            pairs.append((ours, hf, os.getloadavg()[0]))
    from modeldeploy.kernels import cpu_attention, cpu_gemm

    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    ratios = [o["tok_per_s"] / h["tok_per_s"] for o, h, _ in pairs]
    ours, hf, _ = pairs[ratios.index(statistics.median_low(ratios))]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "git_rev": rev,
        "args": vars(args) | {"out": str(args.out)},
        "attention": cpu_attention.path_in_use(),
        "linear": cpu_gemm.path_in_use(),  # onednn: packed weights (kernels/cpu_gemm.py); blas: F.linear
        "load_avg_start": load_start,
        "load_avg_after_each_pair": [la for _, _, la in pairs],
        "engine": ours,
        "transformers": hf,
        "speedup": ours["tok_per_s"] / hf["tok_per_s"],
        "speedups": ratios,
        # process CPU time (all threads): less sensitive to other load on a shared machine than
        # wall time, though spin-waiting threads count too
        "speedup_cpu_time": ours["tok_per_cpu_s"] / hf["tok_per_cpu_s"],
        "runs": [{"engine": o, "transformers": h} for o, h, _ in pairs],
    }
    print(
        f"speedup {result['speedup']:.2f}x (median of {', '.join(f'{r:.2f}' for r in ratios)}; "
        f"attention {result['attention']}, linear {result['linear']})  (engine {ours['tok_per_s']:.1f} "
        f"tok/s, transformers {hf['tok_per_s']:.1f} tok/s, "
        f"outside-forward share {ours['outside_forward_share']:.1%}; "
        f"per CPU-second {result['speedup_cpu_time']:.2f}x)"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
