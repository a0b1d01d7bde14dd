"""How far apart two cohorts' next-token distributions are on the same teacher-forced tokens.

Both cohorts score stable's greedy answer token by token (vLLM's `prompt_logprobs` with the top k):
for every answer position each returns the actual token's log-probability and its k most likely
tokens. From those, per item:
- the mean |Δ log-probability| of the actual tokens: two-sided, so a canary that grows *more*
  confident in stable's answer (a changed positional encoding can) counts as much as one that grows
  less confident;
- the mean KL(stable || canary) of the next-token distributions, coarsened to the tokens both
  cohorts listed plus one "everything else" bucket: exact for that coarsening (no guessed values)
  and, by the data-processing inequality, never more than the true KL;
- whether the canary tokenized stable's answer into the same token ids at all (a tokenizer change
  moves every position after the first difference; the figures above are then meaningless for the
  item, which counts as diverged).
No I/O: analysis/quality.py asks the pods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Top tokens asked per position: enough to cover almost all of a small model's next-token mass on
# its own greedy answer, few enough to keep the scoring responses small (k entries per token).
TOP_K = 5


@dataclass(frozen=True)
class TokenScore:
    """One answer position as a cohort scored it: the actual token and the top-k log-probabilities."""

    token_id: int
    logprob: float
    top: dict[int, float]  # token id -> log-probability, the actual token included


def parse_entry(entry: dict[str, Any]) -> TokenScore:
    """One vLLM-style `prompt_logprobs` entry: {str(token id): {"logprob": x, ...}, ...}, the actual
    token first (its own rank), then the top k."""
    items = [(int(k), float(v["logprob"] if isinstance(v, dict) else v)) for k, v in entry.items()]
    token, lp = items[0]
    return TokenScore(token, lp, dict(items))


def coarse_kl(p: dict[int, float], q: dict[int, float]) -> float:
    """KL(p || q) over the tokens both list, plus the rest of each distribution as one bucket."""
    both = p.keys() & q.keys()
    kl, p_in, q_in = 0.0, 0.0, 0.0
    for t in both:
        pt, qt = math.exp(p[t]), math.exp(q[t])
        kl += pt * (p[t] - q[t])
        p_in, q_in = p_in + pt, q_in + qt
    p_rest, q_rest = max(1.0 - p_in, 0.0), max(1.0 - q_in, 0.0)
    if p_rest > 1e-12:
        kl += p_rest * (math.log(p_rest) - math.log(max(q_rest, 1e-12)))
    return max(kl, 0.0)  # rounding of exp() near 1 can leave -1e-17


@dataclass(frozen=True)
class ItemDivergence:
    aligned: bool  # the canary scored the same token ids as stable
    tokens: int  # answer positions compared
    logprob_delta: float | None  # mean |Δ log-probability| (None: not aligned or nothing scored)
    kl: float | None  # mean coarsened KL(stable || canary)
    signed: float | None  # mean (stable - canary) log-probability: the one-way drop


def item_divergence(stable: list[TokenScore], canary: list[TokenScore]) -> ItemDivergence:
    """The figures of one item from both cohorts' scores of the same answer.

    Each cohort's scored region starts where its own generation prompt ended; a canary whose template
    adds no generation prompt starts earlier and scores the assistant header too, so when the canary's
    region ends with stable's tokens, its tail is the answer."""
    ids = [s.token_id for s in stable]
    if len(canary) > len(stable) and [c.token_id for c in canary[len(canary) - len(stable) :]] == ids:
        canary = canary[len(canary) - len(stable) :]
    aligned = ids == [c.token_id for c in canary]
    if not aligned or not stable:
        return ItemDivergence(aligned, min(len(stable), len(canary)), None, None, None)
    n = len(stable)
    return ItemDivergence(
        aligned=True,
        tokens=n,
        logprob_delta=sum(abs(s.logprob - c.logprob) for s, c in zip(stable, canary, strict=True)) / n,
        kl=sum(coarse_kl(s.top, c.top) for s, c in zip(stable, canary, strict=True)) / n,
        signed=sum(s.logprob - c.logprob for s, c in zip(stable, canary, strict=True)) / n,
    )


def first_difference(a: tuple[str, ...], b: tuple[str, ...]) -> int | None:
    """The index of the first token where two greedy answers differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
