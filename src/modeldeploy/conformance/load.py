"""Bounded load: N requests from C client workers while /metrics is sampled.

Evidence that admission works: no 5xx, the server's running gauge never above its limit,
requests waiting at some point when C exceeds the limit, and both gauges back to 0 after.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from modeldeploy.conformance.checks import PROMPT
from modeldeploy.conformance.prom import Metrics
from modeldeploy.conformance.result import CheckResult, Target


def run_load(
    t: Target,
    n: int,
    c: int,
    max_tokens: int = 32,
    stream: bool = False,
    timeout_s: float = 120.0,
    request_timeout_s: float | None = None,
) -> dict[str, Any]:
    """Fire n completions from c workers; sample metrics meanwhile. Returns raw observations.
    Each request may take `request_timeout_s` (default: the server client's timeout)."""
    rt = request_timeout_s if request_timeout_s is not None else t.server.timeout_s
    samples: list[tuple[float, float, float]] = []  # (t, running, waiting)
    stop = threading.Event()
    t0 = time.monotonic()

    def poll() -> None:
        while not stop.is_set() and time.monotonic() - t0 < timeout_s:
            m = t.metrics()
            if m is not None:
                samples.append(
                    (
                        time.monotonic() - t0,
                        m.get("modeldeploy_requests_running") or 0.0,
                        m.get("modeldeploy_requests_waiting") or 0.0,
                    )
                )
            time.sleep(0.01)

    def one(i: int) -> tuple[int, float, str]:
        body = {
            "model": t.model,
            "prompt": f"{PROMPT} #{i}",
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
            **t.extra(),
        }
        s = time.monotonic()
        try:
            if stream:
                with t.server.client.stream("POST", "/v1/completions", json=body, timeout=rt) as r:
                    for _ in r.iter_lines():
                        pass
                    return r.status_code, time.monotonic() - s, ""
            r = t.server.client.post("/v1/completions", json=body, timeout=rt)
            return r.status_code, time.monotonic() - s, ""
        except Exception as e:  # noqa: BLE001 - a transport failure is an outcome: status 0, named
            return 0, time.monotonic() - s, type(e).__name__

    poller = threading.Thread(target=poll, daemon=True)
    if t.has_metrics:
        poller.start()
    try:
        with ThreadPoolExecutor(max_workers=c) as ex:
            results = list(ex.map(one, range(n)))
    finally:
        stop.set()
        if poller.is_alive():
            poller.join(5)
    lat = sorted(d for s, d, _ in results if s == 200)
    return {
        "requests": n,
        "concurrency": c,
        "max_tokens": max_tokens,
        "stream": stream,
        "request_timeout_s": rt,
        "statuses": dict(Counter(s for s, _, _ in results)),
        # what each status 0 was (ReadTimeout, ConnectError, RemoteProtocolError...): a timeout under
        # load and a dropped connection are different findings
        "transport_errors": dict(Counter(e for s, _, e in results if s == 0)),
        "latency_p50_s": round(statistics.median(lat), 4) if lat else None,
        "latency_max_s": round(lat[-1], 4) if lat else None,
        "metric_samples": len(samples),
        "running_max": max((r for _, r, _ in samples), default=None),
        "waiting_max": max((w for _, _, w in samples), default=None),
        "wall_s": round(time.monotonic() - t0, 3),
    }


def _delta(before: Metrics | None, after: Metrics | None, name: str) -> float | None:
    """after - before of a counter both scrapes carry, else None (a server without it)."""
    if before is None or after is None:
        return None
    a, b = after.get(name), before.get(name)
    return None if a is None or b is None else a - b


def bounded_load(t: Target, n: int = 8, c: int = 4) -> CheckResult:
    """c workers against a server that runs at most `limit` at once: each request answers (200),
    or is refused (429), never a 5xx or a dropped connection, and running stays within the limit.

    A request the server queued is answered after those ahead of it, so its timeout is the
    client's times ceil(c / limit), the requests it can wait behind plus its own: a correct
    server that is merely slow (one sequence at a time, on a busy node) must not read as one
    that hangs. Without a published limit, the client's timeout."""
    res = CheckResult("bounded_load")
    before = t.metrics()
    depth = math.ceil(c / t.limit) if t.limit else 1
    obs = run_load(t, n, c, request_timeout_s=t.server.timeout_s * depth)
    res.observations.update(obs, limit=t.limit)
    st = obs["statuses"]
    te = obs["transport_errors"]
    named = f" (transport errors: {te}, request timeout {obs['request_timeout_s']:g} s)" if te else ""
    res.expect(not any(s >= 500 or s == 0 for s in st), f"5xx or transport errors under load: {st}{named}")
    res.expect(st.get(200, 0) >= 1, f"no request succeeded under load: {st}")
    res.expect(set(st) <= {200, 429}, f"unexpected statuses under load: {st}")
    if not t.has_metrics:
        res.caveats.append("server exposes no modeldeploy metrics: running/waiting not observed")
        return res
    if t.limit is not None:
        res.expect(
            obs["running_max"] is not None and obs["running_max"] <= t.limit,
            f"running reached {obs['running_max']}, above the server's limit {t.limit}",
        )
        if c > t.limit:
            # counted by the server where it counts (modeldeploy_admission_waits_total): the
            # sampled gauge misses waits shorter than a scrape, as a tiny model's are
            waits = _delta(before, t.metrics(), "modeldeploy_admission_waits_total")
            res.observations["admission_waits"] = waits
            res.expect(
                (waits or 0) >= 1 or (obs["waiting_max"] or 0) >= 1 or st.get(429, 0) > 0,
                f"{c} workers > limit {t.limit} but no request was seen waiting (or refused)",
            )
    else:
        res.caveats.append("server did not publish its running limit (/v1/bundle): limit not checked")
    m, waited = t.wait_metrics(
        lambda m: (
            (m.get("modeldeploy_requests_running") or 0) == 0
            and (m.get("modeldeploy_requests_waiting") or 0) == 0
        )
    )
    res.observations["settle_s"] = round(waited, 3)
    res.expect(
        m is not None
        and (m.get("modeldeploy_requests_running") or 0) == 0
        and (m.get("modeldeploy_requests_waiting") or 0) == 0,
        "running/waiting did not return to 0",
    )
    if before is not None and m is not None:
        res.observations["requests_total_delta"] = {
            o: (m.get("modeldeploy_requests_total", outcome=o) or 0)
            - (before.get("modeldeploy_requests_total", outcome=o) or 0)
            for o in ("completed", "cancelled", "invalid", "rejected", "error")
        }
        res.expect(
            res.observations["requests_total_delta"]["completed"] >= st.get(200, 0),
            "fewer completed requests counted than answered with 200",
        )
    return res
