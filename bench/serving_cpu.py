"""Open-loop serving on CPU: modeldeploy vs `transformers serve --continuous-batching`, and capacities.

Runs `modeldeploy bench` (the product's own client) against:
1. one compare run, interleaved per rate: `modeldeploy serve` and HF's `transformers serve
   --continuous-batching` on the same ~30M-parameter llama-shaped random model, HF given the same
   KV capacity and step budget as ours (block 16, our effective num_kv_blocks, 2048 tokens);
   ignore_eos off for both (HF refuses it), greedy, so both generate the same tokens;
2. `--find-capacity` at the operator's default SLO (TTFT 1 s, TPOT 0.1 s) on the side-by-side
   workload: for modeldeploy always; for transformers only with `--hf-capacity` (on this CPU every
   one of its requests misses the SLO even alone, so the search walks down to start/16 at up to
   3 minutes of drain per probe; the compare run's lowest rate already shows it);
3. `--find-capacity` of modeldeploy alone for the demo's tiny model and for the 30M model with
   the default 70/25/5 mix.
Records (JSON + PNG) go to --out; bench/results/serving_cpu.md is written from them by hand.

`--issue16` runs the long-prompt workload and SLO instead: a 70/25/5 mix of 64/384/1536-token
prompts with 64-128 output tokens, TTFT <= 1.5 s and TPOT (mean ITL) <= 0.15 s per request,
rates of `--duration` seconds each; transformers at `--hf-threads` (default 1: its best on two
cores: the short-prompt mix in serving_cpu.md), our server at torch's default threads with `--queue-budget`
(default 1.5 s, the TTFT objective, as the operator sets it); both capacities searched; then our
server at its capacity and at twice it (the overload check: goodput kept, 429s within 50 ms).

  .venv/bin/python bench/serving_cpu.py --out out/serving_cpu
  .venv/bin/python bench/serving_cpu.py --issue16 --out out/serving_issue16
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from modeldeploy_dev.wait import wait_until

HF_SERVE = (
    "import sys; from transformers.cli.transformers import main; "
    "sys.argv=['transformers']+sys.argv[1:]; sys.exit(main())"
)
SMALL_MIX = (
    "short:0.7:64:16,medium:0.25:128:32,long:0.05:256:64"  # HF's CPU paged path is slow: short outputs
)
ISSUE16_MIX = "short:0.7:64:64-128,medium:0.25:384:64-128,long:0.05:1536:64-128"
ISSUE16_SLO = "ttft=1.5,tpot=0.15"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )


def wait(url: str, path: str, proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
        return httpx.get(url + path, timeout=5).status_code == 200

    try:
        wait_until(ready, timeout_s, 0.5, f"{url}{path}", ignore=(httpx.TransportError,))
    except TimeoutError as e:
        raise RuntimeError(f"{url} not ready in {timeout_s} s") from e


def bench(*args: str) -> None:
    cmd = [sys.executable, "-m", "modeldeploy", "bench", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", default="out/tiny")
    p.add_argument("--model30m", default="out/llama30m")
    p.add_argument(
        "--model30m-2k", default="out/llama30m_2k", help="--issue16: the 30M model, 2048 positions"
    )
    p.add_argument("--out", default="bench/results/serving_cpu")
    p.add_argument("--rates", default="0.25,0.5,1,2,4")
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--skip", action="append", default=[], choices=["compare", "capacity", "tiny", "md30m"])
    p.add_argument("--start-rate", type=float, default=0.5, help="side-by-side capacity search: first probe")
    p.add_argument(
        "--threads", type=int, default=None, help="OMP_NUM_THREADS for both servers (default: torch's)"
    )
    p.add_argument(
        "--hf-capacity", action="store_true", help="also search transformers serve's capacity (slow)"
    )
    p.add_argument("--issue16", action="store_true", help="the long-prompt mix, SLO and stages (see above)")
    p.add_argument("--hf-threads", type=int, default=1, help="--issue16: OMP_NUM_THREADS of transformers")
    p.add_argument("--queue-budget", type=float, default=1.5, help="--issue16: our server's --queue-budget")
    p.add_argument("--duration", type=float, default=60, help="--issue16: seconds of arrivals per rate")
    a = p.parse_args()
    if a.issue16:
        return issue16(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    if not Path(a.tiny, "config.json").exists():
        subprocess.run([py, "-m", "modeldeploy", "tiny-model", a.tiny, "--seed", "0"], check=True)
    if not Path(a.model30m, "config.json").exists():
        subprocess.run(
            [py, "-m", "modeldeploy", "tiny-model", a.model30m, "--seed", "0", "--hidden-size", "576"]
            + ["--layers", "10", "--heads", "9", "--kv-heads", "3"],
            check=True,
        )
    procs = []
    threads = {"OMP_NUM_THREADS": str(a.threads)} if a.threads else {}
    try:
        md_port, hf_port, tiny_port = _port(), _port(), _port()
        md = start(
            [
                py,
                "-m",
                "modeldeploy",
                "serve",
                "--model",
                a.model30m,
                "--port",
                str(md_port),
                "--device",
                "cpu",
            ]
            + ["--served-model-name", "llama30m", "--bundle-id", "md-30m", "--max-queue", "256"],
            out / "md30m.log",
            threads,
        )
        procs.append(md)
        md_url = f"http://127.0.0.1:{md_port}"
        wait(md_url, "/health/ready", md, out / "md30m.log")
        eff = httpx.get(md_url + "/v1/bundle").json()["engine_config"]
        hf = start(
            [py, "-c", HF_SERVE, "serve", "--continuous-batching", "--device", "cpu", "--dtype", "float32"]
            + ["--port", str(hf_port), "--cb-block-size", str(eff["block_size"])]
            + [
                "--cb-num-blocks",
                str(eff["num_kv_blocks"]),
                "--cb-max-batch-tokens",
                str(eff["max_num_batched_tokens"]),
            ]
            + [str(Path(a.model30m).resolve())],
            out / "hf30m.log",
            {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **threads},
        )
        procs.append(hf)
        hf_url = f"http://127.0.0.1:{hf_port}"
        wait(hf_url, "/v1/models", hf, out / "hf30m.log")
        both = [md_url, hf_url, "--name", "modeldeploy", "--name", "transformers", "--no-ignore-eos"]
        common = ["--tokenizer", a.model30m, "--mix", SMALL_MIX, "--drain-timeout", "180", "--timeout", "300"]
        if "compare" not in a.skip:
            bench(
                *both,
                *common,
                "--rates",
                a.rates,
                "--requests",
                str(a.requests),
                "--json",
                str(out / "compare.json"),
                "--plot",
                str(out / "compare.png"),
            )
        if "capacity" not in a.skip:
            for tag, slo in (("default_slo", "ttft=1,tpot=0.1"),):
                bench(
                    *(both if a.hf_capacity else [md_url, "--no-ignore-eos"]),
                    *common,
                    "--find-capacity",
                    "--start-rate",
                    str(a.start_rate),
                    "--max-rate",
                    "64",
                    "--requests",
                    str(a.requests),
                    "--duration",
                    "30",
                    "--search-steps",
                    "2",
                    "--slo",
                    slo,
                    "--json",
                    str(out / f"capacity_{tag}.json"),
                )
        hf.kill()
        if "md30m" not in a.skip:
            bench(
                md_url,
                "--find-capacity",
                "--tokenizer",
                a.model30m,
                "--requests",
                "60",
                "--duration",
                "20",
                "--json",
                str(out / "capacity_md30m_mix.json"),
                "--plot",
                str(out / "capacity_md30m_mix.png"),
            )
        md.kill()
        if "tiny" not in a.skip:
            tiny = start(
                [
                    py,
                    "-m",
                    "modeldeploy",
                    "serve",
                    "--model",
                    a.tiny,
                    "--port",
                    str(tiny_port),
                    "--device",
                    "cpu",
                ]
                + ["--served-model-name", "tiny", "--bundle-id", "demo-tiny", "--max-queue", "256"],
                out / "tiny.log",
            )
            procs.append(tiny)
            tiny_url = f"http://127.0.0.1:{tiny_port}"
            wait(tiny_url, "/health/ready", tiny, out / "tiny.log")
            bench(
                tiny_url,
                "--find-capacity",
                "--tokenizer",
                a.tiny,
                # 10 s of arrivals per probe: at 100+ req/s a 120-request probe is a burst, not a rate
                *("--start-rate", "64", "--max-rate", "2048", "--requests", "4000", "--duration", "10"),
                "--json",
                str(out / "capacity_tiny_mix.json"),
                "--plot",
                str(out / "capacity_tiny_mix.png"),
            )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    for f in sorted(out.glob("capacity_*.json")):
        print(f.name, json.dumps({k: v["rate"] for k, v in json.loads(f.read_text())["capacity"].items()}))
    return 0


def make_model(path: str) -> None:
    if not Path(path, "config.json").exists():
        subprocess.run(
            [sys.executable, "-m", "modeldeploy", "tiny-model", path, "--seed", "0", "--hidden-size", "576"]
            + ["--layers", "10", "--heads", "9", "--kv-heads", "3", "--max-positions", "2048"],
            check=True,
        )


def issue16(a: argparse.Namespace) -> int:
    """The long-prompt side by side: one compare run (interleaved per rate), both capacities, overload."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    a.model30m = a.model30m_2k  # 1536-token prompts + 128 outputs do not fit 1024 positions
    make_model(a.model30m)
    procs: list[subprocess.Popen] = []
    try:
        md_port, hf_port = _port(), _port()
        md = start(
            [py, "-m", "modeldeploy", "serve", "--model", a.model30m, "--port", str(md_port)]
            + ["--device", "cpu", "--served-model-name", "llama30m", "--bundle-id", "md-30m"]
            + ["--max-queue", "256", "--queue-budget", str(a.queue_budget)],
            out / "md30m.log",
        )
        procs.append(md)
        md_url = f"http://127.0.0.1:{md_port}"
        wait(md_url, "/health/ready", md, out / "md30m.log")
        eff = httpx.get(md_url + "/v1/bundle").json()["engine_config"]
        hf = start(
            [py, "-c", HF_SERVE, "serve", "--continuous-batching", "--device", "cpu", "--dtype", "float32"]
            + ["--port", str(hf_port), "--cb-block-size", str(eff["block_size"])]
            + ["--cb-num-blocks", str(eff["num_kv_blocks"])]
            + ["--cb-max-batch-tokens", str(eff["max_num_batched_tokens"])]
            + [str(Path(a.model30m).resolve())],
            out / "hf30m.log",
            {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": str(a.hf_threads)},
        )
        procs.append(hf)
        hf_url = f"http://127.0.0.1:{hf_port}"
        wait(hf_url, "/v1/models", hf, out / "hf30m.log")
        both = [md_url, hf_url, "--name", "modeldeploy", "--name", "transformers", "--no-ignore-eos"]
        common = ["--tokenizer", a.model30m, "--mix", ISSUE16_MIX, "--length-jitter", "0"]
        common += ["--slo", ISSUE16_SLO, "--drain-timeout", "300", "--timeout", "300", "--warmup", "2"]
        dur = ["--duration", str(a.duration)]
        if "compare" not in a.skip:
            bench(
                *both,
                *common,
                *dur,
                "--rates",
                a.rates,
                "--json",
                str(out / "compare.json"),
                "--plot",
                str(out / "compare.png"),
            )
        if "capacity" not in a.skip:
            bench(
                *both,
                *common,
                *dur,
                "--find-capacity",
                "--start-rate",
                str(a.start_rate),
                "--max-rate",
                "16",
                "--search-steps",
                "2",
                "--json",
                str(out / "capacity.json"),
            )
        hf.kill()
        cap = None if "capacity" in a.skip else json.loads((out / "capacity.json").read_text())["capacity"]
        if cap and cap["modeldeploy"]["rate"]:
            cap = cap["modeldeploy"]["rate"]
            bench(
                md_url,
                "--no-ignore-eos",
                *common,
                *dur,
                "--rates",
                f"{cap},{2 * cap}",
                "--json",
                str(out / "overload.json"),
            )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
