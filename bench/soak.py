"""Soak (issue 39, item 4): `modeldeploy serve` on the real model for 30 minutes at 80 % of its
measured capacity, with random cancels and 1 % malformed requests, watched for what leaks.

  .venv/bin/python bench/soak.py [--rate 0.28] [--duration 1800] [--out soak.json]

What a slow leak looks like from outside, and what this samples every `--sample` seconds from the
server and its engine-core process (psutil) and from `/metrics`:

- resident memory (RSS) of each process: growth after warm-up must stay under 5 %;
- open file descriptors of each process: flat (a leaked socket or pipe per request shows here);
- `modeldeploy_kv_cache_usage_ratio`: back to 0 once the load stops (a cancelled stream that kept
  its blocks shows here);
- every answer's status: 0 x 5xx (from the load's per-request records and the malformed sender's).

The load is `modeldeploy bench` itself (open-loop Poisson, streamed chat, greedy, the 70/25/5 mix
of 64/384/1536-token prompts with 64-128 output tokens, `--cancel-fraction` of the streams closed by
the client right after their first token). Beside it a second open-loop stream sends malformed
requests at `--malformed` times the rate, cycling through the kinds in `malformed()`; each must be
answered 4xx. The default rate is 80 % of the float32 capacity at SLO that
bench/results/serving_real_cpu.md measured (0.354 req/s, TTFT <= 1.5 s and mean ITL <= 0.15 s).
Exits non-zero if any criterion fails. A bench, not a test: it runs 35 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from serving_real_cpu import wait_http

from modeldeploy_dev.real_model import cached_real_model

PY = sys.executable
MIX = "short:0.70:64:64-128,medium:0.25:384:64-128,long:0.05:1536:64-128"
CAPACITY = 0.354  # req/s, float32, bench/results/serving_real_cpu.md (2026-12-05)

JSON = "application/json"
HI = [{"role": "user", "content": "hi"}]


def malformed(model: str) -> list[tuple[str, bytes, str]]:
    """(name, raw body, content type): each something a client gets wrong, to be answered 4xx.
    All but the first two name the served model, so each is refused for its own fault."""

    def body(**fields: Any) -> bytes:
        return json.dumps({"model": model} | fields).encode()

    return [
        ("invalid JSON", b'{"model": "m", "messages": [', JSON),
        ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', JSON),
        ("no messages", body(max_tokens=8), JSON),
        ("max_tokens a string", body(messages=HI, max_tokens="8"), JSON),
        ("temperature -1", body(messages=HI, temperature=-1), JSON),
        ("n = 0", body(messages=HI, n=0), JSON),
        ("unknown role", body(messages=[{"role": "wizard", "content": "hi"}]), JSON),
        ("body is a list", b"[1, 2, 3]", JSON),
        ("form body", b"messages=hi", "application/x-www-form-urlencoded"),
        ("adapter with a path", body(model="../../etc/passwd", messages=HI), JSON),
        ("unknown model", body(model="no-such-model", messages=HI), JSON),
        ("max_tokens over the context", body(messages=HI, max_tokens=10**7), JSON),
    ]


@dataclass
class Sample:
    t: float  # seconds since the load started (negative: before it)
    rss: dict[str, int]  # bytes, by process role
    fds: dict[str, int]
    threads: dict[str, int]
    kv_usage: float | None
    running: float | None
    waiting: float | None
    load1: float


def metric(text: str, name: str) -> float | None:
    """The first sample of `name` in a Prometheus text page (our gauges carry one series)."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def processes(server: psutil.Process) -> dict[str, psutil.Process]:
    """The server and its engine core (its one Python child, `serve`'s default), by role."""
    out = {"server": server}
    kids = [p for p in server.children(recursive=True) if "python" in (p.name() or "")]
    if kids:
        out["engine_core"] = max(kids, key=lambda p: p.memory_info().rss)
    return out


def sample(url: str, procs: dict[str, psutil.Process], t0: float) -> Sample:
    page = ""
    try:
        page = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        pass
    rss, fds, threads = {}, {}, {}
    for role, p in procs.items():
        with p.oneshot():
            rss[role], fds[role], threads[role] = p.memory_info().rss, p.num_fds(), p.num_threads()
    return Sample(
        round(time.monotonic() - t0, 1),
        rss,
        fds,
        threads,
        metric(page, "modeldeploy_kv_cache_usage_ratio"),
        metric(page, "modeldeploy_requests_running"),
        metric(page, "modeldeploy_requests_waiting"),
        os.getloadavg()[0],
    )


