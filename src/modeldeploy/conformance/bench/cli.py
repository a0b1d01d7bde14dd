"""`modeldeploy bench URL [URL ...]`: open-loop goodput at SLO, evidence record, plot, compare.

Examples:
  modeldeploy bench http://127.0.0.1:8000 --rates 1,2,4,8 --duration 30 \
      --json out/bench.json --plot out/bench.png
  modeldeploy bench http://127.0.0.1:8000 --find-capacity --slo ttft=1,tpot=0.1
  modeldeploy bench http://a:8000 http://b:8000 --rates 2,4 --requests 100   # compare: B against A
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from modeldeploy.conformance.bench import report, stats
from modeldeploy.conformance.bench import workload as W
from modeldeploy.conformance.bench.arrivals import KINDS
from modeldeploy.conformance.bench.runner import Bench, BenchConfig
from modeldeploy.conformance.bench.server import probe


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    assert __doc__ is not None  # this module's docstring is the epilog's text
    p.epilog = __doc__.split("\n", 2)[2]
    p.add_argument(
        "urls", nargs="+", metavar="URL", help="OpenAI-compatible server(s); 2+ URLs: compare with the first"
    )
    p.add_argument("--name", action="append", default=[], help="label per URL, in order (default A, B, ...)")
    p.add_argument("--api-key", default=os.environ.get("MODELDEPLOY_API_KEY"), help="bearer token for /v1/*")
    p.add_argument("--model", default=None, help="model name (default: first in /v1/models of each URL)")
    p.add_argument(
        "--endpoint",
        choices=["completions", "chat", "responses"],
        default="completions",
        help="streamed API to drive",
    )
    g = p.add_argument_group("rates and arrivals")
    g.add_argument("--rates", default=None, help="comma-separated offered rates in requests/s, e.g. 1,2,4,8")
    g.add_argument("--find-capacity", action="store_true", help="search the highest rate meeting the SLO")
    g.add_argument(
        "--capacity-fraction", type=float, default=0.9, help="a rate passes when good/sent >= this"
    )
    g.add_argument("--start-rate", type=float, default=1.0, help="--find-capacity: first probe (req/s)")
    g.add_argument("--max-rate", type=float, default=256.0, help="--find-capacity: never probe above this")
    g.add_argument("--search-steps", type=int, default=3, help="--find-capacity: bisection steps")
    g.add_argument("--arrival", choices=KINDS, default="poisson")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (< 1 burstier than Poisson)")
    g.add_argument("--duration", type=float, default=None, help="seconds of arrivals per rate")
    g.add_argument(
        "--requests", type=int, default=None, help="requests per rate (default 50 without --duration)"
    )
    g.add_argument("--warmup", type=int, default=4, help="unrecorded requests per URL before the first rate")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--drain-timeout", type=float, default=120.0, help="seconds stragglers may run after the last send"
    )
    g.add_argument("--timeout", type=float, default=120.0, help="per-read timeout of a stream, seconds")
    g.add_argument("--max-inflight", type=int, default=1024, help="client connection pool size")
    w = p.add_argument_group("workload")
    w.add_argument(
        "--mix", default=None, help="name:weight:prompt_tokens:output_tokens,... (default 70/25/5)"
    )
    w.add_argument(
        "--length-jitter", type=float, default=0.1, help="synthetic lengths: up to this share shorter"
    )
    w.add_argument(
        "--dataset", default=None, help="JSONL of prompts/chats (optional output_tokens) or ShareGPT JSON"
    )
    w.add_argument("--tokenizer", default=None, help="dir with tokenizer.json: count tokens (else estimate)")
    eos = w.add_mutually_exclusive_group()
    eos.add_argument(
        "--ignore-eos", dest="ignore_eos", action="store_true", default=None, help="send ignore_eos"
    )
    eos.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="never send ignore_eos")
    w.add_argument(
        "--cancel-fraction", type=float, default=0.0, help="share of streams cancelled after 1st token"
    )
    w.add_argument("--temperature", type=float, default=0.0)
    s = p.add_argument_group("SLOs and compare")
    s.add_argument(
        "--slo",
        action="append",
        default=[],
        help=(
            "ttft=S,tpot=S,itl=S,e2e=S per request (goodput); "
            "ttft_p95=S, itl_p99=S, error_rate=F ... aggregate"
        ),
    )
    s.add_argument(
        "--goodput", default=None, help="vLLM style per-request SLOs in ms: ttft:500,tpot:50,e2el:5000"
    )
    s.add_argument("--bootstrap", type=int, default=400, help="bootstrap resamples per compared metric")
    s.add_argument("--margin", type=float, default=0.05, help="verdict needs the 95 %% CI beyond this change")
    o = p.add_argument_group("output")
    o.add_argument("--json", dest="json_out", default=None, help="write the JSON evidence record here")
    o.add_argument(
        "--plot", default=None, help="write a PNG plot here (needs matplotlib: modeldeploy[bench])"
    )
    o.add_argument("--scrape-interval", type=float, default=0.5, help="seconds between /metrics peak samples")


def _rates(text: str | None) -> list[float]:
    if not text:
        return []
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--rates: {text!r} is not a comma-separated list of numbers") from None


def build_config(args: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig(
        urls=args.urls,
        names=args.name,
        api_key=args.api_key,
        model=args.model,
        endpoint=args.endpoint,
        rates=_rates(args.rates),
        find_capacity=args.find_capacity,
        capacity_fraction=args.capacity_fraction,
        start_rate=args.start_rate,
        max_rate=args.max_rate,
        search_steps=args.search_steps,
        arrival=args.arrival,
        burstiness=args.burstiness,
        duration_s=args.duration,
        requests=args.requests,
        warmup=args.warmup,
        seed=args.seed,
        mix=W.parse_mix(args.mix) if args.mix else W.DEFAULT_MIX,
        length_jitter=args.length_jitter,
        dataset=args.dataset,
        tokenizer=args.tokenizer,
        ignore_eos=args.ignore_eos,
        cancel_fraction=args.cancel_fraction,
        slo=stats.parse_slo(args.slo, args.goodput),
        temperature=args.temperature,
        timeout_s=args.timeout,
        drain_timeout_s=args.drain_timeout,
        max_inflight=args.max_inflight,
        scrape_interval_s=args.scrape_interval,
        bootstrap=args.bootstrap,
        margin=args.margin,
    )
    cfg.validate()
    return cfg


class Display:
    """Live progress on a terminal; one line per rate (and per capacity probe) otherwise."""

    def __init__(self, console: Console):
        self.console = console
        self.live = console.is_terminal
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("in flight {task.fields[inflight]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task: Any = None

    def __enter__(self) -> Display:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.progress.stop()

    def __call__(self, kind: str, **d: Any) -> None:
        if kind == "rate_start" and self.live:
            self.task = self.progress.add_task(f"{d['name']} @ {d['rate']:g} req/s", total=d["n"], inflight=0)
        elif kind == "tick" and self.live and self.task is not None:
            self.progress.update(self.task, completed=d["sent"], inflight=d["inflight"])
        elif kind == "rate_done":
            if self.live and self.task is not None:
                self.progress.remove_task(self.task)
                self.task = None
            s = d["summary"]
            ttft, itl = s["ttft"], s["itl"]
            good = "-" if s["good_share"] is None else f"{s['good_share'] * 100:.0f}%"
            rate = s.get("check_pass_rate")
            checks = "" if rate is None else f"checks passed {rate * 100:.0f}% of {s['checked']} "
            self.console.print(
                f"{d['name']} rate {d['rate']:g}: sent {s['requests']} "
                f"ok {s['outcomes'].get('completed', 0)} good {good} {checks}"
                f"goodput {s['goodput_rps']:.2f} req/s {s['goodput_tok_s']:.0f} tok/s | "
                f"TTFT p50 {_s(ttft['p50'])} p95 {_s(ttft['p95'])} | "
                f"ITL p50 {_s(itl['p50'])} p95 {_s(itl['p95'])}",
                highlight=False,
            )
        elif kind == "probe":
            self.console.print(
                f"{d['name']} probe {d['rate']:g} req/s: {'pass' if d['ok'] else 'fail'} ({d['why']})"
            )
        elif kind == "warmup" and d["n"]:
            self.console.print(f"{d['name']}: warm-up, {d['n']} requests", highlight=False)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}s"


def main(args: argparse.Namespace) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=220)  # piped: the table stays whole
    err = Console(stderr=True)
    try:
        cfg = build_config(args)
        if args.plot:
            import matplotlib  # noqa: F401 - fail before the run, not after it
    except ValueError as e:
        err.print(f"modeldeploy bench: error: {e}", highlight=False)
        return 2
    except ImportError:
        err.print("modeldeploy bench: error: --plot needs matplotlib: pip install 'modeldeploy[bench]'")
        return 2
    try:
        targets = [probe(u, cfg.api_key, cfg.model) for u in cfg.urls]
    except ValueError as e:
        err.print(f"modeldeploy bench: error: {e}", highlight=False)
        return 2
    except httpx.HTTPError as e:
        err.print(f"modeldeploy bench: error: cannot reach the server: {e}", highlight=False)
        return 2
    started = report.now()
    try:
        bench = Bench(cfg, targets)
    except ValueError as e:
        err.print(f"modeldeploy bench: error: {e}", highlight=False)
        return 2
    with Display(console) as display:
        bench.progress = display
        bench.run()
    rec = report.record(bench, started, bench.compare())
    report.print_report(rec, console)
    if args.json_out:
        report.write_json(rec, args.json_out)
        console.print(f"evidence written to {args.json_out}")
    if args.plot:
        report.plot(rec, args.plot)
        console.print(f"plot written to {args.plot}")
    return 0
