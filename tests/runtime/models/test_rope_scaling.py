"""RoPE scaling types (models/rope.py) against transformers: greedy tokens identical past the original
context, for each type, alone and batched, chunked, prefix-cached and on the CPU decode path; bad
configs refused naming the problem.

Every model is a random tiny Llama (`modeldeploy tiny-model --rope-scaling`) made for 64 positions
(default and llama3: 128, llama3's own original length being 64), with prompts of 9, 50 and 90 tokens
and 36 new ones: a short prompt crosses the original length while decoding, a long one starts past it.

transformers' dynamic type keeps state across calls (its cached length only grows until a short call
resets it), so every reference runs on a freshly loaded model, one prompt at a time: the engine gives
each sequence exactly what transformers gives that prompt alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from support.decode_paths import check_both_ways

from modeldeploy.kernels import dispatch
from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy.runtime.models.llama import ModelArgs
from modeldeploy.runtime.models.rope import ROPE_TYPES

ORIGINAL = 64  # the context the scaled models are made for
NEW = 36
LENGTHS = (9, 50, 90)
KINDS = ["default", "llama3", "linear", "dynamic", "yarn", "longrope"]
LENGTH_DEPENDENT = ["dynamic", "longrope"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, min_tokens=NEW)  # EOS masked, as min_new_tokens


def prompt(n: int, seed: int = 0) -> list[int]:
    """n token ids past the special ones, a fixed pattern per seed."""
    return [6 + (7 * j + 31 * seed + (j * j) % 13) % 500 for j in range(n)]


PROMPTS = [prompt(n, i) for i, n in enumerate(LENGTHS)]


def sizes(kind: str) -> dict[str, object]:
    """tiny_model arguments of a kind's model (default and llama3 get 128 positions: see above)."""
    out: dict[str, object] = {
        "max_position_embeddings": 2 * ORIGINAL if kind in ("default", "llama3") else ORIGINAL
    }
    if kind != "default":
        out["rope_scaling"] = kind
    return out


def hf_greedy_fresh(model_dir: Path, prompts: list[list[int]], new: int = NEW) -> list[list[int]]:
    """transformers' greedy continuation of each prompt alone, each on a freshly loaded model."""
    from transformers import AutoModelForCausalLM

    outs = []
    for ids in prompts:
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        x = torch.tensor([ids])
        with torch.no_grad():
            g = hf.generate(
                x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new, min_new_tokens=new
            )
        outs.append(g[0, len(ids) :].tolist())
    return outs


@pytest.fixture(scope="module")
def scaled(tiny_model):
    """kind -> (model dir, transformers' tokens for PROMPTS), made once per kind."""
    made: dict[str, tuple[Path, list[list[int]]]] = {}

    def get(kind: str) -> tuple[Path, list[list[int]]]:
        if kind not in made:
            d = tiny_model("llama", **sizes(kind))
            made[kind] = (d, hf_greedy_fresh(d, PROMPTS))
        return made[kind]

    return get


def engine(model_dir: Path, **config) -> LLM:
    return LLM(str(model_dir), dtype="float32", **config)


def tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    try:
        return [o.token_ids for o in llm.generate(prompts, params)]
    finally:
        llm.engine.close()


