"""Figures of one rate on one URL, SLOs and goodput, and the A/B verdicts with bootstrap CIs.

Per-request SLOs (`ttft`, `tpot`, `itl`, `e2e`, seconds) decide which completed requests are
"good": goodput is good requests (and their output tokens) per second of the rate's window
(first send to last answer). Aggregate SLOs (`ttft_p95`, `itl_p95`, `tpot_p95`, `e2e_p95`,
`error_rate`, ...) are flags on the rate. Metric names and definitions come from
`conformance/measures.py`, the module the operator's canary analysis uses.

Compare: for each metric, requests of each URL are resampled with replacement (`n` times) and
the metric recomputed, giving a 95 % interval for B's change against A. "worse" means the whole
interval lies beyond the margin; "better" the same the other way; otherwise no verdict.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from modeldeploy.conformance import measures as M
from modeldeploy.conformance.bench.client import Record

PER_REQUEST = ("ttft", "tpot", "itl", "e2e")
AGGREGATE_KEYS = ("ttft", "tpot", "itl", "e2e")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
DEFAULT_SLO = {"ttft": 1.0, "tpot": 0.1}  # the operator's SLO defaults (spec.rollout.analysis.slo)


def parse_slo(items: Sequence[str], goodput: str | None = None) -> dict[str, float]:
    """`--slo ttft=1,tpot=0.1,ttft_p95=0.5,error_rate=0.01` (seconds) and vLLM's `--goodput ttft:ms,...`."""
    slo: dict[str, float] = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            key, sep, val = part.partition("=")
            key = key.strip()
            ok = key in PER_REQUEST or key == "error_rate"
            ok = (
                ok
                or any(key == f"{a}_{q}" for a in AGGREGATE_KEYS for q in QUANTILES)
                or key.endswith("_mean")
            )
            if not sep or not ok:
                raise ValueError(
                    f"--slo: {part!r} is not KEY=SECONDS with KEY one of ttft, tpot, itl, e2e (per request), "
                    "ttft_p95 / itl_p99 / tpot_mean ... (aggregate) or error_rate"
                )
            slo[key] = _positive(val, "--slo", part)
    if goodput:
        names = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e", "e2e": "e2e", "itl": "itl"}
        for part in goodput.split(","):
            key, sep, val = part.partition(":")
            if not sep or key.strip() not in names:
                raise ValueError(
                    f"--goodput: {part!r} is not KEY:MILLISECONDS with KEY one of ttft, tpot, e2el, itl"
                )
            slo[names[key.strip()]] = _positive(val, "--goodput", part) / 1000.0
    if not any(k in PER_REQUEST for k in slo):
        slo = {**DEFAULT_SLO, **slo}
    return slo


def _positive(val: str, flag: str, part: str) -> float:
    try:
        v = float(val)
    except ValueError:
        raise ValueError(f"{flag}: {part!r}: {val!r} is not a number") from None
    if v <= 0:
        raise ValueError(f"{flag}: {part!r}: the threshold must be > 0")
    return v


def is_good(r: Record, slo: dict[str, float]) -> bool:
    """Completed, within every per-request threshold (itl: every gap of the request) and, when its
    item carries an output check, passing it: a fast wrong answer is not goodput."""
    if r.outcome != "completed" or r.check_passed is False:
        return False
    checks = {
        "ttft": r.ttft,
        "tpot": r.tpot if r.tpot is not None else 0.0,  # one output token: no gap to judge
        "e2e": r.e2e,
        "itl": max(r.itl, default=0.0),
    }
    return all(checks[k] is not None and checks[k] <= v for k, v in slo.items() if k in checks)


# ---- metrics over a set of requests (also the bootstrap statistics) ---------------------------
def _ttfts(rs: Sequence[Record]) -> list[float]:
    return [r.ttft for r in rs if r.ttft is not None and r.outcome in ("completed", "cancelled")]


def _gaps(rs: Sequence[Record]) -> list[float]:
    return [g for r in rs if r.outcome == "completed" for g in r.itl]