def malformed_sender(url: str, rate: float, seconds: float, seed: int, out: list[dict[str, Any]]) -> None:
    """Open-loop Poisson malformed requests for `seconds`, cycling through `malformed()` (bounded)."""
    kinds = malformed(httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"])
    rng = random.Random(seed)
    t0 = time.monotonic()
    i = 0
    with httpx.Client(base_url=url, timeout=30) as c:
        while True:
            t = rng.expovariate(rate)
            if time.monotonic() - t0 + t > seconds or i >= 10_000:
                return
            time.sleep(t)
            name, raw, ctype = kinds[i % len(kinds)]
            i += 1
            start = time.monotonic()
            try:
                r = c.post("/v1/chat/completions", content=raw, headers={"content-type": ctype})
                status, msg = r.status_code, r.text[:200]
            except httpx.HTTPError as e:
                status, msg = 0, f"{type(e).__name__}: {e}"[:200]
            took, at = round(time.monotonic() - start, 3), round(start - t0, 1)
            out.append({"kind": name, "t": at, "status": status, "seconds": took, "body": msg})


def warm(url: str) -> None:
    """One completed stream, one cancelled after its first chunk, one malformed request; then 2 s."""
    with httpx.Client(base_url=url, timeout=60) as c:
        name = c.get("/v1/models").json()["data"][0]["id"]
        req = {"model": name, "messages": HI, "max_tokens": 8, "stream": True}
        for cancel in (False, True):
            with c.stream("POST", "/v1/chat/completions", json=req) as r:
                for _ in r.iter_lines():
                    if cancel:
                        break
        c.post("/v1/chat/completions", content=b"{", headers={"content-type": JSON})
    time.sleep(2)


def fd_targets(p: psutil.Process) -> dict[str, int]:
    """Open descriptors by kind (socket, pipe, anon_inode:..., or the file path), read from /proc."""
    out: dict[str, int] = {}
    for fd in Path(f"/proc/{p.pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed while we looked
            continue
        kind = target.split(":[")[0] if ":[" in target else target
        out[kind] = out.get(kind, 0) + 1
    return out


def median_in(samples: list[Sample], role: str, lo: float, hi: float) -> float | None:
    xs = [s.rss[role] for s in samples if lo <= s.t < hi and role in s.rss]
    return statistics.median(xs) if xs else None


def count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def access_log(path: Path) -> list[dict[str, Any]]:
    """The server's per-request JSON lines (the third witness of every status it answered)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith('{"ts"'):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def judge(
    args: argparse.Namespace, samples: list[Sample], bench: dict, bad: list[dict], server_log: list[dict]
) -> dict[str, Any]:
    """The four criteria, each with the figures it was read from."""
    end = args.duration
    roles = sorted({r for s in samples for r in s.rss})
    rss: dict[str, Any] = {}
    for role in roles:
        base = median_in(samples, role, args.warmup, args.warmup + 120)
        last = median_in(samples, role, end - 120, end)
        peak = max(s.rss.get(role, 0) for s in samples if s.t >= args.warmup)
        rss[role] = {
            "after_warmup_mib": base and round(base / 2**20, 1),
            "last_2min_mib": last and round(last / 2**20, 1),
            "peak_mib": round(peak / 2**20, 1),
            "growth": base and last and round(last / base - 1, 4),
        }
    loaded = [s for s in samples if s.t >= args.warmup]
    idle = [s for s in samples if s.t > end + args.drain]
    fds = {
        r: {
            "idle_before": samples[0].fds.get(r),
            "under_load_min_max": [min(s.fds[r] for s in loaded), max(s.fds[r] for s in loaded)],
            "idle_after": idle[-1].fds.get(r) if idle else None,
        }
        for r in roles
    }
    statuses = count(str(r["status"]) for run in bench.get("runs", []) for r in run["requests"])
    bad_statuses = count(str(b["status"]) for b in bad)
    logged = count(str(e["status"]) for e in server_log)
    fives = sum(n for c in (statuses, bad_statuses, logged) for s, n in c.items() if s.startswith("5"))
    growths = [v["growth"] for v in rss.values() if v["growth"] is not None]
    checks = {
        "rss_growth_under_5pct": bool(growths) and max(growths) < 0.05,
        # an open stream holds a socket, so only the idle ends compare like with like
        "fds_flat": all(
            v["idle_after"] is not None and v["idle_after"] <= v["idle_before"] for v in fds.values()
        ),
        "kv_zero_at_idle": bool(idle) and all(s.kv_usage == 0 for s in idle),
        "no_5xx": fives == 0,
        "malformed_all_4xx": bool(bad) and all(400 <= b["status"] < 500 for b in bad),
    }
    return {
        "rss": rss,
        "fds": fds,
        "kv_usage_at_idle": [s.kv_usage for s in idle],
        "statuses": statuses,
        "malformed_statuses": bad_statuses,
        "server_log_statuses": logged,
        "five_xx": fives,
        "checks": checks,
        "passed": all(checks.values()),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = Path(args.model) if args.model else cached_real_model()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}"
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
    lifetime = int(args.duration + args.drain + args.idle + 900)
    serve = [PY, "-m", "modeldeploy", "serve", "--model", str(model), "--port", str(args.port)]
    serve += ["--max-num-seqs", "32", "--max-model-len", "2048"]
    log = open(work / "serve.log", "wb")  # noqa: SIM115 - the child's log, closed below
    proc = subprocess.Popen(["timeout", str(lifetime), *serve], stdout=log, stderr=subprocess.STDOUT, env=env)
    samples: list[Sample] = []
    bad: list[dict[str, Any]] = []
    try:
        wait_http(f"{url}/health/ready", proc, 300)  # bounded: until the model has loaded
        server = psutil.Process(proc.pid).children()[0]  # `timeout` -> python -m modeldeploy serve
        procs = processes(server)
        bench_json = work / "bench.json"
        cmd = [PY, "-m", "modeldeploy", "bench", url, "--endpoint", "chat", "--mix", MIX]
        cmd += ["--rates", f"{args.rate:g}", "--duration", str(args.duration), "--warmup", "2"]
        cmd += ["--drain-timeout", str(args.drain), "--cancel-fraction", str(args.cancel_fraction)]
        cmd += ["--tokenizer", str(model), "--temperature", "0", "--ignore-eos", "--seed", str(args.seed)]
        cmd += ["--slo", "ttft=1.5,tpot=0.15", "--json", str(bench_json)]
        warm(url)  # lazily opened descriptors (pools, the first stream's) belong to the baseline
        t0 = time.monotonic()
        samples.append(sample(url, procs, t0))
        fd_kinds = {"idle_before": {r: fd_targets(p) for r, p in procs.items()}}
        load = subprocess.Popen(cmd, stdout=open(work / "bench.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
        sender = threading.Thread(
            target=malformed_sender, args=(url, args.rate * args.malformed, args.duration, args.seed, bad)
        )
        sender.start()
        stop_at = t0 + args.duration + args.drain + args.idle + 120
        while time.monotonic() < stop_at:  # bounded; the idle tail starts once the load exits
            time.sleep(args.sample)
            samples.append(sample(url, procs, t0))
            if load.poll() is not None and time.monotonic() - t0 > args.duration + args.drain + args.idle:
                break
        load.wait(timeout=60)
        sender.join(timeout=60)
        fd_kinds["idle_after"] = {r: fd_targets(p) for r, p in procs.items()}
        bench = json.loads(bench_json.read_text()) if bench_json.exists() else {}
        return {
            "settings": vars(args) | {"model": str(model), "serve": serve, "bench": cmd},
            "load_exit": load.returncode,
            "summary": (bench.get("runs") or [{}])[0].get("summary"),
            "result": judge(args, samples, bench, bad, access_log(work / "serve.log")),
            "fd_kinds": fd_kinds,
            "malformed": bad,
            "samples": [asdict(s) for s in samples],
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model dir (default: the cached SmolLM2 float32)")
    ap.add_argument("--rate", type=float, default=round(0.8 * CAPACITY, 3), help="req/s (80%% of capacity)")
    ap.add_argument("--duration", type=float, default=1800, help="seconds of arrivals")
    ap.add_argument("--warmup", type=float, default=300, help="seconds before the RSS baseline")
    ap.add_argument("--drain", type=float, default=120, help="seconds the load waits for its last streams")
    ap.add_argument("--idle", type=float, default=30, help="seconds sampled at idle after the drain")
    ap.add_argument("--cancel-fraction", type=float, default=0.1, help="streams closed after the 1st token")
    ap.add_argument("--malformed", type=float, default=0.01, help="malformed requests per normal request")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the server")
    ap.add_argument("--port", type=int, default=8790)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/soak", help="logs and the load's JSON")
    ap.add_argument("--out", default=None, help="write the JSON result here")
    args = ap.parse_args(argv)
    if args.warmup + 240 > args.duration:
        ap.error("--duration must exceed --warmup by at least 240 s (two 2-minute RSS windows)")
    res = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({"summary": res["summary"], "result": res["result"]}, indent=1))
    return 0 if res["result"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
