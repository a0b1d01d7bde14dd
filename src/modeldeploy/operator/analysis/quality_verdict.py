"""The quality gate's figures over a set, its verdict, and the evidence a human reads.

Figures, from the same items answered greedily by one canary pod and one stable pod, and stable's
answers scored by both (teacher forcing, divergence.py):
- accuracy: the share of items whose answer passes its check, per cohort;
- greedy agreement: the share of items whose first N answer tokens are identical, and answer
  agreement: the share whose whole answers are (where an answer stops is part of it);
- tokenization: the share of scored items the canary split into stable's token ids;
- mean log-probability of stable's answers per cohort, whose difference is the one-way drop;
- log-probability delta: the mean per-token |Δ log-probability|, two-sided;
- KL: the mean per-token KL(stable || canary) over the top tokens.

Thresholds left unset in the spec come from the spread of harmless changes measured for the cohorts'
precision (`TOLERANCES`, bench/results/quality.md): float32 on both sides reproduces greedy answers and
log-probabilities under harmless changes (under 5e-5 nats), so there every figure is judged tightly;
other precisions get the wider tolerances. An intended model change (a new model digest) with
`accuracyFloor` is judged by that floor alone. No I/O here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from modeldeploy.operator.analysis.divergence import (
    ItemDivergence,
    TokenScore,
    first_difference,
    item_divergence,
)
from modeldeploy.operator.api.v1alpha1.quality import EvalItem, Quality
from modeldeploy.operator.api.v1alpha1.status import DivergentItem, MetricVerdict, QualityResult

ACCURACY, AGREEMENT, ANSWERS = "accuracy", "greedy_agreement", "answer_agreement"
TOKENIZATION, LOGPROB, DELTA, KL = "tokenization", "mean_logprob", "logprob_delta", "kl"


@dataclass(frozen=True)
class Tolerance:
    """Default thresholds for one precision class."""

    accuracy_share: float  # items a canary may pass fewer than stable, as a share of the set
    agreement: float
    answer_agreement: float
    logprob_drop: float
    logprob_delta: float
    kl: float


# Float32 on both sides: every harmless change measured on the real model (batch size, prefill order,
# TP=3, file layout: 10 gates each, bench/results/quality.md) gave identical greedy answers and moved
# no log-probability figure by 5e-6 (5e-5 where read to 4 decimals); these bounds sit well over that
# floor and under every bad class measured there (the subtlest, rms_norm_eps 10x in config.json
# alone, moved |Δ| by 0.0019 and nothing else). The drop keeps its earlier 0.005: |Δ| bounds it anyway. Other
# precisions (bf16/fp16: batch-dependent reduction order, arXiv 2506.09501) keep the earlier
# conservative bounds until their spread is measured on GPUs; the answer agreement is not judged there
# (a near-tie flips a long answer's tail).
FLOAT32 = Tolerance(accuracy_share=0.03, agreement=0.9, answer_agreement=0.85, logprob_drop=0.005,
                    logprob_delta=0.001, kl=0.0005)  # fmt: skip
OTHER = Tolerance(accuracy_share=0.1, agreement=0.5, answer_agreement=0.0, logprob_drop=0.1,
                  logprob_delta=0.1, kl=0.05)  # fmt: skip


@dataclass(frozen=True)
class Thresholds:
    """The thresholds one gate applies: the spec's, else its precision's defaults."""

    accuracy_drop: int
    agreement: float
    answer_agreement: float
    logprob_drop: float
    logprob_delta: float
    kl: float

    @classmethod
    def of(cls, q: Quality, float32: bool, items: int) -> Thresholds:
        t = FLOAT32 if float32 else OTHER
        pick = lambda spec, default: default if spec is None else spec  # noqa: E731
        drop = max(1, math.floor(t.accuracy_share * items + 1e-9))
        return cls(
            accuracy_drop=pick(q.max_accuracy_drop, drop),
            agreement=pick(q.min_agreement, t.agreement),
            answer_agreement=pick(q.min_answer_agreement, t.answer_agreement),
            logprob_drop=pick(q.max_logprob_drop, t.logprob_drop),
            logprob_delta=pick(q.max_logprob_delta, t.logprob_delta),
            kl=pick(q.max_kl, t.kl),
        )


def logprob_threshold(q: Quality, float32: bool) -> float:
    """The log-probability drop allowed: the spec's, else the default for the cohorts' precision."""
    return Thresholds.of(q, float32, 0).logprob_drop


@dataclass(frozen=True)
class Answer:
    """One cohort's greedy answer to one item, and its scores of stable's answer."""

    text: str
    tokens: tuple[str, ...]  # the answer's token strings, in order (chat logprobs)
    passed: bool
    scores: tuple[TokenScore, ...] | None = None  # this cohort's teacher-forced scores of stable's answer


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


@dataclass(frozen=True)
class Figures:
    items: int
    stable_passed: int
    canary_passed: int
    agreement: float  # share of items whose first N tokens are identical
    answer_agreement: float  # share of items whose whole answers are identical
    scored: int  # items stable answered (non-empty) and both cohorts scored
    aligned: int  # of those, items the canary tokenized as stable did
    stable_logprob: float | None  # mean over aligned items of stable's mean per-token logprob
    canary_logprob: float | None
    logprob_delta: float | None  # mean over aligned items of the mean per-token |Δ log-probability|
    kl: float | None
    per_item: tuple[ItemDivergence | None, ...]  # None: stable's answer empty or unscored

    @property
    def divergence(self) -> float | None:
        """Mean over items of (stable's - canary's) mean per-token log-probability of stable's answer."""
        if self.stable_logprob is None or self.canary_logprob is None:
            return None
        return self.stable_logprob - self.canary_logprob

    @property
    def tokenization(self) -> float:
        return self.aligned / self.scored if self.scored else 1.0