def _tpots(rs: Sequence[Record]) -> list[float]:
    return [r.tpot for r in rs if r.tpot is not None]


def _e2es(rs: Sequence[Record]) -> list[float]:
    return [r.e2e for r in rs if r.e2e is not None and r.outcome == "completed"]


def _refusals(rs: Sequence[Record]) -> dict[str, float | None]:
    """How fast refused requests (429) got their answer: a server that sheds load should say no at
    once, not after the wait the client was trying to avoid."""
    values = [r.e2e for r in rs if r.outcome == "rejected" and r.e2e is not None]
    return {"count": len(values), **_dist(values), "max": max(values, default=None)}


def _outcomes(rs: Sequence[Record]) -> dict[str, float]:
    return dict(Counter(r.outcome for r in rs))


def check_pass_rate(rs: Sequence[Record]) -> float | None:
    """Passed checks over the completed requests that carried one (None: no checks)."""
    checked = [r.check_passed for r in rs if r.check_passed is not None]
    return sum(checked) / len(checked) if checked else None


def good_share(rs: Sequence[Record]) -> float | None:
    """Good requests over those the client did not cancel on purpose."""
    eligible = [r for r in rs if r.outcome != "cancelled"]
    return sum(r.good for r in eligible) / len(eligible) if eligible else None


@dataclass(frozen=True)
class Metric:
    name: str
    of: Callable[[Sequence[Record]], float | None]
    higher_is_worse: bool = True
    relative: bool = True  # verdict in % of A; else in absolute points (shares)


COMPARED = (
    Metric("ttft_p50_seconds", lambda rs: M.quantile(_ttfts(rs), 0.5)),
    Metric(M.TTFT_P95, lambda rs: M.quantile(_ttfts(rs), 0.95)),
    Metric("inter_token_latency_p50_seconds", lambda rs: M.quantile(_gaps(rs), 0.5)),
    Metric(M.ITL_P95, lambda rs: M.quantile(_gaps(rs), 0.95)),
    Metric("tpot_mean_seconds", lambda rs: M.mean(_tpots(rs))),
    Metric("e2e_p95_seconds", lambda rs: M.quantile(_e2es(rs), 0.95)),
    Metric(M.ERROR_RATE, lambda rs: M.error_rate(_outcomes(rs)), relative=False),
    Metric(M.GOODPUT, good_share, higher_is_worse=False, relative=False),
)


def _dist(values: list[float]) -> dict[str, float | None]:
    d: dict[str, float | None] = {"mean": M.mean(values)}
    d.update({k: M.quantile(values, q) for k, q in QUANTILES.items()})
    return d


def summarize(rs: list[Record], slo: dict[str, float], rate: float) -> dict[str, Any]:
    """One rate on one URL: counts, window, throughput, goodput, latency distributions, SLO flags."""
    for r in rs:
        r.good = is_good(r, slo)
    if rs:
        start = min(r.sent_s for r in rs)
        end = max(r.sent_s + (r.e2e or 0.0) for r in rs)
    else:
        start = end = 0.0
    window = max(end - start, 1e-9)
    completed = [r for r in rs if r.outcome == "completed"]
    good = [r for r in completed if r.good]
    lags = [r.sent_s - r.scheduled_s for r in rs]
    out_tokens = sum(r.output_tokens or 0 for r in completed)
    s: dict[str, Any] = {
        "rate": rate,
        "requests": len(rs),
        "outcomes": _outcomes(rs),
        "window_s": window,
        "offered_rps": offered_rps(rs, rate),
        "throughput_rps": len(completed) / window,
        "output_tok_s": out_tokens / window,
        "goodput_rps": len(good) / window,
        "goodput_tok_s": sum(r.output_tokens or 0 for r in good) / window,
        "good_share": good_share(rs),
        "checked": sum(r.check_passed is not None for r in rs),
        "check_pass_rate": check_pass_rate(rs),
        "check_failures": dict(Counter(r.check_error for r in rs if r.check_error).most_common(3)),
        "error_rate": M.error_rate(_outcomes(rs)),
        "ttft": _dist(_ttfts(rs)),
        "itl": _dist(_gaps(rs)),
        "tpot": _dist(_tpots(rs)),
        "e2e": _dist(_e2es(rs)),
        "refusal_s": _refusals(rs),
        "prompt_tokens_mean": M.mean([r.prompt_tokens for r in completed if r.prompt_tokens is not None]),
        "output_tokens_mean": M.mean([r.output_tokens for r in completed if r.output_tokens is not None]),
        "tokens_from_usage": all(r.tokens_from == "usage" for r in completed),
        "send_lag_p99_s": M.quantile(lags, 0.99),
        "errors": dict(Counter(r.error for r in rs if r.error).most_common(5)),
    }
    s["slo_flags"] = slo_flags(s, slo)
    return s


