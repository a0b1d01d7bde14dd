"""Teacher-forced log-probabilities of prompt tokens (vLLM's `prompt_logprobs`).

The hidden state at prompt position p predicts prompt token p + 1, so a prefill chunk covering
positions [start, end) scores tokens start + 1 .. end (the last prompt position predicts the first
generated token instead: the sampler's row, not a prompt score). Scores are of the model's raw
distribution (float32 log_softmax of the logits, before penalties, bias or temperature) and only the
actual token and the top k leave the device, so memory stays bounded by a slice of rows times the
vocabulary, however long the prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from modeldeploy.runtime.engine.core.sequence import Sequence

# Rows of [rows, vocab] float32 logits scored at once: 64 Mi elements (256 MiB) at most.
MAX_SCORE_ELEMENTS = 1 << 26


@dataclass
class PromptLogprob:
    """One prompt token's score: its logprob, its 1-based rank in the distribution (1 + the number of
    tokens strictly more likely) and the k most likely tokens, most likely first."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


def scoring_rows(rows: list[tuple[Sequence, int]]) -> list[tuple[Sequence, list[int], list[int]]]:
    """Per sequence that scores its prompt this step: (seq, flat row indices, target token ids).

    `rows` is the step's (sequence, token count) in flat order. A sequence recomputed after a
    preemption skips the positions it has scored already.
    """
    out = []
    at = 0
    for seq, n in rows:
        if seq.scores_prompt:
            start = seq.num_computed_tokens
            first = max(start, len(seq.prompt_logprobs))  # hidden position p scores token p + 1
            if len(seq.prompt_logprobs) < start:  # the prefix cache is off while scoring: never skipped
                raise RuntimeError(f"prompt_logprobs: {seq.request_id} skipped prompt positions")
            last = min(start + n, seq.num_prompt_tokens - 1)
            if first < last:
                flat = list(range(at + first - start, at + last - start))
                out.append((seq, flat, seq.prompt_token_ids[first + 1 : last + 1]))
        at += n
    return out


@torch.inference_mode()
def score(
    hidden: torch.Tensor,
    rows: list[tuple[Sequence, int]],
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    vocab_size: int,
) -> None:
    """Append each scoring sequence's PromptLogprob entries for this step's chunk (rank 0 only: it
    holds the whole lm_head; the other tensor-parallel ranks only ran the same forward)."""
    work = scoring_rows(rows)
    if not work:
        return
    flat = [r for _, f, _ in work for r in f]
    targets = [t for _, _, ts in work for t in ts]
    ks = [seq.params.prompt_logprobs or 0 for seq, f, _ in work for _ in f]
    k = max(ks)
    step = max(1, MAX_SCORE_ELEMENTS // max(vocab_size, 1))
    entries: list[PromptLogprob] = []
    for i in range(0, len(flat), step):
        idx = torch.tensor(flat[i : i + step], dtype=torch.int64, device=hidden.device)
        tgt = torch.tensor(targets[i : i + step], dtype=torch.int64, device=hidden.device)
        lp = torch.log_softmax(logits_fn(hidden[idx]).float(), dim=-1)
        actual = lp.gather(1, tgt[:, None])
        rank = (lp > actual).sum(dim=-1) + 1
        top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], tgt[:, None][:, :0])
        for j, (t, a, r, tv, ti) in enumerate(
            zip(
                targets[i : i + step],
                actual[:, 0].tolist(),
                rank.tolist(),
                top_v.tolist(),
                top_i.tolist(),
                strict=True,
            )
        ):
            kk = ks[i + j]
            entries.append(PromptLogprob(t, a, r, list(zip(ti[:kk], tv[:kk], strict=True))))
    at = 0
    for seq, f, _ in work:
        seq.prompt_logprobs.extend(entries[at : at + len(f)])
        at += len(f)
