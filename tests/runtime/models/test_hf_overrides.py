"""hf_overrides (vLLM's --hf-overrides): config fields replaced at load reach the forward, a typo
is refused by name, and the serve flag takes a JSON object. The quality gate's e2e uses a wrong
`rope_theta` as a bundle that is neither slower nor failing, only worse: this is where it must bite."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy.runtime.loader import hf_config

PROMPTS = [[5, 17, 200, 31, 9, 44, 120, 7, 3, 88, 61, 250], [400, 3, 3, 19, 77]]


def greedy(llm: LLM) -> list[list[int]]:
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    return [o.token_ids for o in outs]


def test_rope_theta_override_reaches_rope_parameters(llama_dir):
    base = hf_config(llama_dir, {})
    cfg = hf_config(llama_dir, {"rope_theta": 3.0, "rms_norm_eps": 0.25})
    assert cfg.rope_parameters["rope_theta"] == 3.0 != base.rope_parameters["rope_theta"]
    assert cfg.rms_norm_eps == 0.25
    assert cfg.hidden_size == base.hidden_size  # the rest is the model's own


def test_unknown_field_is_refused_by_name(llama_dir):
    with pytest.raises(ValueError, match=r"hf_overrides: rope_thetaa is not a field of the llama config"):
        hf_config(llama_dir, {"rope_thetaa": 1.0})


def test_override_changes_the_engine_as_it_changes_transformers(llama_dir):
    """Same tokens as transformers loaded with the same override: the override is applied where the
    forward reads it, not only recorded."""
    plain = greedy(LLM(llama_dir, dtype="float32", max_model_len=128, num_kv_blocks=24))
    over = {"rope_theta": 2.0, "rms_norm_eps": 0.5}
    llm = LLM(llama_dir, dtype="float32", max_model_len=128, num_kv_blocks=24, hf_overrides=over)
    changed = greedy(llm)
    assert changed != plain
    cfg = hf_config(llama_dir, over)
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, config=cfg, dtype=torch.float32)
    for prompt, ours in zip(PROMPTS, changed, strict=True):
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12, pad_token_id=0
        )[0, len(prompt) :].tolist()
        assert ours == ref


def test_serve_flag_takes_a_json_object_only():
    r = subprocess.run(
        [sys.executable, "-m", "modeldeploy", "serve", "--model", "/nonexistent", "--hf-overrides", "{bad"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "argument --hf-overrides: not JSON" in r.stderr
