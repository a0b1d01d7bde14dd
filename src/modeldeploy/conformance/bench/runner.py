"""Running the benchmark: rates (or a capacity search) over one or more URLs, interleaved.

Each rate replays the same seeded workload and arrival times against every URL, one URL
after the other (A, B, A, B ...), so machine noise lands on both sides of a comparison.
Every loop is bounded: a rate's schedule by its duration or count, its stragglers by
`drain_timeout_s` (then cancelled and recorded as errors), a capacity search by `max_rate`
and `search_steps`.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from modeldeploy.conformance.bench import arrivals, stats
from modeldeploy.conformance.bench import workload as W
from modeldeploy.conformance.bench.client import Record, Settings, send
from modeldeploy.conformance.bench.server import Target, Watch, base_url

Progress = Callable[..., None]


@dataclass
class BenchConfig:
    urls: list[str]
    names: list[str] = field(default_factory=list)  # labels in reports (default A, B, C ...)
    api_key: str | None = None
    model: str | None = None
    endpoint: str = "completions"  # completions | chat | responses (always streamed)
    rates: list[float] = field(default_factory=list)
    find_capacity: bool = False
    capacity_fraction: float = 0.9  # a rate passes when good / sent >= this (and aggregate SLOs hold)
    start_rate: float = 1.0
    max_rate: float = 256.0
    search_steps: int = 3  # bisection steps once a passing and a failing rate are known
    arrival: str = "poisson"
    burstiness: float = 1.0
    duration_s: float | None = None
    requests: int | None = None
    warmup: int = 4  # requests per URL before the first rate, not recorded
    seed: int = 0
    mix: tuple[W.Shape, ...] = W.DEFAULT_MIX
    length_jitter: float = 0.1  # synthetic lengths drawn from [1 - jitter, 1] x the shape's
    dataset: str | None = None
    tokenizer: str | None = None
    ignore_eos: bool | None = None  # None: on when every target is known to support it (modeldeploy)
    cancel_fraction: float = 0.0
    slo: dict[str, float] = field(default_factory=lambda: dict(stats.DEFAULT_SLO))
    temperature: float = 0.0
    timeout_s: float = 120.0  # per read on a stream
    drain_timeout_s: float = 120.0  # after the last send, how long stragglers may run
    max_inflight: int = 1024  # connection pool size; the record shows the client's in-flight peak
    scrape_interval_s: float = 0.5
    bootstrap: int = 400
    margin: float = 0.05  # a verdict needs the whole 95 % interval beyond this change

    def validate(self) -> None:
        self._validate_targets()
        self._validate_mode()
        self._validate_workload()
        if self.duration_s is None and self.requests is None:
            self.requests = 50

    def _validate_targets(self) -> None:
        """The URLs, their names and the endpoint."""
        if not self.urls:
            raise ValueError("give at least one URL")
        for u in self.urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"URL must start with http:// or https://, got {u!r}")
        if self.names and len(self.names) != len(self.urls):
            raise ValueError(f"--name: {len(self.names)} names for {len(self.urls)} URLs")
        if self.endpoint not in ("completions", "chat", "responses"):
            raise ValueError(f"--endpoint: {self.endpoint!r} is not completions, chat or responses")

    def _validate_mode(self) -> None:
        """Fixed rates or a capacity search, and the rates either one uses."""
        if not self.find_capacity and not self.rates:
            raise ValueError("give --rates or --find-capacity")
        if self.find_capacity and self.rates:
            raise ValueError("--rates and --find-capacity exclude each other")
        if not 0.0 < self.capacity_fraction <= 1.0:
            raise ValueError(f"--capacity-fraction: must be in (0, 1], got {self.capacity_fraction}")
        if any(r <= 0 for r in self.rates):
            raise ValueError(f"--rates: every rate must be > 0, got {self.rates}")
        if self.start_rate <= 0 or self.max_rate < self.start_rate:
            raise ValueError("--start-rate must be > 0 and <= --max-rate")

    def _validate_workload(self) -> None:
        """Arrivals, lengths, cancellations, how long each rate runs, client bounds."""
        if self.arrival not in arrivals.KINDS:
            raise ValueError(f"--arrival: {self.arrival!r} is not one of {', '.join(arrivals.KINDS)}")
        if not 0.0 <= self.length_jitter < 1.0:
            raise ValueError(f"--length-jitter: must be in [0, 1), got {self.length_jitter}")
        if not 0.0 <= self.cancel_fraction <= 1.0:
            raise ValueError(f"--cancel-fraction: must be in [0, 1], got {self.cancel_fraction}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"--duration: must be > 0, got {self.duration_s}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"--requests: must be >= 1, got {self.requests}")
        if self.warmup < 0 or self.max_inflight < 1 or self.bootstrap < 10:
            raise ValueError("--warmup must be >= 0, --max-inflight >= 1, --bootstrap >= 10")

    def labels(self) -> list[str]:
        return self.names or [chr(ord("A") + i) for i in range(len(self.urls))]


class CapacitySearch:
    """Double from start_rate until a rate fails, then bisect (geometrically) a few steps.

    Capacity is the highest passing rate seen; 0 when even the lowest probe (start / 16) fails.
    """

    def __init__(self, start: float, max_rate: float, steps: int):
        self.lo: float | None = None  # highest passing rate
        self.hi: float | None = None  # lowest failing rate
        self.max_rate, self.steps, self.min_rate = max_rate, steps, start / 16
        self.next_rate: float | None = start
        self.probes: list[dict[str, Any]] = []

    def update(self, rate: float, ok: bool, why: str) -> None:
        self.probes.append({"rate": rate, "ok": ok, "why": why})
        if ok:
            self.lo = max(self.lo or 0.0, rate)
        else:
            self.hi = min(self.hi or math.inf, rate)
        if self.hi is None:
            nxt = rate * 2
            self.next_rate = nxt if nxt <= self.max_rate else None
        elif self.lo is None:
            nxt = rate / 2
            self.next_rate = nxt if nxt >= self.min_rate else None
        elif self.steps > 0 and self.hi / self.lo > 1.1:
            self.steps -= 1
            self.next_rate = round(math.sqrt(self.lo * self.hi), 3)
        else:
            self.next_rate = None

    @property
    def capacity(self) -> float:
        return self.lo or 0.0


class Bench:
    def __init__(self, cfg: BenchConfig, targets: list[Target], progress: Progress = lambda *a, **k: None):
        cfg.validate()
        self.cfg, self.targets, self.progress = cfg, targets, progress
        self.counter = W.TokenCounter(cfg.tokenizer)
        self.dataset = W.load_dataset(cfg.dataset, self.counter) if cfg.dataset else None
        self.runs: list[dict[str, Any]] = []
        self.records: dict[tuple[str, float], list[Record]] = {}
        self.searches: dict[str, CapacitySearch] = {}
        self.warmed: set[str] = set()

    # ---- workload -------------------------------------------------------------------------
    def plan(self, rate: float) -> tuple[list[float], list[W.Item], list[bool]]:
        """The same offsets, prompts and cancel choices for every URL at this rate (seeded)."""
        rng = random.Random(f"{self.cfg.seed}:{rate}")
        offsets = arrivals.schedule(
            self.cfg.arrival, rate, rng, self.cfg.duration_s, self.cfg.requests, self.cfg.burstiness
        )
        if self.dataset is not None:
            items = W.sample(self.dataset, len(offsets), rng)
        else:
            items = W.synthetic(self.cfg.mix, len(offsets), rng, self.counter, self.cfg.length_jitter)
        cancels = [rng.random() < self.cfg.cancel_fraction for _ in offsets]
        return offsets, items, cancels

    def settings(self, t: Target) -> Settings:
        """The same request settings for every target (only the model name differs): a compare
        where one side stops at EOS and the other does not would compare different work."""
        ignore = self.cfg.ignore_eos
        if ignore is None:
            ignore = all(x.is_modeldeploy for x in self.targets)
        return Settings(t.model, self.cfg.endpoint, ignore, self.cfg.temperature, self.cfg.timeout_s)

    # ---- one rate on one URL ----------------------------------------------------------------
    def run_rate(self, name: str, t: Target, rate: float) -> dict[str, Any]:
        offsets, items, cancels = self.plan(rate)
        if name not in self.warmed:
            self.progress("warmup", name=name, n=self.cfg.warmup)
            self._warmup(t)
            self.warmed.add(name)
        watch = Watch(t, self.cfg.api_key, self.cfg.scrape_interval_s)
        watch.start()
        self.progress("rate_start", name=name, rate=rate, n=len(offsets))
        try:
            recs, peak = asyncio.run(self._fire(t, offsets, items, cancels, name, rate))
        finally:
            server = watch.stop()
        summary = stats.summarize(recs, self.cfg.slo, rate)
        summary["client_inflight_peak"] = peak
        run = {
            "target": name,
            "rate": rate,
            "order": len(self.runs),
            "summary": summary,
            "server": server.to_dict() if server else None,
            "requests": [r.to_dict() for r in recs],
        }
        self.runs.append(run)
        self.records[(name, rate)] = recs
        self.progress("rate_done", name=name, rate=rate, summary=summary)
        return run

    def _client(self, t: Target) -> httpx.AsyncClient:
        limits = httpx.Limits(
            max_connections=self.cfg.max_inflight, max_keepalive_connections=self.cfg.max_inflight
        )
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        return httpx.AsyncClient(
            base_url=base_url(t.url), limits=limits, headers=headers, timeout=self.cfg.timeout_s
        )

    def _warmup(self, t: Target) -> None:
        if not self.cfg.warmup:
            return
        rng = random.Random(f"{self.cfg.seed}:warmup")
        short = min(self.cfg.mix, key=lambda s: s.prompt_tokens)
        items = W.synthetic((short,), self.cfg.warmup, rng, self.counter)

        async def go() -> None:
            async with self._client(t) as c:
                for i, it in enumerate(items):
                    await send(c, it, self.settings(t), i, 0.0, time.monotonic(), False)

        asyncio.run(go())

    async def _fire(
        self,
        t: Target,
        offsets: list[float],
        items: list[W.Item],
        cancels: list[bool],
        name: str,
        rate: float,
    ) -> tuple[list[Record], int]:
        settings = self.settings(t)
        inflight = peak = 0

        async def one(i: int) -> Record:
            nonlocal inflight, peak
            inflight += 1
            peak = max(peak, inflight)
            try:
                return await send(client, items[i], settings, i, offsets[i], t0, cancels[i])
            finally:
                inflight -= 1

        async with self._client(t) as client:
            tasks: list[asyncio.Task] = []
            t0 = time.monotonic()
            for i, off in enumerate(offsets):
                delay = t0 + off - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i)))
                if i % 10 == 0:
                    self.progress("tick", name=name, rate=rate, sent=i + 1, n=len(offsets), inflight=inflight)
            done, pending = (
                await asyncio.wait(tasks, timeout=self.cfg.drain_timeout_s) if tasks else (set(), set())
            )
            for p in pending:
                p.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        recs = []
        for i, task in enumerate(tasks):
            if task in done and not task.cancelled() and task.exception() is None:
                recs.append(task.result())
            else:
                why = "unfinished after the drain timeout" if task in pending else repr(task.exception())
                recs.append(Record(i, items[i].shape, offsets[i], error=why[:300]))
        return recs, peak

    # ---- the whole run ----------------------------------------------------------------------
    def passes(self, summary: dict[str, Any]) -> tuple[bool, str]:
        share = summary["good_share"]
        bad_flags = [k for k, f in summary["slo_flags"].items() if not f["ok"]]
        ok = share is not None and share >= self.cfg.capacity_fraction and not bad_flags
        why = f"good {share if share is None else round(share, 3)} vs {self.cfg.capacity_fraction}"
        return ok, why + (f"; aggregate SLO missed: {', '.join(bad_flags)}" if bad_flags else "")

    def run(self) -> None:
        names = self.cfg.labels()
        if not self.cfg.find_capacity:
            for rate in self.cfg.rates:
                for name, t in zip(names, self.targets, strict=True):
                    self.run_rate(name, t, rate)
            return
        self.searches = {
            n: CapacitySearch(self.cfg.start_rate, self.cfg.max_rate, self.cfg.search_steps) for n in names
        }
        while any(s.next_rate is not None for s in self.searches.values()):
            for name, t in zip(names, self.targets, strict=True):
                s = self.searches[name]
                if s.next_rate is None:
                    continue
                run = self.run_rate(name, t, s.next_rate)
                ok, why = self.passes(run["summary"])
                s.update(run["rate"], ok, why)
                self.progress("probe", name=name, rate=run["rate"], ok=ok, why=why)

    def compare(self) -> list[dict[str, Any]]:
        """Every URL after the first against the first, at every rate both ran."""
        names = self.cfg.labels()
        if len(names) < 2:
            return []
        out = []
        rng = random.Random(f"{self.cfg.seed}:bootstrap")
        base = names[0]
        for other in names[1:]:
            rates = sorted(
                {r for (n, r) in self.records if n == base} & {r for (n, r) in self.records if n == other}
            )
            for rate in rates:
                a, b = self.records[(base, rate)], self.records[(other, rate)]
                verdicts = []
                for m in stats.COMPARED:
                    point, lo, hi = stats.bootstrap(a, b, m, self.cfg.bootstrap, rng)
                    verdicts.append(stats.verdict(m, other, rate, point, lo, hi, self.cfg.margin))
                out.append({"a": base, "b": other, "rate": rate, "verdicts": verdicts})
        return out