def figures(pairs: list[tuple[Answer, Answer]], agreement_tokens: int) -> Figures:
    """The figures over (stable, canary) answers to the same items."""
    n = len(pairs)
    agree = sum(s.tokens[:agreement_tokens] == c.tokens[:agreement_tokens] for s, c in pairs)
    per_item = tuple(
        item_divergence(list(s.scores), list(c.scores))
        if s.text and s.scores is not None and c.scores is not None
        else None
        for s, c in pairs
    )
    pairs_d = zip(pairs, per_item, strict=True)
    ok = [(s, d) for (s, _), d in pairs_d if d is not None and d.aligned and d.tokens]
    stable_lp = [sum(t.logprob for t in s.scores or ()) / d.tokens for s, d in ok]
    return Figures(
        items=n,
        stable_passed=sum(s.passed for s, _ in pairs),
        canary_passed=sum(c.passed for _, c in pairs),
        agreement=agree / n if n else 0.0,
        answer_agreement=sum(s.tokens == c.tokens for s, c in pairs) / n if n else 0.0,
        scored=sum(d is not None for d in per_item),
        aligned=len(ok),
        stable_logprob=_mean(stable_lp),
        canary_logprob=_mean([lp - (d.signed or 0.0) for lp, (_, d) in zip(stable_lp, ok, strict=True)]),
        logprob_delta=_mean([d.logprob_delta for _, d in ok if d.logprob_delta is not None]),
        kl=_mean([d.kl for _, d in ok if d.kl is not None]),
        per_item=per_item,
    )


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def verdict(
    f: Figures, q: Quality, model_change: str | None = None, float32: bool = False
) -> tuple[bool, list[MetricVerdict], str]:
    """(passed, per-figure verdicts, summary). `model_change`: "old -> new" model digests when the canary
    serves another model; with `accuracyFloor` set such a canary is judged by the floor alone.
    `float32`: both cohorts compute in float32 (their /v1/bundle dtype): the tight tolerances."""
    n = max(f.items, 1)
    t = Thresholds.of(q, float32, f.items)
    s_acc, c_acc = f.stable_passed / n, f.canary_passed / n
    floor_mode = model_change is not None and q.accuracy_floor is not None
    v = lambda ok: "Pass" if ok else "Fail"  # noqa: E731
    le = lambda x, bound: x is None or x <= bound  # noqa: E731 - nothing scored: not judged (summary says)
    acc_ok = f.stable_passed - f.canary_passed <= t.accuracy_drop
    acc_threshold = max((f.stable_passed - t.accuracy_drop) / n, 0.0)
    if q.accuracy_floor is not None and floor_mode:
        acc_ok, acc_threshold = c_acc >= q.accuracy_floor, q.accuracy_floor
    elif q.accuracy_floor is not None:
        acc_ok, acc_threshold = acc_ok and c_acc >= q.accuracy_floor, max(acc_threshold, q.accuracy_floor)
    checks: list[tuple[str, bool, float | None, float | None, float | None, int]] = [
        # (metric, ok, stable, canary, threshold, samples)
        (ACCURACY, acc_ok, s_acc, c_acc, acc_threshold, f.items),
        (AGREEMENT, f.agreement >= t.agreement, None, f.agreement, t.agreement, f.items),
        (ANSWERS, f.answer_agreement >= t.answer_agreement, None, f.answer_agreement, t.answer_agreement,
         f.items),
        (TOKENIZATION, f.tokenization >= t.agreement, None, f.tokenization, t.agreement, f.scored),
        (LOGPROB, le(f.divergence, t.logprob_drop), f.stable_logprob, f.canary_logprob,
         None if f.stable_logprob is None else f.stable_logprob - t.logprob_drop, f.aligned),
        (DELTA, le(f.logprob_delta, t.logprob_delta), None, f.logprob_delta, t.logprob_delta, f.aligned),
        (KL, le(f.kl, t.kl), None, f.kl, t.kl, f.aligned),
    ]  # fmt: skip
    if floor_mode:  # the other figures are shown, not judged: the canary is another model
        checks = [checks[0], *((m, True, st, ca, None, k) for m, _, st, ca, _, k in checks[1:])]
    metrics = [
        MetricVerdict(metric=m, stable=_r(st), canary=_r(ca), threshold=_r(th), samples=k, verdict=v(ok))
        for m, ok, st, ca, th, k in checks
    ]
    passed = all(ok for _, ok, *_ in checks)
    if floor_mode:
        assert q.accuracy_floor is not None
        how = f"intended model change ({model_change}): judged by accuracyFloor {q.accuracy_floor:g} alone"
    else:
        how = "canary against stable" if model_change is None else model_change
    return passed, metrics, _summary(passed, f, how)


