"""Prometheus metrics of one server, all prefixed `modeldeploy_` and labelled by bundle.

Every series carries `bundle`, `engine_build` and `model_revision`, so the operator's
canary analysis can never silently join two bundles. Per-request series (requests by
outcome, latency histograms) also carry `adapter`: the LoRA adapter the request selected,
empty for the base model, so analysis can be scoped to one adapter's traffic. Per-request
histograms are computed from the engine's `RequestOutput.metrics` timestamps (time.monotonic),
measured from the moment the server received the request, so queue time includes admission
waiting.
Engine totals (tokens, preemptions, KV usage) are read from `engine.stats()` at scrape.

Phases split each request at the engine's timestamps: queue (receipt to first scheduling),
prefill (first scheduling to first token), decode (first token to finish). Queue, prefill and
TTFT are observed together at the first token, so TTFT = queue + prefill holds per request and
in the histogram sums and counts (`modeldeploy bench` checks it). Cancellation release is the
server's abort of a sequence (its client went away, or the drain timeout hit) to the engine
freeing that sequence's KV blocks, both on the server's own monotonic clock.

Outcomes: completed (finished normally), cancelled (the client went away), invalid (the
request's own fault: 400/401/404...), rejected (refused for capacity or state: 429 queue full,
503 loading/draining), error (engine failure, a 5xx, or aborted by the drain timeout). Canary
analysis counts rejected and error as failures; invalid only where the canary answers it more
often than the stable bundle does (a client sending bad requests must not fail a canary).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LABELS = ("bundle", "engine_build", "model_revision")
ADAPTER = "adapter"  # per-request series only; "" = the base model
OUTCOMES = ("completed", "cancelled", "invalid", "rejected", "error")


def refusal_outcome(status: int) -> str:
    """The outcome of a request refused with this HTTP status before it was generated."""
    if status in (429, 503):
        return "rejected"
    return "invalid" if 400 <= status < 500 else "error"


_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_RELEASE = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Live:
    """Collector for values read at scrape time: gauges and the engine's own counters."""

    def __init__(self, labels: dict[str, str], read: Callable[[], dict[str, Any]]):
        self.labels, self.read = labels, read

    def describe(self):
        return []

    def collect(self):
        v = self.read()
        names, values = list(self.labels), list(self.labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"modeldeploy_{name}", doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"modeldeploy_{name}", doc, labels=names)
            c.add_metric(values, value)
            return c

        yield gauge("requests_running", "Requests holding an engine slot", v["running"])
        yield gauge("requests_waiting", "Requests waiting in the admission queue", v["waiting"])
        yield gauge(
            "queued_prompt_tokens",
            "Prompt tokens of the requests waiting for a slot",
            v.get("queued_tokens", 0),
        )
        refused = CounterMetricFamily(
            "modeldeploy_admission_rejections",
            "Requests refused by admission (outcome rejected), by reason",
            labels=names + ["reason"],
        )
        for reason, n in v.get("rejections", {}).items():
            refused.add_metric(values + [reason], n)
        yield refused
        yield counter(
            "admission_waits",
            "Requests that found every running slot taken and waited in the admission queue",
            v.get("waits", 0),
        )
        yield counter(
            "admission_late_starts",
            "Requests let in under --queue-budget that started past it (served late, not refused)",
            v.get("late_starts", 0),
        )
        yield gauge("kv_cache_usage_ratio", "Fraction of KV cache blocks in use", v["kv_usage"])
        yield gauge("model_load_progress", "Weight loading progress, 0..1", v["load_progress"])
        yield gauge(
            "model_load_seconds", "Seconds the model took to load (0 until loaded)", v["load_seconds"]
        )
        yield counter("prompt_tokens", "Prompt tokens processed by the engine", v["prompt_tokens"])
        yield counter("generation_tokens", "Tokens generated by the engine", v["generation_tokens"])
        yield counter("preemptions", "Sequences preempted for KV cache space", v["preemptions"])
        yield gauge(
            "tensor_parallel_size",
            "Ranks the model is split over (one process each)",
            v.get("tensor_parallel_size", 1),
        )
        yield counter(
            "tp_allreduce_bytes",
            "Bytes all-reduced across tensor-parallel ranks",
            v.get("tp_allreduce_bytes", 0),
        )
        if v.get("lora_resident"):
            g = GaugeMetricFamily(
                "modeldeploy_lora_resident",
                "1 while the LoRA adapter is held on the device, 0 while only in host memory",
                labels=names + [ADAPTER],
            )
            for name, resident in v["lora_resident"].items():
                g.add_metric(values + [name], 1.0 if resident else 0.0)
            yield g
            yield counter(
                "lora_loads", "LoRA adapter copies from host memory to a device slot", v["lora_loads"]
            )
        info = GaugeMetricFamily(
            "modeldeploy_build_info", "Bundle pins of this server (always 1)", labels=list(v["build_info"])
        )
        info.add_metric(list(v["build_info"].values()), 1)
        yield info


