"""Where a CPU decode step's time goes at batch 32: forward vs everything around it.

Same random-weight model as bench/engine_cpu.py (hidden 384, 6 layers, 6 heads / 2 kv heads,
float32). 32 requests are prefilled, then `--steps` pure-decode steps are timed. Each engine
component is wrapped with a timer (instance attributes only, nothing in the engine changes):
scheduler.schedule, runner.plan (flattening the batch to lists), runner.execute (the
forward, incl. building its index tensors), model.logits, block_manager.commit,
sampler.sample, _finish_reason (detokenizer + stop checks) and _output. The rest of
Engine.step is reported as "step remainder". A torch.profiler pass over a few more steps
gives the top ops (C++ kernels included, labelled). `--compare` alternates steps between the C++
CPU kernels and the torch twins in the same engine, so their ratio is measured in one run.

    .venv/bin/python bench/profile_decode_cpu.py --threads 1 --steps 40 --profile-steps 8 --compare \
        --out bench/results/profile_decode_cpu_t1.json  # --compare: alternate C++ kernels / torch twins
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
from collections import defaultdict
from pathlib import Path

import torch


def wrap(obj, name: str, acc: dict, label: str | None = None) -> None:
    fn = getattr(obj, name)
    label = label or name

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[label] += time.perf_counter() - t

    setattr(obj, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256, help="mean prompt tokens (uniform +-50 %%)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; >0 with top_p 0.9")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compare", action="store_true", help="alternate steps: C++ kernels / torch twins")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from modeldeploy.kernels import cpu_attention
    from modeldeploy.runtime import LLM, SamplingParams
    from modeldeploy.runtime.tiny_model import make_tiny_model

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(
            Path(tmp) / "m", "llama", 0, hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2
        )
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        llm = LLM(
            model_dir,
            dtype="float32",
            max_num_seqs=args.batch,
            max_num_batched_tokens=2048,
            max_model_len=1024,
            kv_cache_cpu_bytes=1 << 30,
        )
        eng = llm.engine
        total_steps = args.steps + args.profile_steps + 8
        params = SamplingParams(
            temperature=args.temperature,
            top_p=0.9 if args.temperature > 0 else 1.0,
            max_tokens=total_steps + 64,
            ignore_eos=True,
            seed=None,
        )
        for i in range(args.batch):
            n = rng.randint(args.prompt // 2, args.prompt * 3 // 2)
            eng.add_request(f"r{i}", [rng.randrange(5, vocab) for _ in range(n)], params)
        while True:  # prefill everything
            eng.step()
            if (
                all(s.num_uncomputed_tokens == 1 for s in eng.scheduler.running)
                and len(eng.scheduler.running) == args.batch
            ):
                break
        for _ in range(3):
            eng.step()

        from modeldeploy.kernels import dispatch

        dispatch._impl("paged_attention_decode", torch.zeros(1))  # load (or not) the CPU kernels
        kernels = dict(dispatch._CPU)
        paths = ["cpp", "reference"] if (kernels and args.compare) else [cpu_attention.path_in_use()]
        sink: dict[str, float] = defaultdict(float)  # the timers write into the current path's dict
        current = {"acc": sink}

        class Acc(dict):
            def __missing__(self, k):
                return 0.0

            def __getitem__(self, k):
                return current["acc"].get(k, 0.0)

            def __setitem__(self, k, v):
                current["acc"][k] = v

        acc = Acc()
        wrap(eng.scheduler, "schedule", acc, "scheduler.schedule")
        wrap(eng.runner, "plan", acc, "runner.plan")
        wrap(eng.runner, "execute", acc, "runner.execute (forward)")
        wrap(eng.runner.model, "logits", acc, "model.logits (lm_head)")
        wrap(eng.block_manager, "commit", acc, "block_manager.commit")
        wrap(eng.sampler, "sample", acc, "sampler.sample")
        wrap(eng, "_finish_reason", acc, "detokenizer + stop checks")
        wrap(eng, "_output", acc, "_output (RequestOutput)")
        per_path = {p: {"acc": defaultdict(float), "steps": []} for p in paths}
        for i in range(args.steps * len(paths)):  # paths alternate step by step (shared machine)
            path = paths[i % len(paths)]
            dispatch._CPU.clear()
            if path == "cpp":
                dispatch._CPU.update(kernels)
            current["acc"] = per_path[path]["acc"]
            t = time.perf_counter()
            outs = eng.step()
            per_path[path]["steps"].append(time.perf_counter() - t)
            assert len(outs) == args.batch, "not a pure decode step"
        dispatch._CPU.clear()
        dispatch._CPU.update(kernels)
        current["acc"] = sink
        summary = {}
        for path, d in per_path.items():
            wall = sum(d["steps"])
            parts = dict(d["acc"])
            parts["step remainder (runner.run glue, engine loop)"] = wall - sum(parts.values())
            forward = parts["runner.execute (forward)"]
            summary[path] = {
                "step_ms_mean": wall / args.steps * 1e3,
                "step_ms_median": statistics.median(d["steps"]) * 1e3,
                "forward_share": forward / wall,
                "outside_forward_share": 1 - forward / wall,
                "parts_ms_per_step": {k: v / args.steps * 1e3 for k, v in parts.items()},
                "parts_share": {k: v / wall for k, v in parts.items()},
            }

        from torch.profiler import ProfilerActivity, profile, record_function

        def labelled(name, fn):  # the C++ kernel is a ctypes call, invisible to the profiler
            def call(*a, **k):
                with record_function(f"cpu_attention.{name}"):
                    return fn(*a, **k)

            return call

        for name in list(dispatch._CPU):
            dispatch._CPU[name] = labelled(name, dispatch._CPU[name])

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.profile_steps):
                eng.step()
        ka = prof.key_averages()
        prof_total = sum(e.self_cpu_time_total for e in ka)  # self times add up to the traced total
        top = sorted(ka, key=lambda e: -e.self_cpu_time_total)[:15]
        top_ops = [
            {
                "op": e.key,
                "self_ms_per_step": e.self_cpu_time_total / 1e3 / args.profile_steps,
                "share": e.self_cpu_time_total / prof_total,
                "calls_per_step": e.count / args.profile_steps,
            }
            for e in top
        ]

    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "git_rev": rev,
        "attention_path": cpu_attention.path_in_use(),
        "load_avg": os.getloadavg(),
        "args": vars(args) | {"out": str(args.out)},
        "paths": summary,
        "top_ops": top_ops,
    }
    print(json.dumps(result, indent=2))
    print(
        f"\nbatch {args.batch}, {args.threads} threads, {args.steps} decode steps per path, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    if len(summary) == 2:
        a, b = summary["cpp"], summary["reference"]
        print(
            f"step median: cpp {a['step_ms_median']:.2f} ms, reference {b['step_ms_median']:.2f} ms "
            f"(reference / cpp = {b['step_ms_median'] / a['step_ms_median']:.2f}x, steps interleaved)"
        )
    names = list(summary)
    print("| part | " + " | ".join(f"{n} ms / step (share)" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    first = summary[names[0]]["parts_ms_per_step"]
    for k in sorted(first, key=lambda k: -first[k]):
        cells = [
            f"{summary[n]['parts_ms_per_step'][k]:.3f} ({summary[n]['parts_share'][k]:.1%})" for n in names
        ]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print(
        "| outside the forward | "
        + " | ".join(f"{summary[n]['outside_forward_share']:.1%}" for n in names)
        + " |"
    )
    print("\n| op (torch.profiler, self CPU) | ms / step | share | calls / step |\n|---|---|---|---|")
    for o in top_ops:
        print(f"| {o['op']} | {o['self_ms_per_step']:.3f} | {o['share']:.1%} | {o['calls_per_step']:.0f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
