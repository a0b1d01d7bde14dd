"""Tracing on vs off: the engine's step time at batch 32 (the target: under 2 % apart).

Two real servers in this process (real uvicorn, tiny model, max_num_seqs=32): one built with
OTEL_EXPORTER_OTLP_ENDPOINT unset (no tracer), one exporting every request's spans to an OTLP/HTTP
receiver running in its own process. A load client in another process (modeldeploy_dev.stream_load's raw
SSE client) keeps 32 streams in flight. Rounds alternate off/on. A thread samples, every 20 ms,
the engine's step count and running sequences and these CPU clocks (CPU time: what a thread ran,
not how long it waited, so robust to the machine's other load):

- the server process (CLOCK_PROCESS_CPUTIME_ID): everything, tracing included;
- the step loop's own work: its thread's pthread CPU clock (thread layout), or every thread of the
  engine core process from /proc/<pid>/task/*/schedstat (process layout, what `modeldeploy serve` runs);
- tracing, in place under the load: thread CPU inside `Tracing.record` (spans built on the event
  loop when a request ends) plus the span exporter thread's CPU clock (OTLP encoding and sending).

Only intervals that begin and end with all 32 sequences running count: wall and CPU per step at
batch 32. Tracing's CPU per step over the off step's wall time bounds what tracing can take from
the step when all of it is serialised with the step loop under the GIL.

    .venv/bin/python bench/tracing_cpu.py --rounds 9 --out bench/results/server_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

SECTION = "## Tracing on vs off (issue 19)"
LAYOUTS = {
    "process": "the step loop in an engine core process of its own (`modeldeploy serve`'s default); the API "
    "server, and with it all tracing, in the bench process",
    "thread": "the step loop on a thread of the server process (`--engine-core thread`)",
}
PINNED = (
    "; pinned: the bench process (the API servers), the load client and the OTLP receiver on CPU 0, "
    "the engine cores on CPU 1"
)
CLIENT = (
    "import asyncio, json; from modeldeploy_dev.stream_load import run_server; "
    "r = asyncio.run(run_server({url!r}, {n}, {c}, {tokens})); "
    "print(json.dumps({{'tokens': r['tokens'], 'wall_s': r['wall_s']}}))"
)


def server(model: str, traced: bool, endpoint: str, layout: str) -> object:
    from modeldeploy.runtime import EngineConfig
    from modeldeploy.runtime.server.config import ServerConfig
    from modeldeploy_dev.harness import ThreadedServer

    if traced:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    else:
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    ecfg = EngineConfig(model=model, device="cpu", dtype="float32", max_num_seqs=32, bundle_id="bench")
    # "process" is what `modeldeploy serve` runs: the step loop in an engine core process of its own,
    # which runs no tracing code at all; "thread" puts the step loop on a thread of this process
    s = ThreadedServer(
        ServerConfig(engine=ecfg, served_model_name="bench", max_queue=256, engine_core=layout)
    )
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return s


def switch(s: object, tracing: object) -> None:
    """Set the running server's EvidenceMiddleware's tracer: None is tracing off exactly as a server
    built without OTEL_EXPORTER_OTLP_ENDPOINT runs it (`record` is never called)."""
    from modeldeploy.runtime.server.evidence import EvidenceMiddleware

    app = s.app.middleware_stack  # type: ignore[attr-defined]  # built at the first request (the warm-up)
    while not isinstance(app, EvidenceMiddleware):
        app = app.app
    app.tracing = tracing


def tracer(s: object) -> object:
    from modeldeploy.runtime.server.evidence import EvidenceMiddleware

    [mw] = [m for m in s.app.user_middleware if m.cls is EvidenceMiddleware]  # type: ignore[attr-defined]
    return mw.kwargs["tracing"]


def _thread_clock(t: threading.Thread) -> Callable[[], float]:
    cid = time.pthread_getcpuclockid(t.ident)  # type: ignore[arg-type]
    return lambda: time.clock_gettime(cid)


def _process_clock(pid: int) -> Callable[[], float]:
    """CPU seconds of another process, all its threads: the first field of each task's schedstat
    (nanoseconds on the CPU), finer than /proc/<pid>/stat's clock ticks."""

    def read() -> float:
        total = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread that ended between the listing and the read
        return total / 1e9

    return read


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus` (sched_setaffinity acts on one thread; new threads inherit)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (OSError, ValueError):
            pass


def engine_clock(s: object) -> Callable[[], float]:
    """The step loop's CPU clock: its thread here (thread layout) or its core process (process layout)."""
    eng = s.ctx.engine  # type: ignore[attr-defined]
    if getattr(eng, "pid", None) is not None:
        return _process_clock(eng.pid)
    return _thread_clock(eng._thread)


class TracingClock:
    """CPU seconds spent tracing in this process: inside `Tracing.record` (wrapped, on whichever
    thread calls it) plus the span exporter's thread, whose clock is found once it exists."""

    def __init__(self, tr: object) -> None:
        self.record_s = 0.0
        self.records = 0
        record = tr.record  # type: ignore[attr-defined]

        def timed(*a: object, **k: object) -> object:
            t = time.thread_time()
            try:
                return record(*a, **k)
            finally:
                self.record_s += time.thread_time() - t
                self.records += 1

        tr.record = timed  # type: ignore[attr-defined]
        self.provider = tr.provider  # type: ignore[attr-defined]
        self.flush_s = 0.0
        self._export: Callable[[], float] | None = None

    def flush(self) -> None:
        """Export what is queued now, on this thread (timed): a round's spans are all paid in it."""
        t = time.thread_time()
        self.provider.force_flush()
        self.flush_s += time.thread_time() - t

    def total_s(self) -> float:
        return self.record_s + self.exporter_s() + self.flush_s

    def exporter_s(self) -> float:
        if self._export is None:
            threads = [t for t in threading.enumerate() if t.name.startswith("OtelBatchSpan")]
            if not threads:
                return 0.0
            self._export = _thread_clock(threads[0])
        return self._export()


def loaded(code: str, threads: list[threading.Thread], done: threading.Event, timeout_s: float) -> dict:
    """Run the load client (another process) while `threads` sample, stop them, return its JSON line."""
    for t in threads:
        t.start()
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=True
        )
    finally:
        done.set()
        for t in threads:
            t.join()
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_round(s: object, n: int, c: int, tokens: int, tc: TracingClock | None) -> dict:
    """Load from another process while a thread here samples the engine and the CPU clocks every
    20 ms; only intervals that begin and end with all `c` sequences running count (batch 32)."""
    eng = s.ctx.engine  # type: ignore[attr-defined]
    engine_cpu = engine_clock(s)
    code = CLIENT.format(url=s.url, n=n, c=c, tokens=tokens)  # type: ignore[attr-defined]
    samples: list[tuple[float, ...]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            st = eng.stats()
            samples.append(
                (
                    time.perf_counter(),
                    st.steps_total,
                    st.num_running,
                    time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID),
                    engine_cpu(),
                    tc.record_s if tc else 0.0,
                    tc.exporter_s() if tc else 0.0,
                    tc.records if tc else 0,
                )
            )
            time.sleep(0.02)

    trace0, records0, steps0 = (tc.total_s(), tc.records, eng.stats().steps_total) if tc else (0.0, 0, 0)
    client = loaded(code, [threading.Thread(target=sample, daemon=True)], done, 900)
    if tc:
        tc.flush()
    # Tracing per request over the whole round (spans built at each request's end, exported in
    # batches whenever the processor wakes, the rest flushed above), so no export falls outside.
    per_request = (tc.total_s() - trace0) / max(tc.records - records0, 1) if tc else 0.0
    # At a full batch every sequence finishes once per `tokens` steps: c / tokens requests per step
    # (an upper bound on the round's own rate, which ramps and drains; reported beside it). Not
    # counted within the full-batch intervals: with equal lengths requests finish in waves, exactly
    # at the steps where the batch is not full.
    rps = c / tokens
    round_rps = (tc.records - records0) / max(eng.stats().steps_total - steps0, 1) if tc else 0.0
    sums = [0.0] * 8
    for a, b in zip(samples, samples[1:], strict=False):
        if a[2] == c and b[2] == c and b[1] > a[1]:
            sums = [x + (v1 - v0) for x, v0, v1 in zip(sums, a, b, strict=True)]
    wall, steps, _, proc, engine, record, export, _records = sums
    per = 1000 / steps if steps else float("nan")
    return {
        "step_ms": wall * per,
        "proc_cpu_ms": proc * per,
        "engine_cpu_ms": engine * per,
        "trace_cpu_ms": 1000 * per_request * rps,
        "trace_request_us": 1e6 * per_request,
        "record_cpu_ms": record * per,
        "export_cpu_ms": export * per,
        "round_requests_per_step": round_rps,
        "steps": int(steps),
        "tok_s": client["tokens"] / client["wall_s"],
    }


def toggled(
    s: object, tr: object, tc: TracingClock | None, n: int, c: int, tokens: int, period: float
) -> dict:
    """One long load on one server whose tracer is switched every `period` seconds: off, on, off...
    (with `tr` None, the A/A control, only the labels change). The machine's slow swings (the step time
    moves by a third between minutes here) are then shared by each "on" window and the "off" windows
    on both sides of it, which a window is compared with: diff_k = on_k / mean(off_k-1, off_k+1) - 1.
    An "on" window ends with the batch processor flushed, so the export of its spans (OTLP encoding,
    the POST, the receiver's decoding) falls inside it, not in whichever window the processor's own
    5 s schedule would have picked."""
    eng = s.ctx.engine  # type: ignore[attr-defined]
    loop_cpu = engine_clock(s)
    code = CLIENT.format(url=s.url, n=n, c=c, tokens=tokens)  # type: ignore[attr-defined]
    window = [0]
    samples: list[tuple[float, int, int, float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            st = eng.stats()
            samples.append((time.perf_counter(), st.steps_total, st.num_running, loop_cpu(), window[0]))
            time.sleep(0.02)

    def toggle() -> None:
        while not done.wait(period):
            if tr is not None and window[0] % 2:  # an "on" window ends: its spans are exported inside it
                tr.provider.force_flush()  # type: ignore[attr-defined]
            window[0] += 1
            if tr is not None:
                switch(s, tr if window[0] % 2 else None)

    if tr is not None:
        switch(s, None)
    trace0, records0 = (tc.total_s(), tc.records) if tc else (0.0, 0)
    client = loaded(code, [threading.Thread(target=f, daemon=True) for f in (sample, toggle)], done, 1800)
    if tc:
        tc.flush()
    per: dict[int, list[float]] = {}  # window -> [wall s, steps, step-loop CPU s] over full-batch intervals
    for a, b in zip(samples, samples[1:], strict=False):
        if a[4] == b[4] and a[2] == c and b[2] == c and b[1] > a[1]:
            w = per.setdefault(a[4], [0.0, 0.0, 0.0])
            w[0], w[1], w[2] = w[0] + b[0] - a[0], w[1] + b[1] - a[1], w[2] + b[3] - a[3]
    ok = {k: v for k, v in per.items() if v[1] >= 20}  # a window that saw a few full-batch steps
    ms = {k: 1000 * v[0] / v[1] for k, v in ok.items()}
    cpu = {k: 1000 * v[2] / v[1] for k, v in ok.items()}

    def diffs(m: dict[int, float]) -> list[float]:
        return [
            100 * (m[k] / ((m[k - 1] + m[k + 1]) / 2) - 1)
            for k in sorted(m)
            if k % 2 and k - 1 in m and k + 1 in m
        ]

    def pooled(side: int) -> tuple[float, float, int]:
        vs = [v for k, v in ok.items() if k % 2 == side]
        steps = sum(v[1] for v in vs)
        return 1000 * sum(v[0] for v in vs) / steps, 1000 * sum(v[2] for v in vs) / steps, int(steps)

    traced = (tc.records - records0) if tc else 0
    return {
        "wall_diffs": diffs(ms),
        "cpu_diffs": diffs(cpu),
        "off": pooled(0),
        "on": pooled(1),
        "windows": len(ok),
        "traced": traced,
        "trace_request_us": 1e6 * (tc.total_s() - trace0) / max(traced, 1) if tc else 0.0,
        "tok_s": client["tokens"] / client["wall_s"],
    }


def block_bootstrap(
    xs: list[float], stat: Callable[[list[float]], float], n: int = 4000
) -> tuple[float, float]:
    """95 % percentile interval of `stat` over `xs` by a moving-block bootstrap with blocks of 2:
    neighbouring on-windows share the "off" window between them, so their differences are not
    independent and single-value resampling would understate the spread."""
    rng = random.Random(0)
    blocks = [xs[i : i + 2] for i in range(len(xs) - 1)] or [xs]
    k = (len(xs) + 1) // 2
    draws = sorted(stat([x for _ in range(k) for x in rng.choice(blocks)][: len(xs)]) for _ in range(n))
    return draws[int(0.025 * n)], draws[int(0.975 * n) - 1]


def toggled_text(
    r: dict, heading: str, cmd: str, elapsed: float, layout: str, c: int, tokens: int, period: float
) -> str:
    """The markdown section for a toggled run."""
    from statistics import mean, median, quantiles

    w, u = r["wall_diffs"], r["cpu_diffs"]
    q = quantiles(w, n=4) if len(w) >= 2 else [float("nan")] * 3
    se = statistics.stdev(w) / len(w) ** 0.5 if len(w) >= 2 else float("nan")
    (mlo, mhi), (alo, ahi) = block_bootstrap(w, median), block_bootstrap(w, mean)
    rev = git_rev()
    (off_ms, off_cpu, off_steps), (on_ms, on_cpu, on_steps) = r["off"], r["on"]
    return f"""{heading}

- date: {datetime.now(UTC).isoformat(timespec="seconds")}  git rev: {rev}
- command: `{cmd}` ({elapsed:.0f} s)
- machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {LOAD0:.1f} (1 min) at the start,
  Python {platform.python_version()}
- workload: tiny llama, float32, cpu, max_num_seqs={c}; one load of streamed requests x {tokens} tokens,
  {c} in flight (load client in its own process), spans exported over OTLP/HTTP to a receiver in its
  own process
- layout: {layout}
- method: one server; its tracer switched every {period:g} s (off, on, off, ...; "off" is the tracer
  unset, `record` never called, as in a server built without OTEL_EXPORTER_OTLP_ENDPOINT; each "on"
  window ends with the span processor flushed, so its export and the receiver's decoding fall in
  it). A thread samples every 20 ms the engine (steps_total, num_running) and the step loop's CPU clock; only
  intervals inside one window with all {c} sequences running count. Each "on" window is compared with
  the mean of the "off" windows before and after it, so the machine's slow swings cancel.

| | step ms wall (pooled) | step-loop CPU ms / step (pooled) | full-batch steps |
|---|---|---|---|
| tracing off | {off_ms:.3f} | {off_cpu:.3f} | {off_steps} |
| tracing on | {on_ms:.3f} | {on_cpu:.3f} | {on_steps} |

**Step time, tracing on vs off at batch {c}: {median(w):+.2f} %** (median over {len(w)} on-windows, each
against its neighbours; mean {mean(w):+.2f} % +/- {se:.2f} % standard error; quartiles
{q[0]:+.2f} / {q[2]:+.2f} %).
95 % intervals (moving-block bootstrap, blocks of 2 windows): median {mlo:+.2f} ... {mhi:+.2f} %,
mean {alo:+.2f} ... {ahi:+.2f} %.
Step-loop CPU per step: median {median(u):+.2f} %, mean {mean(u):+.2f} %. Pooled: step wall
{100 * (on_ms / off_ms - 1):+.2f} %, step-loop CPU {100 * (on_cpu / off_cpu - 1):+.2f} %.
Requests traced: {r["traced"]} ({r["trace_request_us"]:.0f} us of tracing CPU each, in the API server
process).
Client: {r["tok_s"]:.0f} tok/s over the whole load. Windows with full-batch steps: {r["windows"]}.

- per on-window step wall %: {[round(x, 1) for x in w]}
- load average at the end: {os.getloadavg()[0]:.1f} (1 min)
"""


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


def git_rev() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def replace_section(old: str, heading: str, text: str) -> str:
    """`old` with the section under exactly `heading` (up to the next "## " heading) replaced by
    `text`, or `text` appended: each layout's run keeps its own section."""
    lines = old.rstrip().splitlines()
    if heading in lines:
        i = lines.index(heading)
        j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
        return "\n".join(lines[:i] + text.rstrip().splitlines() + [""] + lines[j:]).rstrip() + "\n"
    return "\n".join(lines).rstrip() + "\n\n" + text


def describe(args: argparse.Namespace) -> tuple[str, str, str]:
    """A run's section heading (one per setup: --out replaces only that one), its command line, and
    the sentence saying where the step loop and the tracing ran."""
    if args.toggle:
        flags, how = (
            f"--toggle {args.toggle:g} --toggle-requests {args.toggle_requests} "
            f"--max-tokens {args.max_tokens}",
            f", toggled every {args.toggle:g} s",
        )
    else:
        flags, how = (
            f"--rounds {args.rounds} --servers {args.servers}",
            ", one server" if args.servers == "one" else "",
        )
    where = f"{args.layout} layout" + (", pinned" if args.pin else "") + how
    heading = f"{SECTION}: {where}" + (" -- A/A CONTROL: never traced" if args.control else "")
    cmd = (
        f"python bench/tracing_cpu.py {flags} --layout {args.layout}"
        + (" --pin" if args.pin else "")
        + (" --control" if args.control else "")
        + (f" --out {args.out}" if args.out else "")
    )
    return heading, cmd, LAYOUTS[args.layout] + (PINNED if args.pin else "")


def publish(args: argparse.Namespace, heading: str, text: str) -> None:
    print(text)
    if args.out:
        args.out.write_text(replace_section(args.out.read_text() if args.out.exists() else "", heading, text))


def report_toggled(args: argparse.Namespace, r: dict, elapsed: float) -> int:
    if len(r["wall_diffs"]) < 2:
        print(
            f"only {len(r['wall_diffs'])} on-windows with full-batch steps on both sides: "
            "the load was too short for --toggle; raise --toggle-requests or --max-tokens",
            file=sys.stderr,
        )
        return 1
    heading, cmd, layout = describe(args)
    text = toggled_text(r, heading, cmd, elapsed, layout, args.concurrency, args.max_tokens, args.toggle)
    publish(args, heading, text)
    return 0


LOAD0 = os.getloadavg()[0]  # before this bench's own load


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None, help="markdown file whose tracing section is replaced")
    ap.add_argument(
        "--control",
        action="store_true",
        help="A/A: both servers untraced (the 'on' one too), to see the noise of the paired differences",
    )
    ap.add_argument(
        "--layout",
        choices=("process", "thread"),
        default="process",
        help="where the step loop runs: its own engine core process (what `modeldeploy serve` runs) "
        "or a thread here",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="process layout: this process, the load client and the OTLP receiver on CPU 0, "
        "the engine cores on CPU 1 (a serving node gives the engine core a core of its own; "
        "here it keeps the other jobs' scheduling out of the step time)",
    )
    ap.add_argument(
        "--servers",
        choices=("one", "two"),
        default="one",
        help="one: a single server whose tracer is switched on and off between rounds (same engine core, "
        "same memory); two: a server built untraced beside one built traced",
    )
    ap.add_argument(
        "--toggle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="instead of rounds: one load of --toggle-requests on one server, "
        "its tracer switched every SECONDS",
    )
    ap.add_argument("--toggle-requests", type=int, default=4096)
    args = ap.parse_args()
    if args.toggle and args.servers != "one":
        ap.error("--toggle needs --servers one")
    if args.control and args.out:
        ap.error("--control prints the A/A figures only: no --out")
    if args.pin and (args.layout != "process" or len(os.sched_getaffinity(0)) < 2):
        ap.error("--pin needs --layout process and at least 2 CPUs")
    if args.pin:
        pin(os.getpid(), {0})  # children (the cores, the client, the receiver) inherit CPU 0
    tmp = Path(tempfile.mkdtemp(prefix="tracing-bench-"))
    model = str(tmp / "tiny")
    subprocess.run(
        [sys.executable, "-m", "modeldeploy", "tiny-model", model, "--arch", "llama", "--seed", "0"],
        check=True,
        capture_output=True,
    )
    rx = subprocess.Popen([sys.executable, "-m", "modeldeploy_dev.otlp"], stdout=subprocess.PIPE, text=True)
    endpoint = rx.stdout.readline().strip()  # type: ignore[union-attr]
    if args.servers == "two":
        off, on = (
            server(model, False, endpoint, args.layout),
            server(model, not args.control, endpoint, args.layout),
        )
        assert (tracer(on) is None) == args.control and tracer(off) is None
    else:  # one server, its tracer switched off and on between rounds
        off = on = server(model, not args.control, endpoint, args.layout)
        assert (tracer(on) is None) == args.control
    servers = [off] if on is off else [off, on]
    if args.pin:
        for s in servers:
            pin(s.ctx.engine.pid, {1})  # type: ignore[attr-defined]
    tr = tracer(on)
    tc = None if args.control else TracingClock(tr)

    def go(name: str, s: object, n: int, tokens: int) -> dict:
        if on is off and tr is not None:
            switch(s, tr if name == "on" else None)
        return one_round(s, n, args.concurrency, tokens, tc if name == "on" else None)

    res: dict[str, list[dict]] = {"off": [], "on": []}
    t_start = time.monotonic()
    try:
        for name, s in (("off", off), ("on", on)):  # warm-up, not recorded (builds the middleware stack)
            go(name, s, args.concurrency, 16)
        if args.toggle:
            r = toggled(on, tr, tc, args.toggle_requests, args.concurrency, args.max_tokens, args.toggle)
            return report_toggled(args, r, time.monotonic() - t_start)
        for i in range(args.rounds):
            for name, s in (("off", off), ("on", on)) if i % 2 == 0 else (("on", on), ("off", off)):
                r = go(name, s, args.requests, args.max_tokens)
                res[name].append(r)
                print(
                    f"round {i} {name}: step {r['step_ms']:.3f} ms wall, process CPU {r['proc_cpu_ms']:.3f}"
                    f" ms, step loop CPU {r['engine_cpu_ms']:.3f} ms, tracing CPU {r['trace_cpu_ms']:.4f}"
                    f" ms per step over {r['steps']} full-batch steps; {r['tok_s']:.0f} tok/s",
                    flush=True,
                )
        per_request = record_cost(endpoint)
    finally:
        for s in servers:
            s.stop()  # type: ignore[attr-defined]
        rx.kill()
    elapsed = time.monotonic() - t_start

    def med(key: str, side: str) -> float:
        return statistics.median(r[key] for r in res[side])

    def pct(a: float, b: float) -> float:
        return 100 * (a / b - 1)

    # Paired: round i's on against round i's off (adjacent in time, so they share the machine's load).
    pairs = {
        k: [pct(a[k], b[k]) for a, b in zip(res["on"], res["off"], strict=True)]
        for k in ("step_ms", "proc_cpu_ms", "engine_cpu_ms")
    }
    trace = med("trace_cpu_ms", "on")
    trace_max = max(r["trace_cpu_ms"] for r in res["on"])
    bound = 100 * trace / med("step_ms", "off")
    bound_worst = 100 * trace_max / min(r["step_ms"] for r in res["off"])
    spread = {
        k: 100 * (max(r["step_ms"] for r in v) - min(r["step_ms"] for r in v)) / med("step_ms", k)
        for k, v in res.items()
    }
    rps = args.concurrency / args.max_tokens
    rev = git_rev()
    load = os.getloadavg()[0]
    c = args.concurrency

    def row(side: str) -> str:
        return (
            f"| tracing {side} | {med('step_ms', side):.3f} | {med('proc_cpu_ms', side):.3f} | "
            f"{med('engine_cpu_ms', side):.3f} | "
            + (f"{trace:.4f} |" if side == "on" else "0 (no tracer) |")
            + f" {sum(r['steps'] for r in res[side])} | {med('tok_s', side):.0f} |"
        )

    def listed(key: str, side: str, nd: int = 3) -> list[float]:
        return [round(r[key], nd) for r in res[side]]

    def paired(key: str) -> list[float]:
        return [round(x, 1) for x in pairs[key]]

    fastest_off = min(r["step_ms"] for r in res["off"])

    heading, cmd, layout = describe(args)
    off_is = (
        "is the same server with its tracer switched off between rounds (`record` never called, as in a "
        "server built without OTEL_EXPORTER_OTLP_ENDPOINT)"
        if args.servers == "one"
        else "is a second server built with OTEL_EXPORTER_OTLP_ENDPOINT unset (no tracer built)"
    )
    loop_clock = (
        "the core process's threads' schedstat" if args.layout == "process" else "its thread's CPU clock"
    )
    header = (
        "| | step ms wall | process CPU ms / step | step-loop CPU ms / step | tracing CPU ms / step "
        "| full-batch steps | client tok/s |"
    )
    text = f"""{heading}

- date: {datetime.now(UTC).isoformat(timespec="seconds")}  git rev: {rev}
- command: `{cmd}` ({elapsed:.0f} s)
- machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {LOAD0:.1f} (1 min) at the start,
  Python {platform.python_version()}
- workload: tiny llama, float32, cpu, max_num_seqs={c}; {args.requests} streamed requests x
  {args.max_tokens} tokens, {c} in flight (load client in its own process); "on" exports every
  request's spans over OTLP/HTTP to a receiver in its own process, "off" {off_is}
- layout: {layout}
- method: a thread in the server process samples every 20 ms the engine (steps_total, num_running)
  and CPU clocks: the server process, the step loop ({loop_clock}), and tracing in place (thread CPU inside
  `Tracing.record` + the span exporter thread); only intervals with all {c} sequences running at both
  ends count; rounds alternate off/on, {args.rounds} each; medians over rounds

{header}
|---|---|---|---|---|---|---|
{row("off")}
{row("on")}

Tracing's CPU in place at batch {c}: {trace:.4f} ms per step (median of rounds; worst round
{trace_max:.4f}), from {med("trace_request_us", "on"):.0f} us of CPU per traced request in place (each
round's spans built, exported and flushed; isolated, without the load: {1e6 * per_request:.0f} us) x
{rps:.3f} requests finished per step at a full batch ({c} sequences of {args.max_tokens} tokens; over
whole rounds, ramp and drain included: {med("round_requests_per_step", "on"):.3f}).
Within the full-batch intervals alone: {1e3 * med("record_cpu_ms", "on"):.1f} us building spans +
{1e3 * med("export_cpu_ms", "on"):.1f} us on the exporter thread per step.
As a share of the off step's wall time: **{bound:.2f} %** of its median
({med("step_ms", "off"):.3f} ms); the worst round's tracing CPU over the fastest off step
({fastest_off:.3f} ms):
**{bound_worst:.2f} %**. Target: under 2 %.

Paired on-vs-off differences per round (median; all rounds listed below):
step wall {statistics.median(pairs["step_ms"]):+.2f} %,
server process CPU per step {statistics.median(pairs["proc_cpu_ms"]):+.2f} %,
step-loop CPU per step {statistics.median(pairs["engine_cpu_ms"]):+.2f} %.
Noise: the off rounds' wall step time spreads over {spread["off"]:.0f} % of its median
(on: {spread["on"]:.0f} %).

- step ms wall: off {listed("step_ms", "off")}, on {listed("step_ms", "on")}
- process CPU ms/step: off {listed("proc_cpu_ms", "off")}, on {listed("proc_cpu_ms", "on")}
- step-loop CPU ms/step: off {listed("engine_cpu_ms", "off")}, on {listed("engine_cpu_ms", "on")}
- tracing CPU ms/step (on): {listed("trace_cpu_ms", "on", 4)};
  us per request: {listed("trace_request_us", "on", 0)}
- paired on/off %: step wall {paired("step_ms")},
  server process CPU {paired("proc_cpu_ms")},
  step-loop CPU {paired("engine_cpu_ms")}
- load average at the end: {load:.1f} (1 min)
"""
    publish(args, heading, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
