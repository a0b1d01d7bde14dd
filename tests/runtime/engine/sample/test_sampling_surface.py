"""logprobs, penalties, logit_bias, min_tokens and n > 1 against reference loops over transformers'
own logits (float32, CPU, random-weight tiny llama)."""

from __future__ import annotations

import pytest
import torch

from modeldeploy.runtime import LLM, SamplingParams

PROMPTS = ["The quick brown fox", "Kubernetes schedules pods onto nodes", "A"]
N = 12


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, dtype="float32", max_model_len=256)


@pytest.fixture(scope="module")
def hf(llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()


def test_logprobs_equal_log_softmax_of_transformers_logits(llm, hf):
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N, logprobs=5, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = llm.engine.encode(prompt)
        with torch.no_grad():
            logits = hf(torch.tensor([ids + out.token_ids])).logits[0].float()
        ref = torch.log_softmax(logits[len(ids) - 1 : -1], dim=-1)  # the positions that chose each token
        assert len(out.logprobs) == N
        for step, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            assert lp.logprob == pytest.approx(ref[step, tok].item(), abs=1e-4)
            vals, idx = ref[step].topk(5)
            assert [i for i, _ in lp.top] == idx.tolist()
            assert [v for _, v in lp.top] == pytest.approx(vals.tolist(), abs=1e-4)
            assert lp.top[0][0] == tok  # greedy: the chosen token is the most likely one


def reference(hf, ids: list[int], p: SamplingParams, eos: set[int]) -> list[int]:
    """The textbook loop: transformers' logits, then each processor row by row, then argmax."""
    out: list[int] = []
    for _ in range(p.max_tokens):
        with torch.no_grad():
            x = hf(torch.tensor([ids + out])).logits[0, -1].float().clone()
        if p.repetition_penalty != 1.0:
            for t in set(ids + out):
                x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        for t in set(out):
            x[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
        for t, b in p.logit_bias.items():
            x[t] += b
        if len(out) < p.min_tokens:
            for t in set(p.stop_token_ids) | eos:
                x[t] = float("-inf")
        out.append(int(x.argmax()))
    return out


@pytest.mark.parametrize(
    "kw",
    [
        {"presence_penalty": 1.5},
        {"frequency_penalty": 2.0},
        {"repetition_penalty": 1.8},
        {"presence_penalty": -0.5, "frequency_penalty": 0.7, "repetition_penalty": 1.3},
        {"logit_bias": {17: 8.0, 42: 4.0, 99: -100.0}},
    ],
    ids=lambda kw: "+".join(kw),
)
def test_penalties_and_bias_match_a_reference_loop(llm, hf, kw):
    eos = set(llm.engine.eos_token_ids)
    plain = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
    params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, **kw)
    outs = llm.generate(PROMPTS, params)  # batched together: the processors run per step for all rows
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == reference(hf, llm.engine.encode(prompt), params, eos)
    assert [o.token_ids for o in outs] != [o.token_ids for o in plain]  # they did change the outputs


def test_min_tokens_masks_stop_tokens(llm, hf):
    first = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=1))[0].token_ids[0]
    params = SamplingParams(
        temperature=0, max_tokens=N, stop_token_ids=[first], min_tokens=4, ignore_eos=True
    )
    out = llm.generate(PROMPTS[:1], params)[0]
    assert first not in out.token_ids[:4]
    ref = reference(hf, llm.engine.encode(PROMPTS[0]), params, set())
    cut = (
        ref.index(first) + 1 if first in ref[4:] else len(ref)
    )  # the engine stops at the stop token after that
    assert out.token_ids == ref[:cut]


def test_n4_shares_the_prompt_blocks(llama_dir):
    llm = LLM(llama_dir, dtype="float32", max_model_len=256, enable_prefix_caching=False)
    eng, bm = llm.engine, llm.engine.block_manager
    prompt = list(range(10, 10 + 40))  # 40 tokens: 2 full blocks of 16 and a partial one
    allocated: list[int] = []
    grow = bm.grow

    def counting_grow(seq, n):
        before = len(seq.block_table)
        grow(seq, n)
        allocated.extend(seq.block_table[before:])

    bm.grow = counting_grow
    try:
        eng.add_request(
            "n4", prompt, SamplingParams(temperature=1.0, seed=3, n=4, max_tokens=8, ignore_eos=True)
        )
        outs = []
        outs += eng.step()  # the prefill: one forward over the prompt, then 4 choices sample from it
        seqs = eng.groups["n4"]
        assert len(seqs) == 4
        shared = seqs[0].block_table[:2]
        assert all(s.block_table[:2] == shared for s in seqs)
        assert all(bm.blocks[b].ref_count == 4 for b in shared)
        assert len({s.block_table[2] for s in seqs}) == 4  # the partial block was copied per choice
        assert allocated.count(shared[0]) == allocated.count(shared[1]) == 1  # allocated once
        while eng.has_work():
            outs += eng.step()
    finally:
        bm.grow = grow
    finals = sorted((o for o in outs if o.finished), key=lambda o: o.index)
    assert [o.index for o in finals] == [0, 1, 2, 3] and all(len(o.token_ids) == 8 for o in finals)
    assert len({tuple(o.token_ids) for o in finals}) > 1
    assert bm.num_free == bm.num_total


def test_n4_choices_equal_a_manual_copy_of_the_kv(llm):
    """Forked choices see exactly the prompt's KV: greedy choices all equal the n=1 answer."""
    one = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
    four = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, n=4))
    assert len(four) == 12
    for i, o in enumerate(one):
        assert all(c.token_ids == o.token_ids for c in four[4 * i : 4 * i + 4])