class ServerMetrics:
    def __init__(
        self,
        labels: dict[str, str],
        read_live: Callable[[], dict[str, Any]],
        adapters: list[str] | tuple[str, ...] = (),
    ):
        self.registry = CollectorRegistry(auto_describe=False)
        self.labels = labels
        names = list(LABELS) + [ADAPTER]
        self._requests = Counter(
            "modeldeploy_requests", "Requests by outcome", names + ["outcome"], registry=self.registry
        )
        for adapter in ("", *adapters):  # every series exists from the start: a delta is never "absent"
            for outcome in OUTCOMES:
                self._requests.labels(**labels, adapter=adapter, outcome=outcome)
        hist = {
            "ttft": ("time_to_first_token_seconds", "Request receipt to first generated token", _LAT),
            "itl": ("inter_token_latency_seconds", "Time between consecutive generated tokens", _ITL),
            "e2e": ("request_latency_seconds", "Request receipt to last token (completed requests)", _LAT),
            "queue": ("queue_time_seconds", "Request receipt to first scheduling by the engine", _LAT),
            "prefill": ("prefill_time_seconds", "First scheduling to first generated token", _LAT),
            "decode": ("decode_time_seconds", "First to last token (completed requests)", _LAT),
            "release": (
                "cancel_release_seconds",
                "Abort of a sequence (client gone, drain timeout) to the engine freeing its KV blocks",
                _RELEASE,
            ),
        }
        self._families = {
            k: Histogram(f"modeldeploy_{n}", d, names, buckets=b, registry=self.registry)
            for k, (n, d, b) in hist.items()
        }
        for family in self._families.values():  # present from the start too (the operator reads
            for adapter in ("", *adapters):  # a pod without them as serving another bundle)
                family.labels(**labels, adapter=adapter)
        self._compile = Histogram(
            "modeldeploy_grammar_compile_seconds",
            "Time to compile (or fetch from the cache) a request's grammar, on the compile thread",
            list(LABELS) + ["cache"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        for cache in ("hit", "miss"):
            self._compile.labels(**labels, cache=cache)
        self.registry.register(_Live(labels, read_live))

    def grammar_compile(self, seconds: float, cached: bool) -> None:
        self._compile.labels(**self.labels, cache="hit" if cached else "miss").observe(seconds)

    def hist(self, kind: str, adapter: str = "") -> Any:
        return self._families[kind].labels(**self.labels, adapter=adapter)

    def outcome(self, outcome: str, adapter: str = "") -> None:
        self._requests.labels(**self.labels, adapter=adapter, outcome=outcome).inc()

    def count(self, outcome: str) -> float:
        """Requests with this outcome, all adapters and the base together."""
        total = 0.0
        for metric in self._requests.collect():
            for s in metric.samples:
                if s.name.endswith("_total") and s.labels.get("outcome") == outcome:
                    total += s.value
        return total

    def tracker(self, arrival: float, adapter: str = "") -> RequestTracker:
        return RequestTracker(self, arrival, adapter)

    def cancel_released(self, seconds: float) -> None:
        """One aborted sequence's release time (thread-safe: called on the engine thread, which
        does not know the request's adapter: these are all under adapter="")."""
        self.hist("release").observe(max(0.0, seconds))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTracker:
    """Turns one request's stream of RequestOutputs into histogram observations."""

    def __init__(self, metrics: ServerMetrics, arrival: float, adapter: str = ""):
        self.m, self.arrival, self.adapter = metrics, arrival, adapter
        self._last_token_time: float | None = None
        self.done = False

    def observe(self, out: Any) -> None:
        rm = getattr(out, "metrics", None)
        if rm is None:
            return
        n_new = len(out.new_token_ids)
        if n_new == 0 or rm.last_token_time is None:
            return
        if self._last_token_time is None:
            ttft = max(0.0, rm.first_token_time - self.arrival)
            sched = rm.first_scheduled_time if rm.first_scheduled_time is not None else rm.first_token_time
            queue = min(max(0.0, sched - self.arrival), ttft)  # clamped: queue + prefill == ttft exactly
            self.m.hist("queue", self.adapter).observe(queue)
            self.m.hist("prefill", self.adapter).observe(ttft - queue)
            self.m.hist("ttft", self.adapter).observe(ttft)
            n_new -= 1  # the first token has no predecessor
            prev = rm.first_token_time
        else:
            prev = self._last_token_time
        if n_new > 0:
            gap = max(0.0, rm.last_token_time - prev) / n_new
            itl = self.m.hist("itl", self.adapter)
            for _ in range(n_new):
                itl.observe(gap)
        self._last_token_time = rm.last_token_time

    def finish(self, outcome: str, out: Any = None) -> None:
        if self.done:
            return
        self.done = True
        self.m.outcome(outcome, self.adapter)
        rm = getattr(out, "metrics", None)
        if outcome == "completed" and rm is not None and rm.finished_time is not None:
            self.m.hist("e2e", self.adapter).observe(max(0.0, rm.finished_time - self.arrival))
            if rm.first_token_time is not None:
                self.m.hist("decode", self.adapter).observe(max(0.0, rm.finished_time - rm.first_token_time))