def offered_rps(rs: Sequence[Record], rate: float) -> float:
    """The rate really offered: sends over the send span (a short Poisson sample strays from the
    nominal rate), not over the whole window, which a slow server's backlog would stretch."""
    sent = sorted(r.sent_s for r in rs)
    if len(sent) < 2 or sent[-1] <= sent[0]:
        return rate
    return (len(sent) - 1) / (sent[-1] - sent[0])


def slo_flags(s: dict[str, Any], slo: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Aggregate SLOs: each key's observed figure and whether it is within the bound."""
    flags = {}
    for key, bound in slo.items():
        if key in PER_REQUEST:
            continue
        if key == "error_rate":
            value = s["error_rate"]
        else:
            metric, _, stat = key.partition("_")
            value = s.get(metric, {}).get(stat)
        flags[key] = {"bound": bound, "value": value, "ok": value is not None and value <= bound}
    return flags


def bootstrap(
    a: list[Record], b: list[Record], metric: Metric, n: int, rng: random.Random
) -> tuple[float | None, float | None, float | None]:
    """B's change against A (relative, or absolute for shares) and its 95 % bootstrap interval."""
    va, vb = metric.of(a), metric.of(b)
    if va is None or vb is None or not a or not b:
        return None, None, None

    def change(x: float, y: float) -> float | None:
        if not metric.relative:
            return y - x
        return (y - x) / x if x > 0 else None

    point = change(va, vb)
    if point is None:
        return None, None, None
    draws = []
    for _ in range(n):
        x = metric.of([a[rng.randrange(len(a))] for _ in a])
        y = metric.of([b[rng.randrange(len(b))] for _ in b])
        if x is not None and y is not None and (c := change(x, y)) is not None:
            draws.append(c)
    if len(draws) < n // 2:
        return point, None, None
    return point, M.quantile(draws, 0.025), M.quantile(draws, 0.975)


def verdict(
    metric: Metric,
    name_b: str,
    rate: float,
    point: float | None,
    lo: float | None,
    hi: float | None,
    margin: float,
) -> dict[str, Any]:
    """One line per metric: "B is X % worse at rate r (95 % CI lo..hi %)" or no verdict."""
    v: dict[str, Any] = {"metric": metric.name, "rate": rate, "change": point, "ci_low": lo, "ci_high": hi}
    if point is None or lo is None or hi is None:
        v.update(verdict="inconclusive", text=f"{name_b}: {metric.name} at rate {rate:g}: not enough data")
        return v
    sign = 1 if metric.higher_is_worse else -1
    worse_lo, worse_hi = sorted((sign * lo, sign * hi))
    unit = " %" if metric.relative else " points"  # shares (error rate, goodput) in percentage points
    mag = abs(point) * 100.0
    ci = f"(95 % CI {lo * 100:+.1f}..{hi * 100:+.1f}{unit})"
    if worse_lo > margin:
        v["verdict"], word = "worse", "worse"
    elif worse_hi < -margin:
        v["verdict"], word = "better", "better"
    else:
        v["verdict"] = "no difference"
        v["text"] = f"{name_b} is not distinguishable on {metric.name} at rate {rate:g} {ci}"
        return v
    v["text"] = f"{name_b} is {mag:.1f}{unit} {word} on {metric.name} at rate {rate:g} {ci}"
    return v
