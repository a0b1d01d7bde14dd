"""Next-token choice: greedy, or temperature / top-k / top-p with an optional per-request seed."""

from __future__ import annotations

import torch

from modeldeploy.runtime.engine.sequence import Sequence


class Sampler:
    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        if seq.params.seed is None:
            return None
        gen = self._generators.get(seq.request_id)
        if gen is None:
            gen = self._generators[seq.request_id] = torch.Generator().manual_seed(seq.params.seed)
        return gen

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits [B, V] float32 -> one token id per sequence."""
        if not seqs:
            return []
        greedy = logits.argmax(dim=-1).tolist()
        out = []
        for row, seq in enumerate(seqs):
            p = seq.params
            if p.greedy:
                out.append(greedy[row])
                continue
            x = logits[row].float().cpu() / p.temperature
            if 0 < p.top_k < x.shape[-1]:
                kth = torch.topk(x, p.top_k).values[-1]
                x = x.masked_fill(x < kth, float("-inf"))
            if p.top_p < 1.0:
                sorted_x, idx = torch.sort(x, descending=True)
                probs = torch.softmax(sorted_x, dim=-1)
                drop = probs.cumsum(-1) - probs > p.top_p  # keep the smallest set reaching top_p
                x[idx[drop]] = float("-inf")
            probs = torch.softmax(x, dim=-1)
            if not torch.isfinite(probs).all():  # overflowing logits: argmax is the limit
                out.append(greedy[row])
                continue
            out.append(int(torch.multinomial(probs, 1, generator=self._generator(seq)).item()))
        return out