@pytest.mark.parametrize("kind", KINDS)
def test_cos_sin_rows_are_transformers_bits(tiny_model, kind):
    """The rows each token is rotated with equal transformers' rotary embedding's cos and sin bit for
    bit: a prompt of L tokens at once, then decoded positions one by one, on a fresh embedding each."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from modeldeploy.runtime.models.rope import Rope

    cfg = AutoConfig.from_pretrained(tiny_model("llama", **sizes(kind)))
    args = ModelArgs.from_hf(cfg)
    rope = Rope(args.rope, args.head_dim, args.max_position_embeddings)
    top = args.max_length()[0]
    cache = rope.cache(top, torch.device("cpu"))
    half = args.head_dim // 2

    def ours(positions: list[int], lens: list[int]) -> torch.Tensor:
        if not rope.length_dependent:
            return cache[positions]
        rows = rope.indices(positions, lens, top)
        return cache[rows] if rows is not None else rope.rows(positions, lens, torch.device("cpu"))

    for prompt_len in sorted({5, ORIGINAL - 1, ORIGINAL, ORIGINAL + 1, 100, top - 8}):
        if prompt_len > top - 4:
            continue
        hf = LlamaRotaryEmbedding(cfg)
        steps = [list(range(prompt_len))] + [[p] for p in range(prompt_len, prompt_len + 4)]
        for positions in steps:
            cos, sin = hf(torch.zeros(1), torch.tensor([positions]))
            got = ours(positions, [max(prompt_len, p + 1) for p in positions])
            assert torch.equal(got[:, :half], cos[0, :, :half]), (kind, prompt_len, positions[0])
            assert torch.equal(got[:, half:], sin[0, :, :half]), (kind, prompt_len, positions[0])


@pytest.mark.parametrize("kind", KINDS)
def test_each_prompt_alone_matches_transformers(scaled, kind):
    model_dir, expected = scaled(kind)
    llm = engine(model_dir)
    rope = llm.engine.runner.model.rope
    assert rope.kind == kind
    assert llm.engine.max_model_len >= max(LENGTHS) + NEW > ORIGINAL  # past the original context
    try:
        for i, (ids, want) in enumerate(zip(PROMPTS, expected, strict=True)):
            got = llm.generate(ids, GREEDY)[0].token_ids
            assert got == want, f"{kind}, prompt {i} ({len(ids)} tokens): engine {got} != transformers {want}"
    finally:
        llm.engine.close()


def test_each_scaling_changes_the_tokens_past_the_original_context(scaled):
    """The weights are the same (seed 0) in every model here: the equality above is worth something
    only where the scaling changes what transformers generates, which it does on the long prompt."""
    plain = scaled("default")[1][2]
    for kind in ("linear", "dynamic", "yarn", "longrope"):
        assert scaled(kind)[1][2] != plain, f"{kind}: the same tokens as default RoPE"


@pytest.mark.parametrize("kind", LENGTH_DEPENDENT)
def test_batch_of_different_lengths_each_matches_its_own_run(scaled, kind):
    """One continuously batched run: short and long sequences share steps, yet each is rotated with its
    own length's frequencies (transformers would use the batch's longest)."""
    model_dir, expected = scaled(kind)
    extra = [prompt(70, 7), prompt(30, 8)]
    want = expected + hf_greedy_fresh(model_dir, extra)
    llm = engine(model_dir)
    mixed = []
    execute = llm.engine.runner.execute

    def spy(plan, lora=None):
        keys = {llm.engine.runner.model.rope.key(n) for n in plan.rope_lens or []}
        mixed.append(len(keys) > 1)
        return execute(plan, lora)

    llm.engine.runner.execute = spy
    got = tokens(llm, PROMPTS + extra)
    assert any(mixed), "no step mixed sequences of different rotation"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"{kind}, prompt {i}: engine {g} != transformers {w}"


@pytest.mark.parametrize("kind", [*LENGTH_DEPENDENT, "yarn"])
def test_chunked_prefill_of_a_long_prompt(scaled, kind):
    """The 90-token prompt in chunks of 16: every chunk rotates with the whole prompt's frequencies."""
    model_dir, expected = scaled(kind)
    llm = engine(model_dir, max_num_batched_tokens=16, enable_chunked_prefill=True)
    assert tokens(llm, [PROMPTS[2]]) == [expected[2]]


@pytest.mark.parametrize("kind", LENGTH_DEPENDENT)
def test_preempted_sequences_are_recomputed_with_their_prompts_rotation(scaled, kind):
    """8 blocks of 16 cannot hold the three sequences (3 + 6 + 8 blocks at the end; in arrival order the
    first two run, and outgrow 8 blocks 31 tokens in): one is preempted and recomputed, generated
    tokens included, each position rotated as before (by its prompt's length, not by the length of
    what is recomputed)."""
    model_dir, expected = scaled(kind)
    llm = engine(model_dir, num_kv_blocks=8, block_size=16, enable_prefix_caching=False, prefill_order="fcfs")
    stats = llm.engine.stats
    try:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
        assert stats().preemptions_total > 0
    finally:
        llm.engine.close()


@pytest.mark.parametrize("kind", LENGTH_DEPENDENT)
def test_prefix_cache_reuses_only_blocks_rotated_alike(scaled, kind):
    """The same prompts again hit the prefix cache and give the same tokens. A prompt that shares the
    long prompt's first blocks but is shorter than the original context was rotated otherwise: it
    must not hit them (dynamic: nor may any other length past it; longrope: any length past it may)."""
    model_dir, expected = scaled(kind)
    long = PROMPTS[2]
    short = long[:40]  # two full blocks of 16 shared with `long`, within the original context
    other = [*long[:80], *prompt(8, 9)]  # five full blocks shared, past the original context too
    want_short, want_other = hf_greedy_fresh(model_dir, [short, other])
    llm = engine(model_dir, block_size=16)
    try:
        stats = llm.engine.stats
        assert [o.token_ids for o in llm.generate([long], GREEDY)] == [expected[2]]
        assert [o.token_ids for o in llm.generate([long], GREEDY)] == [expected[2]]
        hits = stats().prefix_cache_hit_tokens
        assert hits >= 80
        assert llm.generate(short, GREEDY)[0].token_ids == want_short
        assert stats().prefix_cache_hit_tokens == hits, "a block rotated for the long prompt was reused"
        assert llm.generate(other, GREEDY)[0].token_ids == want_other
        reused = stats().prefix_cache_hit_tokens - hits
        assert reused == (80 if kind == "longrope" else 0)
    finally:
        llm.engine.close()


