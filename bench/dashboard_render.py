"""Render the Grafana dashboard's panels with matplotlib from a real Prometheus (no Grafana here).

Grafana cannot be built or installed from the registries this project reaches (its server is
AGPL Go, not on PyPI/npm as a runnable), so this draws the same queries: two real `modeldeploy
serve` processes (stable: 4 slots, canary: 1 slot, so the canary is visibly slower), the
operator's per-object gauges (operator/controller/object_metrics.py, served from this process) moving
through Deploying -> Canary 25 % -> Canary 50 %, a real Prometheus scraping all three (labels as
the chart's monitors set them) and a closed-loop load split by the canary weight. Every panel
query of charts/modeldeploy-operator/dashboards/modeldeploy.json is run as a range query and
plotted in the dashboard's layout. The picture is labelled as a matplotlib rendering.

    .venv/bin/python bench/dashboard_render.py --seconds 90 --out bench/results/dashboard.png
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "charts" / "modeldeploy-operator" / "dashboards" / "modeldeploy.json"
NS, MD = "team-a", "chat"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model: str, bundle: str, slots: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "modeldeploy",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--served-model-name",
        "tiny",
        "--bundle-id",
        bundle,
        "--max-num-seqs",
        str(slots),
        "--log-level",
        "warning",
    ]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT), f"127.0.0.1:{port}"


def wait_ready(target: str) -> None:
    for _ in range(600):
        try:
            if httpx.get(f"http://{target}/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(target)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=90)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "dashboard.png")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from prometheus_client import start_http_server

    from modeldeploy.operator.controller.object_metrics import ObjectMetrics
    from modeldeploy_dev.prometheus import Prom

    tmp = Path(tempfile.mkdtemp(prefix="dashboard-render-"))
    model = str(tmp / "tiny")
    subprocess.run(
        [sys.executable, "-m", "modeldeploy", "tiny-model", model, "--arch", "llama", "--seed", "0"],
        check=True,
        capture_output=True,
    )
    stable_b, canary_b = "3f9a1c0e5b7d2a64", "8c2e4f6a1b3d5e70"
    procs = []
    stable_p, stable = serve(model, stable_b, 4, tmp / "stable.log")
    canary_p, canary = serve(model, canary_b, 1, tmp / "canary.log")
    procs += [stable_p, canary_p]
    op_port = free_port()
    op_server, _ = start_http_server(op_port, addr="127.0.0.1")
    md = {"metadata": {"namespace": NS, "name": MD}, "spec": {}}
    cond = [{"type": "Degraded", "status": "False", "reason": "AsExpected"}]
    objects = ObjectMetrics()  # what the operator's Controller keeps

    def phase(name: str, weight: int) -> None:
        objects.record(
            md,
            {
                "phase": name,
                "canaryWeight": weight,
                "stable": {"bundle": stable_b},
                "canary": {"bundle": canary_b},
                "conditions": cond,
            },
        )

    phase("Deploying", 0)
    pod = {"modeldeployment": MD}
    prom = Prom(
        tmp,
        {"stable": (stable, NS), "canary": (canary, NS), "operator": (f"127.0.0.1:{op_port}", "md-system")},
        labels={
            "stable": pod | {"pod": "chat-3f9a1c0e5b-x2k8p"},
            "canary": pod | {"pod": "chat-8c2e4f6a1b-q7m4d"},
        },
        honor_labels=("operator",),
    )
    weight = [0]
    stop = threading.Event()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                target = canary if rng.random() * 100 < weight[0] else stable
                body = {
                    "model": "tiny",
                    "prompt": f"hello {rng.random()}",
                    "max_tokens": rng.choice([16, 32, 64]),
                    "ignore_eos": True,
                    "stream": rng.random() < 0.5,
                }
                try:
                    c.post(f"http://{target}/v1/completions", json=body)
                except httpx.HTTPError:
                    pass

    try:
        wait_ready(stable)
        wait_ready(canary)
        prom.wait_ready()
        t_start = time.time()
        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        third = args.seconds / 3
        time.sleep(third)
        phase("Canary", 25)
        weight[0] = 25
        time.sleep(third)
        phase("Canary", 50)
        weight[0] = 50
        time.sleep(third)
        stop.set()
        for t in threads:
            t.join(60)
        t_end = time.time()
        prom.scraped_after(t_end, jobs=3)
        render(plt, prom.url, t_start, t_end, args.out)
    finally:
        stop.set()
        prom.stop()
        for p in procs:
            p.kill()
        op_server.shutdown()
    print(f"wrote {args.out}")
    return 0


def render(plt, url: str, t0: float, t1: float, out: Path) -> None:
    d = json.loads(DASHBOARD.read_text())
    subs = {"$namespace": NS, "$modeldeployment": MD, "$__rate_interval": "15s", "$ttft_slo": "0.5"}
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in d["panels"])
    fig = plt.figure(figsize=(18, rows * 0.5))
    fig.suptitle(
        f"{d['title']} ({NS}/{MD}) - matplotlib rendering of the dashboard's queries "
        "against a real Prometheus (not Grafana)",
        fontsize=11,
    )
    top, bottom, side = 0.94, 0.03, 0.03  # the grid inside the figure, as fractions
    for p in d["panels"]:
        g = p["gridPos"]
        cell_w, cell_h = (1 - 2 * side) / 24, (top - bottom) / rows
        left = side + g["x"] * cell_w + 0.025
        low = top - (g["y"] + g["h"]) * cell_h + 0.03
        ax = fig.add_axes((left, low, g["w"] * cell_w - 0.035, g["h"] * cell_h - 0.055))
        ax.set_title(p["title"], fontsize=9)
        ax.tick_params(labelsize=7)
        series = []
        for t in p["targets"]:
            q = t["expr"]
            for k, v in subs.items():
                q = q.replace(k, v)
            r = httpx.get(
                url + "/api/v1/query_range",
                params={"query": q, "start": t0, "end": t1, "step": 2},
                timeout=30,
            ).json()
            for s in r["data"]["result"]:
                label = t["legendFormat"]
                for k, v in s["metric"].items():
                    label = label.replace("{{" + k + "}}", v)
                xs = [float(x) - t0 for x, _ in s["values"]]
                ys = [float(y) for _, y in s["values"]]
                series.append((label, xs, ys))
        if p["type"] in ("stat", "table"):
            ax.axis("off")
            end = max((xs[-1] for _, xs, _ in series), default=0)  # series still present at the end
            text = "\n".join(
                lab if p["type"] == "stat" else f"{lab}: {ys[-1]:g}"
                for lab, xs, ys in series
                if xs[-1] == end
            )
            ax.text(
                0.5,
                0.4,
                text or "no data",
                ha="center",
                va="center",
                fontsize=9 if p["type"] == "table" else 14,
            )
            continue
        for label, xs, ys in series:
            style = "--" if label.startswith("canary") else "-"
            ax.plot(xs, ys, style, linewidth=1, label=label)
        ax.set_xlabel("s", fontsize=7)
        ax.set_ylabel(p["fieldConfig"]["defaults"]["unit"], fontsize=7)
        if series:
            ax.legend(fontsize=6, loc="upper left")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)


if __name__ == "__main__":
    raise SystemExit(main())
