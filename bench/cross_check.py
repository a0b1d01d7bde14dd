"""Cross-check `modeldeploy bench` against an external client (guidellm) on the same server.

Same server process, same workload (synthetic prompts of P tokens, exactly O output tokens
with ignore_eos, counted with the model's own tokenizer), same rate and request count
(constant arrivals by default: two Poisson samples of 40 requests offer different loads), same
endpoint (/v1/responses: guidellm's chat/completions bodies carry vLLM's
`stream_options.continuous_usage_stats`, which our strict schema refuses). The two clients
alternate (md, guidellm, md, guidellm ...) so machine noise hits both, and the server's own
TTFT / inter-token histograms are scraped around every run: when the clients disagree, the
server-side figures say whether the server was slower or the client's measurement differs.

Definitions differ by name, not by meaning: our TPOT = (e2e - TTFT) / (output tokens - 1) is
guidellm's "inter_token_latency"; guidellm's "time_per_output_token" is e2e / output tokens.

  python -m venv /tmp/gl && /tmp/gl/bin/pip install guidellm==0.8.1   # its own venv: it pins its own deps
  .venv/bin/python bench/cross_check.py --guidellm /tmp/gl/bin/guidellm --model out/tiny --out bench/results
  ... --pin   # server on CPU 1, clients on CPU 0 (clients cannot slow the server: serving_cpu.md)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import httpx

from modeldeploy.conformance import measures as M
from modeldeploy.conformance.bench import workload as W
from modeldeploy.conformance.bench.report import git_revision
from modeldeploy.conformance.bench.runner import Bench, BenchConfig
from modeldeploy.conformance.bench.server import probe
from modeldeploy.conformance.prom import Metrics
from modeldeploy.operator.rollout.progression import RFC3339
from modeldeploy_dev.serve_process import serve


def server_side(url: str, before: Metrics, after: Metrics) -> dict[str, float | None]:
    """The server's own mean TTFT and inter-token gap over one client's run."""
    out = {}
    for key, name in (("ttft", M.TTFT), ("itl", M.ITL), ("queue", M.QUEUE), ("prefill", M.PREFILL)):
        h = M.Histogram.from_metrics(after, name).since(M.Histogram.from_metrics(before, name))
        out[f"server_{key}_mean_s"] = h.mean
    return out


def scrape(url: str) -> Metrics:
    return Metrics(httpx.get(url + "/metrics", timeout=10).text)


def run_md(url: str, args: argparse.Namespace, seed: int) -> dict[str, float | None]:
    cfg = BenchConfig(
        urls=[url],
        rates=[args.rate],
        requests=args.requests,
        endpoint="responses",
        mix=(W.Shape("fixed", 1.0, args.prompt_tokens, args.output_tokens),),
        length_jitter=0.0,
        arrival=args.arrival,
        tokenizer=args.model,
        ignore_eos=True,
        warmup=0,
        seed=seed,
        bootstrap=10,
        scrape_interval_s=args.scrape_interval,
    )
    before = scrape(url)
    bench = Bench(cfg, [probe(url)])
    bench.run()
    s = bench.runs[0]["summary"]
    return {
        "ttft_mean_s": s["ttft"]["mean"],
        "ttft_p50_s": s["ttft"]["p50"],
        "tpot_mean_s": s["tpot"]["mean"],
        "output_tok_s": s["output_tok_s"],
        "completed": s["outcomes"].get("completed", 0),
        "output_tokens_mean": s["output_tokens_mean"],
        **server_side(url, before, scrape(url)),
    }


def run_guidellm(url: str, args: argparse.Namespace, seed: int, work: Path) -> dict[str, float | None]:
    scenario = {
        "metadata": {"name": "modeldeploy-cross-check", "description": "same workload as modeldeploy bench"},
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": url,
                "model": "tiny",
                "request_format": "/v1/responses",
                "api_routes": {"/health": "health/ready"},
                "extras": {"body": {"temperature": 0}},
            },
            "profile": {"kind": args.arrival, "rate": [args.rate]},
            "constraints": [{"kind": "max_requests", "count": args.requests}],
            "tokenizer": {"kind": "huggingface_auto", "model": str(Path(args.model).resolve())},
            "data": [
                {
                    "kind": "synthetic_text",
                    "prompt_tokens": args.prompt_tokens,
                    "output_tokens": args.output_tokens,
                }
            ],
            "seed": {"kind": "static", "value": seed},
            "outputs": [{"kind": "json", "path": str(work / f"guidellm-{seed}.json")}],
        },
    }
    spec = work / f"scenario-{seed}.json"
    spec.write_text(json.dumps(scenario))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    before = scrape(url)
    # cwd outside the checkout: a folder named `operator` there would shadow the standard library
    r = subprocess.run(
        [args.guidellm, "run", "-c", str(spec), "--disable-progress"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    if r.returncode != 0:
        raise RuntimeError(f"guidellm failed ({r.returncode}): {r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    m = json.loads((work / f"guidellm-{seed}.json").read_text())["benchmarks"][0]["metrics"]
    ok = m["time_to_first_token_ms"]["successful"]
    return {
        "ttft_mean_s": ok["mean"] / 1000,
        "ttft_p50_s": ok["median"] / 1000,
        "tpot_mean_s": m["inter_token_latency_ms"]["successful"]["mean"] / 1000,  # = our TPOT definition
        "output_tok_s": m["output_tokens_per_second"]["successful"]["mean"],
        "completed": ok["count"],
        "output_tokens_mean": m["output_token_count"]["successful"]["mean"],
        "guidellm_time_per_output_token_mean_s": m["time_per_output_token_ms"]["successful"]["mean"] / 1000,
        **server_side(url, before, scrape(url)),
    }


def mean(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return sum(v) / len(v) if v else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--guidellm", default="guidellm", help="the guidellm executable (its own venv)")
    p.add_argument(
        "--model", default="out/tiny", help="model dir (made with `modeldeploy tiny-model` if absent)"
    )
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument(
        "--arrival", choices=["constant", "poisson"], default="constant", help="same load for both"
    )
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument(
        "--scrape-interval", type=float, default=0.5, help="modeldeploy bench's /metrics peak sampling"
    )
    p.add_argument("--out", default="bench/results")
    p.add_argument(
        "--pin",
        action="store_true",
        help="server on CPU 1 (one torch thread), both clients on CPU 0: "
        "a client's own CPU cannot slow the server",
    )
    args = p.parse_args()
    if args.pin:
        if len(os.sched_getaffinity(0)) < 2:
            p.error("--pin needs 2 CPUs")
        os.sched_setaffinity(0, {0})  # this process (our client) and guidellm, which inherits it
    if not Path(args.model, "config.json").exists():
        subprocess.run(
            [sys.executable, "-m", "modeldeploy", "tiny-model", args.model, "--seed", "0"], check=True
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="md-crosscheck-") as tmp:
        work = Path(tmp)
        proc, url = serve(
            args.model,
            work / "serve.log",
            "--served-model-name",
            "tiny",
            "--max-num-seqs",
            "16",
            pin=args.pin,
        )
        try:
            rounds = []
            for i in range(args.rounds):
                md = run_md(url, args, seed=i)
                print(f"round {i + 1} modeldeploy bench: {md}", flush=True)
                gl = run_guidellm(url, args, seed=i, work=work)
                print(f"round {i + 1} guidellm:          {gl}", flush=True)
                rounds.append({"modeldeploy_bench": md, "guidellm": gl})
        finally:
            proc.kill()
            proc.wait(10)
    keys = (
        "ttft_mean_s",
        "ttft_p50_s",
        "tpot_mean_s",
        "output_tok_s",
        "server_ttft_mean_s",
        "server_itl_mean_s",
    )
    summary = {
        k: {
            "modeldeploy_bench": mean([r["modeldeploy_bench"][k] for r in rounds]),
            "guidellm": mean([r["guidellm"][k] for r in rounds]),
        }
        for k in keys
    }
    for v in summary.values():
        a, b = v["modeldeploy_bench"], v["guidellm"]
        v["guidellm_over_md"] = b / a if a and b is not None else None
    record = {
        "date": datetime.now(UTC).strftime(RFC3339),
        "git_revision": git_revision(),
        "command": sys.argv,
        "guidellm": subprocess.run(
            [args.guidellm, "--version"], capture_output=True, text=True
        ).stdout.strip(),
        "settings": vars(args),
        "rounds": rounds,
        "summary": summary,
    }
    (out / "cross_check.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
