"""modeldeploy vs Hugging Face's `transformers serve --continuous-batching` on the real model
(issue 38's other "Must show": >= 4x goodput at transformers' capacity).

  .venv/bin/python bench/serving_real_hf.py [--duration 90] [--start-rate 0.25] --out F.json
  .venv/bin/python bench/serving_real_cpu.py table F.json
  ... --ours-model DIR   # ours on another form of the same model, e.g. the shipped Q4_1 GGUF

The model as it ships is a Q4_1 GGUF; transformers can only de-quantize it to float32 (which is
what the float32 directory holds, value for value), while ours can serve the file itself with its
weights kept quantized: `--ours-model` measures that, on the same weight values.

The same harness as `serving_real_cpu.py llama`: both servers up together on SmolLM2-135M-Instruct
in float32 (the same HF directory), one `modeldeploy bench --find-capacity` over both URLs (it
interleaves them probe by probe with the same seeded arrivals and prompts), the issue's 70/25/5 mix
of 64/384/1536-token prompts with 64-128 output tokens, SLO TTFT <= 1.5 s and mean ITL <= 0.15 s.

transformers gets what ours has: the same block size, number of KV blocks and token budget per
step (read from our `/v1/bundle`), and the same threads. It refuses `ignore_eos`, so neither server
gets it: greedy decoding on the same weights stops both at the same end-of-sequence token (the
table's "out tokens mean" column shows whether the lengths matched).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from serving_real_cpu import (
    bench_cmd,
    free_port,
    loadavg,
    ours_serve_cmd,
    real_model,
    run_fields,
    stop,
    wait_http,
)

PY = sys.executable
HF_SERVE = (  # `transformers serve` from this venv's transformers, whatever its console scripts
    "import sys; from transformers.cli.transformers import main; "
    "sys.argv=['transformers']+sys.argv[1:]; sys.exit(main())"
)


def hf_serve_cmd(model: Path, port: int, engine: dict) -> list[str]:
    """transformers' server with our engine's KV geometry and step budget (continuous batching)."""
    return [PY, "-c", HF_SERVE, "serve", "--continuous-batching", "--device", "cpu", "--dtype", "float32"] + [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--cb-block-size",
        str(engine["block_size"]),
        "--cb-num-blocks",
        str(engine["num_kv_blocks"]),
        "--cb-max-batch-tokens",
        str(engine["max_num_batched_tokens"]),
        str(model),
    ]


def run(args: argparse.Namespace) -> dict:
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = real_model()
    ours_model = args.ours_model or model
    ports = {"modeldeploy": free_port(), "transformers": free_port()}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    lifetime = str(int(args.lifetime))
    procs: dict[str, subprocess.Popen] = {}
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    res: dict = {
        "kind": "serving_real_cpu/peer",
        "peer": "transformers",
        "goal": 4.0,
        "models": {"modeldeploy": str(ours_model), "transformers": str(model)},
        **run_fields(args),
    }
    try:

        def launch(name: str, cmd: list[str]) -> None:
            log = (out / f"{name}.log").open("w")
            procs[name] = subprocess.Popen(
                ["timeout", lifetime, *cmd],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )

        launch("modeldeploy", ours_serve_cmd(ours_model, ports["modeldeploy"], args.slots, args.ctx_per_slot))
        wait_http(urls["modeldeploy"] + "/health/ready", procs["modeldeploy"])
        engine = httpx.get(urls["modeldeploy"] + "/v1/bundle", timeout=10).json()["engine_config"]
        hf = hf_serve_cmd(model, ports["transformers"], engine)
        launch("transformers", hf)
        wait_http(urls["transformers"] + "/v1/models", procs["transformers"])
        res["servers"] = {"modeldeploy": procs["modeldeploy"].args, "transformers": hf}
        res["engine_config"] = engine
        names = ["modeldeploy", "transformers"]
        path = out / "bench.json"
        cmd = bench_cmd([urls[n] for n in names], names, args, path, ignore_eos=False)
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, timeout=args.lifetime)
        rec = json.loads(path.read_text())
        res["benches"].append({"command": cmd, "json": str(path), "record": rec})
        res["capacity"] = {n: c["rate"] for n, c in rec.get("capacity", {}).items()}
    finally:
        stop(procs.values())
        res["loadavg_after"] = loadavg()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--start-rate", type=float, default=0.25, help="first probe of the capacity search")
    ap.add_argument("--max-rate", type=float, default=4.0)
    ap.add_argument("--search-steps", type=int, default=1)
    ap.add_argument("--duration", type=float, default=90, help="seconds of arrivals per probe")
    ap.add_argument("--drain-timeout", type=float, default=120)
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both servers")
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--ctx-per-slot", type=int, default=2048)
    ap.add_argument("--lifetime", type=float, default=5400, help="seconds the servers may live at most")
    ap.add_argument(
        "--ours-model",
        type=Path,
        default=None,
        help="the model directory ours serves (default: the float32 one transformers serves)",
    )
    ap.add_argument("--out-dir", default="/tmp/serving_real_hf")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.rates, args.tokenizer = None, None  # bench_cmd's: always a capacity search, the model's tokenizer
    res = run(args)
    res["git"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
