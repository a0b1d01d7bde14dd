"""The batched sampler against per-row reference computations (no model needed)."""

from __future__ import annotations

import torch

from modeldeploy.runtime.engine.core.sequence import Sequence
from modeldeploy.runtime.engine.sample.sampler import Sampler, _top_k_top_p
from modeldeploy.runtime.engine.sampling_params import SamplingParams

V = 64


def seq(rid: str, params: SamplingParams, prompt=(1, 2, 3), out=()) -> Sequence:
    s = Sequence(rid, list(prompt), params)
    s.token_ids += list(out)
    return s


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_are_argmax():
    x = logits(5)
    seqs = [seq(f"g{i}", SamplingParams(temperature=0.0)) for i in range(5)]
    assert Sampler().sample(x, seqs).tokens == x.argmax(-1).tolist()


def test_top_k_top_p_match_a_per_row_reference():
    x = logits(4, seed=1)
    ks, ps = [3, V, 10, 1], [1.0, 0.5, 0.8, 0.3]
    got = _top_k_top_p(x.clone(), torch.tensor(ks), torch.tensor(ps))
    for r in range(4):
        ref = x[r].clone()
        if ks[r] < V:
            ref = ref.masked_fill(ref < torch.topk(ref, ks[r]).values[-1], float("-inf"))
        sx, idx = torch.sort(ref, descending=True)
        pr = torch.softmax(sx, -1)
        ref[idx[(pr.cumsum(-1) - pr) > ps[r]]] = float("-inf")
        assert torch.equal(torch.isinf(got[r]), torch.isinf(ref)), r
        keep = ~torch.isinf(ref)
        assert torch.allclose(got[r][keep], ref[keep])


def test_seeded_row_is_independent_of_its_batch():
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=42)
    sampler = Sampler()
    mixed = []
    for s in range(8):
        x = torch.cat([logits(2, seed=100 + s), logits(1, seed=s)])
        seqs = [
            seq("u", SamplingParams(temperature=1.0)),
            seq("g", SamplingParams(temperature=0)),
            seq("a", p),
        ]
        mixed.append(sampler.sample(x, seqs).tokens[2])
    fresh = Sampler()
    alone = [fresh.sample(logits(1, seed=s), [seq("a", p)]).tokens[0] for s in range(8)]
    assert mixed == alone


def test_draw_follows_the_distribution():
    x = torch.tensor([[0.0, 1.0, 2.0, -30.0]]).repeat(4000, 1)
    seqs = [seq(f"r{i}", SamplingParams(temperature=1.0)) for i in range(4000)]
    torch.manual_seed(0)
    toks = torch.tensor(Sampler().sample(x, seqs).tokens)
    freq = torch.bincount(toks, minlength=4).float() / 4000
    expect = torch.softmax(x[0], -1)
    assert (freq - expect).abs().max() < 0.03  # binomial sd at n=4000 is < 0.008
    assert freq[3] == 0


def test_temperature_top_k_one_is_greedy_and_bitmask_masks_only_its_rows():
    x = logits(3, seed=5)
    seqs = [
        seq("a", SamplingParams(temperature=1.5, top_k=1, seed=1)),
        seq("b", SamplingParams(temperature=0)),
    ]
    seqs.append(seq("c", SamplingParams(temperature=0)))
    words = (V + 31) // 32
    bitmask = torch.full((3, words), -1, dtype=torch.int32)
    bitmask[2] = 0
    bitmask[2, 0] = 1 << 7  # only token 7 allowed on row 2
    bitmask[1] = 0  # row 1 is not in masked_rows: this must be ignored
    out = Sampler().sample(x, seqs, bitmask, masked_rows=[2]).tokens
    assert out == [int(x[0].argmax()), int(x[1].argmax()), 7]
