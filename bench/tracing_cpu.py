"""Tracing on vs off: the engine's step time at batch 32 (issue 19: must differ by under 2 %).

Two real servers in this process (real uvicorn, tiny model, max_num_seqs=32): one built with
OTEL_EXPORTER_OTLP_ENDPOINT unset (no tracer), one exporting every request's spans to an OTLP/HTTP
receiver running in its own process. A load client in another process (bench/server_cpu.py's raw
SSE client) keeps 32 streams in flight; the step time is the wall time of the measured run
divided by the engine steps it took (`stats().steps_total`), so it includes whatever the server's
event loop (spans, logs) takes from the engine thread under the GIL. Rounds alternate off/on.

    .venv/bin/python bench/tracing_cpu.py --rounds 5 --out bench/results/server_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTION = "## Tracing on vs off (issue 19)"
CLIENT = (
    "import asyncio, json, sys; sys.path.insert(0, {here!r}); import server_cpu as b; "
    "r = asyncio.run(b.run_server({url!r}, {n}, {c}, {tokens})); "
    "print(json.dumps({{'tokens': r['tokens'], 'wall_s': r['wall_s']}}))"
)


def server(model: str, traced: bool, endpoint: str) -> object:
    from modeldeploy.runtime import EngineConfig
    from modeldeploy.runtime.server.config import ServerConfig
    from modeldeploy_dev.harness import ThreadedServer

    if traced:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    else:
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    ecfg = EngineConfig(model=model, device="cpu", dtype="float32", max_num_seqs=32, bundle_id="bench")
    s = ThreadedServer(ServerConfig(engine=ecfg, served_model_name="bench", max_queue=256))
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return s


def tracer(s: object) -> object:
    from modeldeploy.runtime.server.evidence import EvidenceMiddleware

    [mw] = [m for m in s.app.user_middleware if m.cls is EvidenceMiddleware]  # type: ignore[attr-defined]
    return mw.kwargs["tracing"]


def one_round(s: object, n: int, c: int, tokens: int) -> dict:
    """Load from another process while a thread here samples the engine every 20 ms; the step
    time counts only intervals that begin and end with all `c` sequences running (batch 32)."""
    eng = s.ctx.engine  # type: ignore[attr-defined]
    code = CLIENT.format(here=str(HERE), url=s.url, n=n, c=c, tokens=tokens)  # type: ignore[attr-defined]
    samples: list[tuple[float, int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            st = eng.stats()
            samples.append((time.perf_counter(), st.steps_total, st.num_running))
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    before, cpu0 = eng.stats().steps_total, resource.getrusage(resource.RUSAGE_SELF)
    t.start()
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, check=True
        )
    finally:
        done.set()
        t.join()
    cpu1, all_steps = resource.getrusage(resource.RUSAGE_SELF), eng.stats().steps_total - before
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    wall = steps = 0.0
    for (t0, s0, r0), (t1, s1, r1) in zip(samples, samples[1:], strict=False):
        if r0 == c and r1 == c and s1 > s0:
            wall, steps = wall + t1 - t0, steps + s1 - s0
    client = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "cpu_step_ms": 1000 * cpu / all_steps,
        "step_ms": 1000 * wall / steps if steps else float("nan"),
        "full_s": wall,
        "steps": int(steps),
        "tok_s": client["tokens"] / client["wall_s"],
    }


def record_cost(endpoint: str, n: int = 2000) -> float:
    """Process CPU seconds per traced request: building its 4 spans and exporting them (OTLP/HTTP,
    batch processor flushed), measured over n completed-request records while the servers idle."""
    from types import SimpleNamespace

    from modeldeploy.runtime.server.evidence import Evidence
    from modeldeploy.runtime.server.tracing import Tracing

    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    tr = Tracing({"bundle": "bench", "engine_build": "", "model_revision": ""})
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    evs = []
    for i in range(n):
        ev = Evidence(
            f"req-{i}", "POST", "/v1/completions", {"traceparent": f"00-{i + 1:032x}-{i + 1:016x}-01"}
        )
        a = ev.arrival
        ev.status, ev.outcome, ev.response_id, ev.admitted = 200, "completed", f"cmpl-{i}", a + 0.001
        ev.metrics = SimpleNamespace(
            first_scheduled_time=a + 0.002, first_token_time=a + 0.01, finished_time=a + 0.5
        )
        ev.prompt_tokens, ev.completion_tokens, ev.end = 12, 128, a + 0.5
        evs.append(ev)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for i, ev in enumerate(evs):
        tr.record(ev, {"bundle": "bench"})
        if i % 256 == 255:  # the batch processor's queue holds 2048 spans: export, never drop
            tr.provider.force_flush()
    tr.provider.force_flush()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    tr.shutdown()
    return ((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None, help="markdown file whose tracing section is replaced")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tracing-bench-"))
    model = str(tmp / "tiny")
    subprocess.run([sys.executable, "-m", "modeldeploy", "tiny-model", model, "--arch", "llama", "--seed", "0"],
                   check=True, capture_output=True)  # fmt: skip
    rx = subprocess.Popen([sys.executable, "-m", "modeldeploy_dev.otlp"], stdout=subprocess.PIPE, text=True)
    endpoint = rx.stdout.readline().strip()  # type: ignore[union-attr]
    off, on = server(model, False, endpoint), server(model, True, endpoint)
    assert tracer(on) is not None and tracer(off) is None
    res: dict[str, list[dict]] = {"off": [], "on": []}
    try:
        for s in (off, on):  # warm-up, not recorded
            one_round(s, args.concurrency, args.concurrency, 16)
        for i in range(args.rounds):
            for name, s in (("off", off), ("on", on)) if i % 2 == 0 else (("on", on), ("off", off)):
                r = one_round(s, args.requests, args.concurrency, args.max_tokens)
                res[name].append(r)
                print(
                    f"round {i} {name}: step {r['step_ms']:.3f} ms over {r['steps']} full-batch steps, "
                    f"server CPU {r['cpu_step_ms']:.3f} ms/step, {r['tok_s']:.0f} tok/s"
                )
        per_request = record_cost(endpoint)
    finally:
        for s in (off, on):
            s.stop()  # type: ignore[attr-defined]
        rx.kill()
    med = {k: statistics.median(r["step_ms"] for r in v) for k, v in res.items()}
    best = {k: min(r["step_ms"] for r in v) for k, v in res.items()}
    diff_med = 100 * (med["on"] / med["off"] - 1)
    diff_best = 100 * (best["on"] / best["off"] - 1)
    cpu = {k: statistics.median(r["cpu_step_ms"] for r in v) for k, v in res.items()}
    diff_cpu = 100 * (cpu["on"] / cpu["off"] - 1)
    spread = {
        k: 100 * (max(r["step_ms"] for r in v) - min(r["step_ms"] for r in v)) / med[k]
        for k, v in res.items()
    }
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()[0]
    cmd = f"python bench/tracing_cpu.py --rounds {args.rounds} --out {args.out}"
    text = f"""{SECTION}

