"""Engine contracts beyond equality: block accounting, aborts, sampling, stops, errors."""

from __future__ import annotations

import asyncio
import json
import random
import shutil

import pytest

from modeldeploy.digest import DigestMismatch, dir_digest
from modeldeploy.runtime import LLM, AsyncEngine, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, dtype="float32", max_model_len=256, num_kv_blocks=40)


def test_blocks_all_free_after_random_aborts(llm):
    eng = llm.engine
    rng = random.Random(7)
    total = eng.stats().num_total_blocks
    for round_ in range(3):
        ids = []
        for i in range(12):
            rid = f"ab-{round_}-{i}"
            prompt = [rng.randrange(3, 500) for _ in range(rng.randrange(1, 90))]
            eng.add_request(
                rid, prompt, SamplingParams(temperature=0.8, max_tokens=rng.randrange(4, 40), seed=i)
            )
            ids.append(rid)
        steps = 0
        while eng.has_work():
            eng.step()
            steps += 1
            if rng.random() < 0.3:
                eng.abort(rng.choice(ids))  # aborting a finished or unknown request is a no-op
            assert steps < 2000
        assert eng.stats().num_free_blocks == total
        assert eng.stats().num_running == eng.stats().num_waiting == 0
    assert not eng.seqs


def test_seeded_sampling_is_reproducible(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=24, seed=1234, ignore_eos=True)
    a = llm.generate(["The quick brown fox", "A paged KV cache"], p)
    b = llm.generate(["The quick brown fox", "A paged KV cache"], p)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    c = llm.generate(
        ["The quick brown fox"], SamplingParams(temperature=1.0, max_tokens=24, seed=99, ignore_eos=True)
    )
    assert c[0].token_ids != a[0].token_ids


def test_top_k_one_is_greedy(llm):
    greedy = llm.generate(
        ["Kubernetes schedules"], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    )
    topk1 = llm.generate(
        ["Kubernetes schedules"],
        SamplingParams(temperature=1.5, top_k=1, max_tokens=16, seed=3, ignore_eos=True),
    )
    assert greedy[0].token_ids == topk1[0].token_ids


def test_stop_string_cuts_output_exactly(llm):
    base = llm.generate(
        ["The quick brown fox"], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    )[0]
    text = base.text
    assert len(text) > 12
    stop = text[6:10]
    cut = text.find(stop)
    out = llm.generate(
        ["The quick brown fox"], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop])
    )[0]
    assert out.finish_reason == "stop"
    assert out.text == text[:cut]
    assert out.token_ids == base.token_ids[: len(out.token_ids)]


def test_stop_token_ids_and_max_tokens(llm):
    base = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0]
    assert base.finish_reason == "length" and len(base.token_ids) == 10
    stop_tok = base.token_ids[4]
    out = llm.generate(
        [[5, 6, 7]],
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, stop_token_ids=[stop_tok]),
    )[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == base.token_ids[: base.token_ids.index(stop_tok) + 1]


@pytest.mark.parametrize(
    "params,field",
    [
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(temperature=-1), "temperature"),
        (SamplingParams(top_p=0), "top_p"),
        (SamplingParams(top_k=-5), "top_k"),
        (SamplingParams(stop=[""]), "stop"),
    ],
)
def test_bad_sampling_params_name_the_field(llm, params, field):
    with pytest.raises(ValueError, match=field):
        llm.generate(["x"], params)
    assert not llm.engine.has_work()


def test_prompt_errors(llm):
    with pytest.raises(ValueError, match="empty"):
        llm.generate([""], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="maximum context length"):
        llm.generate([[5] * 250], SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="token ids"):
        llm.generate([[5, 10**6]], SamplingParams(max_tokens=4))
    assert not llm.engine.has_work()


def test_unsupported_architecture_named(llama_dir, tmp_path):
    d = tmp_path / "gpt"
    shutil.copytree(llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM.*LlamaForCausalLM"):
        LLM(d)


def test_digest_mismatch_names_the_file(llama_dir, tmp_path):
    good = dir_digest(llama_dir)
    LLM(llama_dir, model_digest=good, max_model_len=64)  # the right digest loads
    d = tmp_path / "tampered"
    shutil.copytree(llama_dir, d)
    (d / "generation_config.json").write_text("{}\n")
    with pytest.raises(DigestMismatch, match="generation_config.json"):
        LLM(d, model_digest=good)
    with pytest.raises(ValueError, match="model_digest"):
        LLM(llama_dir, model_digest="sha256:short")


def test_sharded_and_tied_weights_load(tiny_model):
    sharded = tiny_model("llama", shards=3)
    assert len(list(sharded.glob("*.safetensors"))) > 1
    single = tiny_model("llama")
    p = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    assert LLM(sharded).generate(["abc"], p)[0].token_ids == LLM(single).generate(["abc"], p)[0].token_ids
    tied = tiny_model("qwen2")
    assert json.loads((tied / "config.json").read_text())["tie_word_embeddings"] is True
    assert not any("lm_head" in k for k in _keys(tied))
    assert len(LLM(tied).generate(["abc"], p)[0].token_ids) == 12


def _keys(d):
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "pt") as f:
        return list(f.keys())


async def test_async_engine_stream_and_abort_frees_blocks(llama_dir):
    eng = AsyncEngine(EngineConfig(model=str(llama_dir), dtype="float32", max_model_len=256))
    phases = []
    await eng.start(progress=lambda ph, f: phases.append((ph, f)))
    assert phases[-1] == ("ready", 1.0)
    total = eng.stats().num_total_blocks
    p = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outs = [o async for o in eng.generate("a", "The quick brown fox", p)]
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert sum(len(o.new_token_ids) for o in outs) == 20 == len(outs[-1].token_ids)
    assert "".join(o.delta_text for o in outs) == outs[-1].text

    async def consume_two(rid):
        n = 0
        async for _ in eng.generate(rid, "A paged KV cache", SamplingParams(max_tokens=200, ignore_eos=True)):
            n += 1
            if n == 2:
                break  # client walks away mid-stream

    await asyncio.gather(*(consume_two(f"c{i}") for i in range(4)))
    for _ in range(100):
        if eng.stats().num_free_blocks == total and eng.stats().num_running == 0:
            break
        await asyncio.sleep(0.02)
    assert eng.stats().num_free_blocks == total and eng.stats().num_running == 0
    with pytest.raises(ValueError, match="maximum context length"):
        async for _ in eng.generate("long", [5] * 300, p):
            pass
    await eng.shutdown()


def test_tiny_temperature_is_greedy_not_overflow(llm):
    greedy = llm.generate(["abc"], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    tiny = llm.generate(["abc"], SamplingParams(temperature=1e-30, max_tokens=8, ignore_eos=True, seed=1))[0]
    assert tiny.token_ids == greedy.token_ids
