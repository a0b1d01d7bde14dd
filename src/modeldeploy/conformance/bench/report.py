"""The evidence record (JSON), the summary table and the plot of one benchmark run.

The record carries everything needed to judge or redo the run: the client's settings, git
revision and command line, the workload and seed, the SLOs, each target's /v1/bundle (pins and
effective config), every rate's figures on both sides (client and server) and every request.
The plot needs matplotlib (`pip install 'modeldeploy[bench]'`); nothing else here does.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from modeldeploy.conformance.bench.runner import Bench
from modeldeploy.conformance.bench.server import Target

RECORD_KIND = "modeldeploy-bench/v1"


def git_revision() -> str | None:
    """The client's git revision (with -dirty), when it runs from a checkout."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def client_info(argv: list[str] | None = None) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("modeldeploy")
    except PackageNotFoundError:
        v = None
    return {
        "name": "modeldeploy bench",
        "version": v,
        "git_revision": git_revision(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "command": argv if argv is not None else sys.argv,
    }


def record(
    bench: Bench, started: str, compare: list[dict[str, Any]], argv: list[str] | None = None
) -> dict[str, Any]:
    cfg = bench.cfg
    settings = dataclasses.asdict(cfg)
    settings.pop("api_key", None)  # never write a credential into evidence
    settings["api_key_set"] = cfg.api_key is not None
    names = cfg.labels()
    return {
        "kind": RECORD_KIND,
        "started": started,
        "finished": now(),
        "client": client_info(argv),
        "settings": settings,
        "workload": {
            "source": "dataset" if cfg.dataset else "mix",
            "mix": [dataclasses.asdict(s) for s in cfg.mix] if not cfg.dataset else None,
            "dataset": cfg.dataset,
            "dataset_entries": len(bench.dataset) if bench.dataset else None,
            "token_counting": bench.counter.method,
            "seed": cfg.seed,
            "arrival": cfg.arrival,
            "burstiness": cfg.burstiness,
            "cancel_fraction": cfg.cancel_fraction,
            "endpoint": cfg.endpoint,
            "streamed": True,
        },
        "slo": cfg.slo,
        "targets": [target_dict(n, t, bench) for n, t in zip(names, bench.targets, strict=True)],
        "runs": bench.runs,
        "capacity": {
            n: {"rate": s.capacity, "fraction": cfg.capacity_fraction, "probes": s.probes}
            for n, s in bench.searches.items()
        },
        "compare": compare,
    }


def target_dict(name: str, t: Target, bench: Bench) -> dict[str, Any]:
    return {
        "name": name,
        "url": t.url,
        "model": t.model,
        "modeldeploy": t.is_modeldeploy,
        "has_metrics": t.has_metrics,
        "ignore_eos": bench.settings(t).ignore_eos,
        "bundle": t.bundle,  # /v1/bundle: pins and the effective engine configuration
    }


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_json(rec: dict[str, Any], path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rec, indent=1, default=str) + "\n")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}" if x >= 0.1 else f"{x * 1000:.1f}"


def _n(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def table(rec: dict[str, Any]) -> Table:
    t = Table(title="modeldeploy bench", show_lines=False)
    for col in (
        "url",
        "rate",
        "sent",
        "ok",
        "good %",
        "goodput r/s",
        "good tok/s",
        "check pass %",
        "out tok/s",
        "TTFT p50/p95 ms",
        "ITL p50/p95 ms",
        "TPOT ms",
        "srv queue/prefill/decode p50 ms",
        "KV peak",
        "run/wait peak",
        "preempt",
    ):
        t.add_column(col, justify="right" if col != "url" else "left")
    for run in sorted(rec["runs"], key=lambda r: (r["target"], r["rate"])):
        s, srv = run["summary"], run["server"] or {}
        ph = srv.get("phases", {})
        t.add_row(
            run["target"],
            f"{run['rate']:g}",
            str(s["requests"]),
            str(s["outcomes"].get("completed", 0)),
            _n(None if s["good_share"] is None else 100 * s["good_share"], ".0f"),
            _n(s["goodput_rps"]),
            _n(s["goodput_tok_s"], ".0f"),
            _n(None if s.get("check_pass_rate") is None else 100 * s["check_pass_rate"], ".0f"),
            _n(s["output_tok_s"], ".0f"),
            f"{_ms(s['ttft']['p50'])}/{_ms(s['ttft']['p95'])}",
            f"{_ms(s['itl']['p50'])}/{_ms(s['itl']['p95'])}",
            _ms(s["tpot"]["mean"]),
            "/".join(_ms(ph.get(k, {}).get("p50")) for k in ("queue", "prefill", "decode")) if ph else "-",
            _n(srv.get("kv_usage_peak")),
            f"{_n(srv.get('running_peak'), '.0f')}/{_n(srv.get('waiting_peak'), '.0f')}" if srv else "-",
            _n(srv.get("preemptions"), ".0f"),
        )
    return t


def print_report(rec: dict[str, Any], console: Console) -> None:
    console.print(table(rec))
    for name, cap in rec["capacity"].items():
        console.print(f"capacity of {name} at the SLO (good >= {cap['fraction']:.0%}): {cap['rate']:g} req/s")
    for c in rec["compare"]:
        for v in c["verdicts"]:
            if v["verdict"] in ("worse", "better"):
                console.print(f"[bold]{v['text']}[/bold]" if v["verdict"] == "worse" else v["text"])
    if rec["compare"]:
        quiet = sum(v["verdict"] == "no difference" for c in rec["compare"] for v in c["verdicts"])
        console.print(f"{quiet} metric/rate pairs show no difference beyond the margin")


def plot(rec: dict[str, Any], path: str) -> None:
    """Goodput, TTFT p50/p95 and ITL p50/p95 against offered rate; one line per URL, SLOs drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'modeldeploy[bench]'") from None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    slo = rec["slo"]
    for i, target in enumerate(rec["targets"]):
        runs = sorted((r for r in rec["runs"] if r["target"] == target["name"]), key=lambda r: r["rate"])
        if not runs:
            continue
        color = f"C{i}"
        x = [r["rate"] for r in runs]
        label = f"{target['name']} ({target['url']})"
        axes[0].plot(x, [r["summary"]["goodput_rps"] for r in runs], "o-", color=color, label=label)
        # What was really offered (a Poisson sample of a short window strays from the nominal rate).
        axes[0].plot(
            x,
            [r["summary"]["offered_rps"] for r in runs],
            ":",
            color=color,
            label=f"{target['name']} offered",
        )
        for ax, key in ((axes[1], "ttft"), (axes[2], "itl")):
            ax.plot(
                x, [r["summary"][key]["p95"] for r in runs], "o-", color=color, label=f"{target['name']} p95"
            )
            ax.plot(
                x, [r["summary"][key]["p50"] for r in runs], "s--", color=color, label=f"{target['name']} p50"
            )
    for ax, keys in ((axes[1], ("ttft", "ttft_p95", "ttft_p50")), (axes[2], ("itl", "tpot", "itl_p95"))):
        for k in keys:
            if k in slo:
                ax.axhline(slo[k], color="red", linestyle=":", label=f"SLO {k} {slo[k]:g}s")
    titles = ("goodput at SLO (req/s)", "TTFT (s)", "inter-token latency (s)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("offered rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"modeldeploy bench {rec['started']} "
        f"({rec['workload']['arrival']} arrivals, seed {rec['workload']['seed']})"
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