@pytest.mark.skipif(isinstance(dispatch.cpu_kernels(), str), reason="no C++ compiler: no CPU kernels")
def test_dynamic_rows_on_the_cpu_decode_path_bit_identical(scaled):
    """Decode steps past max_position_embeddings carry their own cos/sin rows; the CPU decode path
    rotates from a static copy of them, bit-identical to the generic path."""
    model_dir, expected = scaled("dynamic")
    llm = engine(model_dir)
    c = llm.engine.runner.cpu_decode
    assert c is not None
    seen = check_both_ways(llm)
    assert tokens(llm, PROMPTS) == expected
    assert seen["replayed"] > 0
    assert any(own for _, _, own in c._calls), "no replayed step used its own rows"


@pytest.mark.parametrize("kind", LENGTH_DEPENDENT)
def test_graph_decode_buffers_take_longrope_rows_and_leave_dynamic_rows_eager(scaled, kind):
    """The CUDA graph path's static buffers (run eagerly on CPU, graphs.py): longrope's long rows are
    cache rows like any other, so its decode steps replay; a dynamic step with rows of its own runs
    the plain path instead (the graphs read the model's cache), its others replay. (Not the 90-token
    prompt here: every decode step with it in has dynamic rows of its own.)"""
    model_dir, expected = scaled(kind)
    prompts, expected = PROMPTS[:2], expected[:2]
    llm = engine(model_dir, max_num_seqs=4)
    runner = llm.engine.runner
    runner.cpu_decode = None
    runner.capture_graphs(4, capture=False)
    plain = 0
    execute = runner.execute

    def spy(plan, lora=None):
        nonlocal plain
        before = runner.graphs.replays
        out = execute(plan, lora)
        decode_only = len(plan.decode_lens) == len(plan.ids)
        plain += decode_only and runner.graphs.replays == before
        return out

    runner.execute = spy
    assert tokens(llm, prompts) == expected
    assert runner.graphs.replays > 0
    assert (plain > 0) == (kind == "dynamic")


def test_tensor_parallel_ranks_rotate_alike(scaled):
    """TP=2 (gloo on CPU): every rank builds the step's dynamic NTK rows from the plan's lengths."""
    model_dir, expected = scaled("dynamic")
    assert tokens(engine(model_dir, tensor_parallel_size=2), PROMPTS) == expected


# --- refused configs -----------------------------------------------------------------------------


def edited(src: Path, dst: Path, **rope: object) -> Path:
    """A copy of model dir `src` whose rope_parameters have `rope` merged in."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], **rope}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_unknown_rope_type_refused_naming_it_and_the_supported(scaled, tmp_path):
    d = edited(scaled("linear")[0], tmp_path / "m", rope_type="ntk-by-parts")
    with pytest.raises(ValueError, match=r"unsupported rope scaling type 'ntk-by-parts'; supported: ") as e:
        engine(d)
    assert all(kind in str(e.value) for kind in ROPE_TYPES)


def test_longrope_factor_lists_of_the_wrong_length_refused(scaled, tmp_path):
    src = scaled("longrope")[0]
    short = json.loads((src / "config.json").read_text())["rope_parameters"]["long_factor"][:-1]
    d = edited(src, tmp_path / "m", long_factor=short)
    with pytest.raises(ValueError, match=r"'longrope': long_factor has 7 entries; head_dim 16 needs 8"):
        engine(d)


def test_max_model_len_over_the_derived_bound_refused_naming_it(scaled):
    d = scaled("linear")[0]
    with pytest.raises(
        ValueError,
        match=r"max_model_len: 129 exceeds the model's maximum length 128 "
        r"\(max_position_embeddings 64 x linear factor 2\)",
    ):
        engine(d, max_model_len=129)
    with pytest.raises(ValueError, match=r"maximum length 256 \(original_max_position_embeddings 64 x yarn"):
        engine(scaled("yarn")[0], max_model_len=257)


@pytest.mark.parametrize(
    "kind,bound",
    [("default", 128), ("llama3", 128), ("linear", 128), ("dynamic", 128), ("yarn", 256), ("longrope", 256)],
)
def test_derived_maximum_length_per_type(scaled, kind, bound):
    """The default max_model_len: max_position_embeddings (default, llama3, longrope: whose tiny
    config states 4 x 64), x factor (linear, dynamic), original x factor (yarn)."""
    llm = engine(scaled(kind)[0], num_kv_blocks=64)  # room for `bound` tokens: nothing lowers it
    try:
        assert llm.engine.max_model_len == bound
    finally:
        llm.engine.close()


def test_legacy_rope_scaling_key_reads_the_same(scaled, tmp_path):
    """A transformers 4 config (`rope_scaling` with `type`, `rope_theta` at the top) is the same model."""
    from transformers import AutoConfig

    src = scaled("dynamic")[0]
    cfg = json.loads((src / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = {"type": rope["rope_type"], "factor": rope["factor"]}
    d = tmp_path / "m"
    shutil.copytree(src, d)
    (d / "config.json").write_text(json.dumps(cfg))
    new, old = (ModelArgs.from_hf(AutoConfig.from_pretrained(m)) for m in (src, d))
    assert old.rope["rope_type"] == "dynamic" and old.max_length() == new.max_length()
    assert (old.rope["factor"], old.rope["rope_theta"]) == (new.rope["factor"], new.rope["rope_theta"])