def _summary(ok: bool, f: Figures, how: str) -> str:
    num = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
    return (
        f"quality {'passed' if ok else 'failed'}: accuracy canary {f.canary_passed}/{f.items} stable "
        f"{f.stable_passed}/{f.items}, greedy agreement {f.agreement:.2f}, answers identical "
        f"{f.answer_agreement:.2f}, log-prob drop {num(f.divergence)}, |delta| {num(f.logprob_delta)}, "
        f"KL {num(f.kl)} nats/token over {f.aligned} of {f.scored} items tokenized alike ({how})"
    )


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def divergent(
    items: list[EvalItem], pairs: list[tuple[Answer, Answer]], f: Figures, delta_bound: float
) -> list[DivergentItem]:
    """The items that diverged most, worst first (at most 5): tokenized differently, then answered
    differently, then scored more than `delta_bound` apart; each with where the answers part."""
    rows: list[tuple[tuple[int, float], DivergentItem]] = []
    for i, (it, (s, c), d) in enumerate(zip(items, pairs, f.per_item, strict=True)):
        at = first_difference(s.tokens, c.tokens)
        delta = d.logprob_delta if d is not None else None
        aligned = d is None or d.aligned
        if at is None and aligned and (delta is None or delta <= delta_bound):
            continue
        rank = (0 if not aligned else 1 if at is not None else 2, -(delta or 0.0))
        last = it.chat()[-1]["content"]
        rows.append((rank, DivergentItem(
            index=i, prompt=_short(" ".join(last.split()), 120), at=at,
            stable=_short("".join(s.tokens[at:]) if at is not None else s.text),
            canary=_short("".join(c.tokens[at:]) if at is not None else c.text),
            logprob_delta=_r(delta), kl=_r(d.kl if d is not None else None), aligned=aligned,
        )))  # fmt: skip
    return [r for _, r in sorted(rows, key=lambda x: x[0])[:5]]


def evidence(rows: list[DivergentItem]) -> str:
    """The divergent items in words, for the message, the Events and the rollback decision."""
    out = []
    for r in rows[:3]:
        where = (
            "tokenized differently"
            if not r.aligned
            else f"answers part at token {r.at}: stable {r.stable!r} canary {r.canary!r}"
            if r.at is not None
            else f"same answer, |delta| {r.logprob_delta} KL {r.kl}"
        )
        out.append(f"item {r.index} {r.prompt[:60]!r}: {where}")
    more = f" (+{len(rows) - 3} more in status.lastQuality.divergent)" if len(rows) > 3 else ""
    return "; ".join(out) + more


def failed_figures(result: QualityResult) -> str:
    """The failing figures in words, for the rollback message: value, stable's and the threshold."""
    bad = [m for m in result.metrics if m.verdict == "Fail"]
    return "; ".join(f"{m.metric} canary={m.canary} stable={m.stable} threshold={m.threshold}" for m in bad)