- date: {datetime.now(UTC).isoformat(timespec="seconds")}  git rev: {rev}
- command: `{cmd}`
- machine: {platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs: noisy), Python {platform.python_version()}
- workload: tiny llama, float32, cpu, max_num_seqs=32; {args.requests} streamed requests x {args.max_tokens} tokens,
  {args.concurrency} in flight (load client in its own process); "on" exports every request's spans over
  OTLP/HTTP to a receiver in its own process, "off" has OTEL_EXPORTER_OTLP_ENDPOINT unset (no tracer built)
- step time at batch {args.concurrency}: a thread in the server process samples the engine every 20 ms
  (steps_total, num_running); only intervals with all {args.concurrency} sequences running at both ends
  count (wall / steps), so it includes what the server's event loop (spans, logs) takes from the engine
  thread under the GIL; rounds alternate off/on, {args.rounds} each

| | step ms at batch {args.concurrency} (median) | (best) | full-batch steps measured | client tok/s (median) |
|---|---|---|---|---|
| tracing off | {med["off"]:.3f} | {best["off"]:.3f} | {sum(r["steps"] for r in res["off"])} | {statistics.median(r["tok_s"] for r in res["off"]):.0f} |
| tracing on | {med["on"]:.3f} | {best["on"]:.3f} | {sum(r["steps"] for r in res["on"])} | {statistics.median(r["tok_s"] for r in res["on"]):.0f} |

on vs off, step time at batch {args.concurrency}: {diff_med:+.2f} % (median), {diff_best:+.2f} % (best); target: under 2 %.
Server-process CPU per engine step (all steps of a round; the busy engine thread, event loop and
span exporter together): off {cpu["off"]:.3f} ms, on {cpu["on"]:.3f} ms, {diff_cpu:+.2f} %.
Tracing's own cost, measured without the noise of the load: {1e6 * per_request:.0f} us of CPU per traced
request (4 spans built and exported, batch flushed). At batch {args.concurrency} with {args.max_tokens}-token
requests a step finishes {args.concurrency / args.max_tokens:.2f} requests on average, so tracing adds
{1e3 * per_request * args.concurrency / args.max_tokens:.3f} ms of CPU per step: {100 * 1e3 * per_request * args.concurrency / args.max_tokens / med["off"]:.2f} % of the median off step
({med["off"]:.3f} ms), {100 * 1e3 * per_request * args.concurrency / args.max_tokens / best["off"]:.2f} % of the best ({best["off"]:.3f} ms).
Noise: the off rounds alone spread over {spread["off"]:.0f} % of their median (on: {spread["on"]:.0f} %).

- off rounds step ms: {[round(r["step_ms"], 3) for r in res["off"]]}
- on rounds step ms: {[round(r["step_ms"], 3) for r in res["on"]]}
- off rounds server CPU ms/step: {[round(r["cpu_step_ms"], 3) for r in res["off"]]}
- on rounds server CPU ms/step: {[round(r["cpu_step_ms"], 3) for r in res["on"]]}
- load average at the end: {load:.1f} (1 min)
"""
    print(text)
    if args.out:
        old = args.out.read_text() if args.out.exists() else ""
        keep = old.split(SECTION)[0].rstrip() if SECTION in old else old.rstrip()
        args.out.write_text(keep + "\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
