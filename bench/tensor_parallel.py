"""Tensor parallelism on CPU: step time TP=1 vs TP=N (prefill and decode), bytes all-reduced per
step, weights per rank. Rounds alternate TP=1 / TP=N so machine noise hits both.

    .venv/bin/python bench/tensor_parallel.py --tp 2 --rounds 3 --out bench/results/tensor_parallel.md

On a 2-core machine TP=2 is expected to be slower: two ranks share the same two cores, and each
layer adds two all-reduces over loopback TCP (gloo). The figure says what TP costs, not what it buys:
on GPUs it buys memory (each rank holds 1/N of the layers) and bandwidth.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy.runtime.tiny_model import make_tiny_model


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(model: Path, tp: int, batch: int, prompt: int, decode_steps: int) -> dict:
    threads = max(1, (os.cpu_count() or 1) // tp)
    torch.set_num_threads(threads)  # rank 0; the workers set the same share themselves
    llm = LLM(
        model,
        dtype="float32",
        tensor_parallel_size=tp,
        max_num_seqs=batch,
        max_num_batched_tokens=batch * prompt,
        max_model_len=prompt + decode_steps + 8,
        enable_prefix_caching=False,
    )
    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=decode_steps + 1, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"r{i}", [(7 * i + j) % 500 + 1 for j in range(prompt)], params)
    coll = eng.tp.collective if eng.tp else None
    b0 = coll.bytes_total if coll else 0
    t = time.perf_counter()
    eng.step()  # the whole batch's prefill in one step
    prefill = time.perf_counter() - t
    prefill_bytes = (coll.bytes_total - b0) if coll else 0
    times, per_step = [], []
    for _ in range(decode_steps):
        b0 = coll.bytes_total if coll else 0
        t = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t)
        per_step.append((coll.bytes_total - b0) if coll else 0)
    info = eng.parallel_info()
    rss = [rss_mib(os.getpid())] + [rss_mib(p) for p in info["worker_pids"]]
    eng.close()
    return {
        "tp": tp,
        "threads_per_rank": threads,
        "prefill_s": prefill,
        "decode_s": statistics.median(times),
        "prefill_allreduce_bytes": prefill_bytes,
        "decode_allreduce_bytes": statistics.median(per_step),
        "weight_bytes_per_rank": info["weight_bytes_per_rank"],
        "rss_mib_per_rank": rss,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=24)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = make_tiny_model(
            Path(d) / "m",
            "llama",
            0,
            hidden_size=a.hidden,
            num_layers=a.layers,
            num_heads=6,
            num_kv_heads=2,
            intermediate_size=4 * a.hidden,
        )
        runs: dict[int, list[dict]] = {1: [], a.tp: []}
        for _ in range(a.rounds):
            for tp in (1, a.tp):
                runs[tp].append(measure(model, tp, a.batch, a.prompt, a.decode_steps))
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()
    one, many = runs[1], runs[a.tp]
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    lines = [
        "# Tensor parallelism on CPU: step time, all-reduce bytes, weights per rank",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}  git rev: {rev}",
        f"- command: `python bench/tensor_parallel.py --tp {a.tp} --rounds {a.rounds} --batch {a.batch} "
        f"--prompt {a.prompt} --decode-steps {a.decode_steps}`",
        f"- machine: {os.cpu_count()} CPUs, load average at the end {load[0]:.1f} "
        "(shared: figures are noisy; "
        "rounds alternate TP=1 / TP=N)",
        f"- model: llama-shaped, hidden {a.hidden}, {a.layers} layers, 6 heads / 2 kv heads, intermediate "
        f"{4 * a.hidden}, vocab 512, float32, random weights; torch threads per rank = CPUs / TP",
        f"- workload: {a.batch} sequences of {a.prompt} prompt tokens prefilled in one step, then "
        f"{a.decode_steps} decode steps of {a.batch} rows; median over rounds",
        "",
        f"| | TP=1 | TP={a.tp} | TP={a.tp} / TP=1 |",
        "|---|---|---|---|",
        f"| prefill step ({a.batch} x {a.prompt} tokens), ms | {med(one, 'prefill_s') * 1e3:.1f} | "
        f"{med(many, 'prefill_s') * 1e3:.1f} | {med(many, 'prefill_s') / med(one, 'prefill_s'):.2f} |",
        f"| decode step ({a.batch} rows), ms | {med(one, 'decode_s') * 1e3:.2f} | "
        f"{med(many, 'decode_s') * 1e3:.2f} | "
        f"{med(many, 'decode_s') / med(one, 'decode_s'):.2f} |",
        f"| bytes all-reduced per prefill step | 0 | {int(med(many, 'prefill_allreduce_bytes')):,} | |",
        f"| bytes all-reduced per decode step | 0 | {int(med(many, 'decode_allreduce_bytes')):,} | |",
        f"| weight bytes per rank | {one[0]['weight_bytes_per_rank'][0]:,} | "
        + " / ".join(f"{b:,}" for b in many[0]["weight_bytes_per_rank"])
        + " | "
        + " / ".join(
            f"{b / one[0]['weight_bytes_per_rank'][0]:.2f}" for b in many[0]["weight_bytes_per_rank"]
        )
        + " |",
        f"| RSS per rank process, MiB | {one[0]['rss_mib_per_rank'][0]:.0f} | "
        + " / ".join(f"{r:.0f}" for r in many[0]["rss_mib_per_rank"])
        + " | |",
        "",
        "Each round's figures (ms): TP=1 prefill "
        + ", ".join(f"{r['prefill_s'] * 1e3:.0f}" for r in one)
        + f"; TP={a.tp} prefill "
        + ", ".join(f"{r['prefill_s'] * 1e3:.0f}" for r in many)
        + "; TP=1 decode "
        + ", ".join(f"{r['decode_s'] * 1e3:.1f}" for r in one)
        + f"; TP={a.tp} decode "
        + ", ".join(f"{r['decode_s'] * 1e3:.1f}" for r in many)
        + ".",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
