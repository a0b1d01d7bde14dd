"""modeldeploy_dev.model_variants: the quality gate's bad and harmless bundles are what they claim.

Re-quantized weights differ only in the linear layers and sit on 2**bits levels per group; a split
layout serves the very same tokens; a template without the system turn renders requests without it;
each writer gives the same digest twice (a variant is pinned like any revision)."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from modeldeploy.digest import dir_digest
from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy_dev.model_variants import drop_system_turn, read_weights, requantize, split

PROMPTS = [[5, 17, 200, 31, 9, 44, 120, 7], [400, 3, 3, 19, 77, 12]]


def greedy(model_dir) -> list[list[int]]:
    llm = LLM(model_dir, dtype="float32", max_model_len=128, num_kv_blocks=24)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    return [o.token_ids for o in outs]


def test_requantize_rounds_linear_weights_only_onto_few_levels(llama_dir, tmp_path):
    out = requantize(llama_dir, tmp_path / "q3", bits=3, group=16)
    before, after = read_weights(llama_dir), read_weights(out)
    assert sorted(before) == sorted(after)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed and all(n.split(".")[-2].endswith("_proj") for n in changed)
    assert "model.embed_tokens.weight" not in changed
    w = after[changed[0]]
    groups = w.reshape(w.shape[0], -1, 16)
    assert max(len(torch.unique(g)) for g in groups.reshape(-1, 16)) <= 8
    assert dir_digest(requantize(llama_dir, tmp_path / "q3b", bits=3, group=16)) == dir_digest(out)
    assert dir_digest(out) != dir_digest(llama_dir)


def test_split_layout_serves_the_same_tokens(llama_dir, tmp_path):
    out = split(llama_dir, tmp_path / "split", parts=3)
    assert len(list(out.glob("*.safetensors"))) == 3 and (out / "model.safetensors.index.json").is_file()
    assert dir_digest(split(llama_dir, tmp_path / "split2", parts=3)) == dir_digest(out)
    assert greedy(out) == greedy(llama_dir)


def test_drop_system_turn_renders_without_the_system_message(llama_dir, tmp_path):
    out = drop_system_turn(llama_dir, tmp_path / "nosys")
    msgs = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
    good = AutoTokenizer.from_pretrained(llama_dir).apply_chat_template(msgs, tokenize=False)
    bad = AutoTokenizer.from_pretrained(out).apply_chat_template(msgs, tokenize=False)
    assert "Answer in French." in good and "Answer in French." not in bad and "Hi" in bad
    assert dir_digest(drop_system_turn(llama_dir, tmp_path / "nosys2")) == dir_digest(out)
