"""Tensor parallelism in the engine (CPU, gloo): the Megatron layout, TP=4 with replicated kv
heads, validation at load, and what each rank holds. TP=1 vs TP=2 equality over batching,
chunked prefill, prefix caching and preemption is in test_engine_equality.py."""

from __future__ import annotations

import pytest
from support.hf_reference import MAX_NEW, TOKEN_PROMPTS, hf_greedy
from support.processes import _alive

from modeldeploy.runtime import LLM, EngineConfig, SamplingParams
from modeldeploy.runtime.models.llama import ModelArgs
from modeldeploy.runtime.models.shard import Shard

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], list(range(20, 73)), list(range(100, 140))]


def _args(heads: int = 4, kv: int = 2, inter: int = 128, d: int = 16) -> ModelArgs:
    return ModelArgs(
        architecture="LlamaForCausalLM",
        vocab_size=512,
        hidden_size=heads * d,
        intermediate_size=inter,
        num_layers=2,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=d,
        rms_norm_eps=1e-6,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        qkv_bias=False,
        qk_norm=False,
        rope={"rope_theta": 10000.0, "rope_type": "default"},
    )


def test_column_and_row_slices_cover_each_weight_once():
    a = _args(heads=8, kv=4, inter=256)
    for n in (2, 4):
        rows = {m: [] for m in ("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj")}
        for r in range(n):
            s = Shard(r, n)
            rows["q_proj"].append(s.slice_of("model.layers.0.self_attn.q_proj.weight", a))
            rows["k_proj"].append(s.slice_of("model.layers.1.self_attn.k_proj.weight", a))
            rows["o_proj"].append(s.slice_of("model.layers.0.self_attn.o_proj.weight", a))
            rows["gate_proj"].append(s.slice_of("model.layers.0.mlp.gate_proj.weight", a))
            rows["down_proj"].append(s.slice_of("model.layers.0.mlp.down_proj.weight", a))
            assert s.slice_of("model.layers.0.input_layernorm.weight", a) is None  # replicated
            assert s.slice_of("model.embed_tokens.weight", a) is None
            assert s.wants("lm_head.weight") == (r == 0)
        full = {"q_proj": 8 * 16, "k_proj": 4 * 16, "o_proj": 8 * 16, "gate_proj": 256, "down_proj": 256}
        for m, parts in rows.items():
            assert {p[0] for p in parts} == ({1} if m in ("o_proj", "down_proj") else {0}), m
            spans = sorted((p[1], p[2]) for p in parts)
            assert spans[0][0] == 0 and spans[-1][1] == full[m], m
            assert all(x[1] == y[0] for x, y in zip(spans, spans[1:], strict=False)), m  # no gap, no overlap


def test_fewer_kv_heads_than_ranks_are_replicated_like_vllm():
    a = _args(heads=8, kv=2)
    heads = [Shard(r, 4).kv_heads(a) for r in range(4)]
    assert heads == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert Shard(0, 4).kv_head_replicas(a) == 2
    # each rank's query heads map (GQA group of 4) onto exactly the kv head it holds
    for r in range(4):
        q_heads = range(r * 2, r * 2 + 2)
        assert {h // 4 for h in q_heads} == {heads[r][0]}
    assert Shard(1, 4).rank_args(a).num_kv_heads == 1 and Shard(1, 4).rank_args(a).num_heads == 2


@pytest.mark.parametrize(
    "sizes, n, named",
    [
        (dict(heads=6, kv=2), 4, "num_attention_heads 6 is not divisible by tensor_parallel_size 4"),
        (dict(heads=6, kv=3), 2, "num_key_value_heads 3 is not divisible by tensor_parallel_size 2"),
        (dict(heads=6, kv=2), 3, None),  # 6 heads / 3 ranks, 2 kv heads: 3 is not a multiple of 2
        (
            dict(heads=4, kv=2, inter=130),
            4,
            "intermediate_size 130 is not divisible by tensor_parallel_size 4",
        ),
    ],
)
def test_indivisible_layouts_name_the_field_and_numbers(sizes, n, named):
    with pytest.raises(ValueError) as e:
        Shard(0, n).check(_args(**sizes))
    msg = str(e.value)
    assert msg.startswith("tensor_parallel_size:")
    assert named in msg if named else "not a multiple of num_key_value_heads 2" in msg


def test_a_model_with_indivisible_heads_is_refused_at_load(tiny_model):
    model = tiny_model("llama", hidden_size=48, num_heads=6, num_kv_heads=2)
    with pytest.raises(ValueError, match="num_attention_heads 6 is not divisible by tensor_parallel_size 4"):
        LLM(model, dtype="float32", tensor_parallel_size=4)


def test_adapters_with_tensor_parallelism_are_refused_by_name(llama_dir):
    cfg = EngineConfig(model=str(llama_dir), tensor_parallel_size=2, adapters=[{"name": "a", "path": "/x"}])
    with pytest.raises(ValueError, match="tensor_parallel_size: LoRA adapters are not supported"):
        cfg.validate()
    with pytest.raises(ValueError, match="tensor_parallel_size: must be an integer >= 1"):
        EngineConfig(model=str(llama_dir), tensor_parallel_size=0).validate()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_tp4_with_replicated_kv_heads_equals_transformers(tiny_model, arch):
    """4 heads / 2 kv heads over 4 ranks: every kv head held by two ranks."""
    model = tiny_model(arch)
    prompts = PROMPTS + TOKEN_PROMPTS
    expected, _ = hf_greedy(model, prompts)
    llm = LLM(model, dtype="float32", tensor_parallel_size=4, max_num_batched_tokens=32)
    assert llm.engine.parallel_info()["kv_head_replicas"] == 2
    outs = llm.generate(prompts, GREEDY)
    for i, (out, exp) in enumerate(zip(outs, expected, strict=True)):
        assert out.token_ids == exp, f"{arch} prompt {i}: TP=4 {out.token_ids} != transformers {exp}"
    assert llm.engine.stats().tp_allreduce_bytes_total > 0


@pytest.mark.slow
def test_each_rank_holds_its_share_and_no_rank_outlives_close(llama_dir):
    """TP=2 on the tiny llama (E 64, I 128, 2 layers, vocab 512, untied head): every matrix of a
    layer halves, norms and the embedding stay whole, the LM head lives on rank 0 only."""
    e, i, v, L = 64, 128, 512, 2
    layer_matrices = e * e + 2 * (32 * e) + e * e + 2 * (i * e) + e * i  # q, k+v, o, gate+up, down
    worker = 4 * (L * (layer_matrices // 2 + 2 * e) + v * e + e)
    llm = LLM(llama_dir, dtype="float32", tensor_parallel_size=2)
    info = llm.engine.parallel_info()
    assert info["weight_bytes_per_rank"] == [worker + 4 * v * e, worker]
    whole = LLM(llama_dir, dtype="float32").engine.parallel_info()["weight_bytes_per_rank"][0]
    assert worker < 0.75 * whole  # about half the layers, plus the replicated embedding
    pids = info["worker_pids"]
    assert len(pids) == 1 and _alive(pids[0])
    assert llm.engine.tp.stop() == [0]
    assert not _alive(pids[0])


def test_tp_dummy_weights_match_tp1(llama_dir):
    """The benchmark format: every rank draws the same seeded stream and keeps its slice."""
    a = LLM(llama_dir, dtype="float32", load_format="dummy", seed=3).generate(PROMPTS, GREEDY)
    b = LLM(llama_dir, dtype="float32", load_format="dummy", seed=3, tensor_parallel_size=2).generate(
        PROMPTS, GREEDY
    )
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
