"""The engine against transformers: same weights, same greedy tokens, whatever the batching,
with the model whole (TP=1) or split over two tensor-parallel ranks (TP=2, gloo on CPU)."""

from __future__ import annotations

import pytest
import torch
from support.hf_reference import MAX_NEW, TEXT_PROMPTS, TOKEN_PROMPTS, hf_greedy

from modeldeploy.runtime import LLM, SamplingParams

VARIANTS = [
    ("llama", {}),
    ("qwen2", {}),
    ("qwen3", {}),
    ("mistral", {}),
    ("llama", {"rope_scaling": "llama3"}),
]


@pytest.fixture(
    scope="module", params=VARIANTS, ids=lambda v: v[0] + ("-" + "-".join(v[1].values()) if v[1] else "")
)
def reference(request, tiny_model):
    arch, sizes = request.param
    model_dir = tiny_model(arch, **sizes)
    llm = LLM(model_dir, dtype="float32")
    prompts = [llm.engine.encode(p) for p in TEXT_PROMPTS] + TOKEN_PROMPTS
    expected, logits = hf_greedy(model_dir, prompts)
    return model_dir, prompts, expected, logits


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)


@pytest.fixture(params=[1, 2], ids=["tp1", "tp2"])
def tp(request) -> int:
    return request.param


def test_greedy_matches_transformers(reference, tp):
    model_dir, prompts, expected, _ = reference
    outs = LLM(model_dir, dtype="float32", tensor_parallel_size=tp).generate(prompts, GREEDY)
    assert len(prompts) >= 8
    for i, (out, exp) in enumerate(zip(outs, expected, strict=True)):
        assert out.token_ids == exp, f"prompt {i}: engine {out.token_ids} != transformers {exp}"


def test_greedy_matches_transformers_on_both_cpu_attention_paths(reference, monkeypatch):
    """The tests above run the in-place C++ attention where a compiler exists; the torch twins
    (the fallback of an image without one) must give the same tokens."""
    from modeldeploy.kernels import cpu_attention, dispatch

    model_dir, prompts, expected, _ = reference
    if cpu_attention.available():
        assert (
            dispatch._impl("paged_attention_decode", torch.zeros(1)) is cpu_attention.paged_attention_decode
        )
    monkeypatch.setattr(dispatch, "_CPU", {})
    monkeypatch.setattr(dispatch, "_cpu_checked", True)
    assert dispatch._impl("paged_attention_decode", torch.zeros(1)).__module__.endswith("reference")
    outs = LLM(model_dir, dtype="float32").generate(prompts, GREEDY)
    for i, (out, exp) in enumerate(zip(outs, expected, strict=True)):
        assert out.token_ids == exp, f"prompt {i}: engine {out.token_ids} != transformers {exp}"


def test_first_step_logits_close(reference, tp):
    model_dir, prompts, _, hf_logits = reference
    llm = LLM(model_dir, dtype="float32", tensor_parallel_size=tp)
    eng = llm.engine
    for i, ids in enumerate(prompts):
        eng.add_request(f"r{i}", ids, SamplingParams(temperature=0.0, max_tokens=1))
    batch = eng.scheduler.schedule()
    logits, seqs = eng.runner.run(batch)
    for row, seq in enumerate(seqs):
        i = int(seq.request_id[1:])
        err = (logits[row] - hf_logits[i]).abs().max().item()
        assert err < 1e-4, f"prompt {i}: max abs logit error {err}"
    assert len(seqs) == len(prompts)


def test_chunked_prefill_same_tokens(reference, tp):
    model_dir, prompts, expected, _ = reference
    llm = LLM(
        model_dir, dtype="float32", max_num_batched_tokens=16, max_model_len=256, tensor_parallel_size=tp
    )
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected


def test_no_chunked_prefill_same_tokens(reference, tp):
    model_dir, prompts, expected, _ = reference
    llm = LLM(
        model_dir,
        dtype="float32",
        tensor_parallel_size=tp,
        enable_chunked_prefill=False,
        max_num_batched_tokens=256,
        max_model_len=256,
        max_num_seqs=3,
    )
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected


def test_prefix_cache_hits_same_tokens(reference, tp):
    model_dir, prompts, expected, _ = reference
    llm = LLM(model_dir, dtype="float32", tensor_parallel_size=tp)
    first = llm.generate(prompts, GREEDY)
    second = llm.generate(prompts, GREEDY)
    assert llm.engine.stats().prefix_cache_hit_tokens > 0
    assert [o.token_ids for o in first] == expected
    assert [o.token_ids for o in second] == expected


def test_preemption_same_tokens(reference, tp):
    model_dir, prompts, expected, _ = reference
    # 128-token sequences need 8 blocks each; 10 blocks cannot hold 8 running sequences.
    llm = LLM(
        model_dir,
        dtype="float32",
        max_model_len=128,
        num_kv_blocks=10,
        enable_prefix_caching=False,
        tensor_parallel_size=tp,
    )
    outs = llm.generate(prompts, GREEDY)
    stats = llm.engine.stats()
    assert stats.preemptions_total > 0
    assert [o.token_ids for o in outs] == expected
    assert stats.num_free_blocks == stats.num_total_blocks
