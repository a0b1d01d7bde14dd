"""Next-token choice for a whole step as a handful of batched tensor ops.

Order, per row, matching OpenAI/vLLM semantics: repetition penalty (prompt + output tokens),
frequency and presence penalties (output tokens), logit bias, min_tokens (EOS and stop ids
masked), grammar mask. Logprobs are read here, from exactly these logits. Then temperature,
top-k, top-p and the draw. Sampling uses the exponential race (argmax of p / q, q ~ Exp(1)),
which equals a multinomial draw and lets every row draw at once; only rows with a seed get
their own generator (so the same seed gives the same tokens whatever else is batched). One
host transfer per step, at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from modeldeploy.runtime.engine.core.sequence import Sequence

MaskFn = Callable[[torch.Tensor, torch.Tensor, list[int]], torch.Tensor]


@dataclass
class TokenLogprob:
    logprob: float  # of the chosen token
    top: list[tuple[int, float]]  # the k most likely tokens, most likely first


@dataclass
class SamplerOutput:
    tokens: list[int]
    logprobs: list[TokenLogprob | None]


class Sampler:
    def __init__(self, eos_token_ids: set[int] | None = None, apply_mask: MaskFn | None = None) -> None:
        """apply_mask(logits, bitmask, rows) -> masked logits; the grammar library's own kernel when
        given (the engine passes xgrammar's), else a torch unpacking of the bits."""
        self.eos_token_ids = sorted(eos_token_ids or ())
        self.apply_mask = apply_mask or _apply_bitmask
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, seq: Sequence, seed: int) -> torch.Generator:
        gen = self._generators.get(seq.request_id)
        if gen is None:
            gen = self._generators[seq.request_id] = torch.Generator().manual_seed(seed + seq.index)
        return gen

    @torch.inference_mode()
    def sample(
        self,
        logits: torch.Tensor,
        seqs: list[Sequence],
        bitmask: torch.Tensor | None = None,
        masked_rows: list[int] | None = None,
    ) -> SamplerOutput:
        """logits [B, V] -> one token per sequence. `bitmask` [B, ceil(V/32)] int32 (xgrammar's
        layout) constrains `masked_rows`; the other rows are left as they are."""
        if not seqs:
            return SamplerOutput([], [])
        params = [s.params for s in seqs]
        logits = logits.float()
        if any(p.penalized for p in params):
            logits = self._penalize(logits, seqs)
        if any(p.logit_bias for p in params):
            logits = self._bias(logits, seqs)
        if any(len(s.output_token_ids) < s.params.min_tokens and s.grammar is None for s in seqs):
            logits = self._min_tokens(logits, seqs)
        if bitmask is not None and masked_rows:
            logits = self.apply_mask(logits.contiguous(), bitmask, masked_rows)
        greedy = logits.argmax(dim=-1)
        if all(p.greedy for p in params):
            tokens = greedy
        else:
            tokens = self._draw(logits, seqs, greedy)
        want = [p.logprobs is not None for p in params]
        if not any(want):
            return SamplerOutput(tokens.tolist(), [None] * len(seqs))
        return self._with_logprobs(logits, tokens, params)

    # ---- logits processors (each one op over the rows that ask for it) --------------------
    def _penalize(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        B, V = logits.shape
        dev = logits.device
        outs = [s.output_token_ids for s in seqs]
        width = max((len(o) for o in outs), default=0)
        out_ids = torch.tensor([o + [V] * (width - len(o)) for o in outs], dtype=torch.int64).reshape(
            B, width
        )
        counts = torch.zeros(B, V + 1, device=dev).scatter_add_(
            1, out_ids.to(dev), torch.ones(B, width, device=dev)
        )[:, :V]
        pres = torch.tensor([s.params.presence_penalty for s in seqs], device=dev)[:, None]
        freq = torch.tensor([s.params.frequency_penalty for s in seqs], device=dev)[:, None]
        rep = torch.tensor([s.params.repetition_penalty for s in seqs], device=dev)[:, None]
        if bool((rep != 1.0).any()):
            prompts = [s.prompt_token_ids for s in seqs]
            pw = max(len(p) for p in prompts)
            p_ids = torch.tensor([p + [V] * (pw - len(p)) for p in prompts], dtype=torch.int64).reshape(B, pw)
            seen = torch.zeros(B, V + 1, dtype=torch.bool, device=dev)
            seen.scatter_(1, p_ids.to(dev), True)
            seen = seen[:, :V] | (counts > 0)
            scaled = torch.where(logits > 0, logits / rep, logits * rep)
            logits = torch.where(seen, scaled, logits)
        return logits - freq * counts - pres * (counts > 0).float()

    def _bias(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        rows, cols, vals = [], [], []
        V = logits.shape[1]
        for i, s in enumerate(seqs):
            for tok, b in s.params.logit_bias.items():
                if tok < V:
                    rows.append(i)
                    cols.append(tok)
                    vals.append(float(b))
        bias = torch.zeros_like(logits)
        bias[torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64)] = torch.tensor(
            vals, device=logits.device
        )
        return logits + bias

    def _min_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        rows, cols = [], []
        V = logits.shape[1]
        for i, s in enumerate(seqs):
            if (
                len(s.output_token_ids) < s.params.min_tokens and s.grammar is None
            ):  # a grammar decides its end
                banned = set(s.params.stop_token_ids) | (
                    set() if s.params.ignore_eos else set(self.eos_token_ids)
                )
                for tok in banned:
                    if tok < V:
                        rows.append(i)
                        cols.append(tok)
        ban = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
        ban[torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64)] = True
        return logits.masked_fill(ban, float("-inf"))

    # ---- the draw ------------------------------------------------------------------------------
    def _draw(self, logits: torch.Tensor, seqs: list[Sequence], greedy: torch.Tensor) -> torch.Tensor:
        dev = logits.device
        params = [s.params for s in seqs]
        is_greedy = torch.tensor([p.greedy for p in params], device=dev)
        temp = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=dev)[:, None]
        x = logits / temp
        V = x.shape[1]
        top_k = [p.top_k if 0 < p.top_k < V else V for p in params]
        top_p = [p.top_p for p in params]
        if min(top_k) < V or min(top_p) < 1.0:
            x = _top_k_top_p(x, torch.tensor(top_k, device=dev), torch.tensor(top_p, device=dev))
        probs = torch.softmax(x, dim=-1)
        q = torch.empty_like(probs).exponential_()
        for i, s in enumerate(seqs):  # only seeded, sampled rows: their own generator, their own draws
            seed = s.params.seed
            if seed is not None and not s.params.greedy:
                q[i] = torch.empty(V).exponential_(generator=self._generator(s, seed)).to(dev)
        drawn = (probs / q).argmax(dim=-1)
        finite = torch.isfinite(probs.sum(dim=-1))  # overflowing logits (NaN probs): argmax is the limit
        return torch.where(is_greedy | ~finite, greedy, drawn)

    def _with_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor, params: list) -> SamplerOutput:
        lp = torch.log_softmax(logits, dim=-1)
        chosen = lp.gather(1, tokens[:, None])[:, 0]
        k = max(p.logprobs or 0 for p in params)
        top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], tokens[:, None][:, :0])
        toks, ch, tv, ti = tokens.tolist(), chosen.tolist(), top_v.tolist(), top_i.tolist()
        out: list[TokenLogprob | None] = []
        for r, p in enumerate(params):
            if p.logprobs is None:
                out.append(None)
            else:
                out.append(
                    TokenLogprob(ch[r], list(zip(ti[r][: p.logprobs], tv[r][: p.logprobs], strict=True)))
                )
        return SamplerOutput(toks, out)


def _top_k_top_p(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask every row to its top-k, then to the smallest set reaching top_p (one sort for the batch)."""
    sorted_x, idx = torch.sort(x, dim=-1, descending=True)
    kth = sorted_x.gather(1, (top_k - 1)[:, None])
    sorted_x = sorted_x.masked_fill(
        sorted_x < kth, float("-inf")
    )  # ties with the k-th stay, as topk's value test
    probs = torch.softmax(sorted_x, dim=-1)
    drop = (probs.cumsum(-1) - probs) > top_p[:, None]  # keep the smallest prefix reaching top_p
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(1, idx, sorted_x)


def _apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """-inf where the packed bit (token t: word t // 32, bit t % 32) is 0, on `rows` only, in one op."""
    V = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    bits = (bitmask.to(logits.device)[:, :, None] >> shifts) & 1  # [B, W, 32]
    allowed = bits.reshape(bitmask.shape[0], -1)[:, :V].bool()
    constrained = torch.zeros(logits.shape[0], 1, dtype=torch.bool, device=logits.device)
    constrained[rows] = True
    return logits.masked_fill(constrained & ~allowed, float("-inf"))
