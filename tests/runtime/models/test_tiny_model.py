"""The embedded default model: HF on-disk format, loadable by transformers, reproducible."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from modeldeploy.digest import dir_digest
from modeldeploy.runtime.tiny_model import make_tiny_model


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = make_tiny_model(tmp_path / "a", "qwen3", seed=5)
    b = make_tiny_model(tmp_path / "b", "qwen3", seed=5)
    c = make_tiny_model(tmp_path / "c", "qwen3", seed=6)
    assert dir_digest(a) == dir_digest(b)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


@pytest.mark.parametrize(
    "arch,cls",
    [
        ("llama", "LlamaForCausalLM"),
        ("qwen2", "Qwen2ForCausalLM"),
        ("qwen3", "Qwen3ForCausalLM"),
        ("mistral", "MistralForCausalLM"),
    ],
)
def test_files_and_transformers_roundtrip(tiny_model, arch, cls):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = tiny_model(arch)
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (d / name).is_file(), name
    assert json.loads((d / "config.json").read_text())["architectures"] == [cls]
    tok = AutoTokenizer.from_pretrained(d)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok("The quick brown fox")["input_ids"]
    assert tok.decode(ids) == "The quick brown fox"
    model = AutoModelForCausalLM.from_pretrained(d)
    assert model.config.vocab_size == len(tok)


def test_cli_writes_model_and_rejects_unknown_arch(tmp_path):
    cli = [sys.executable, "-m", "modeldeploy", "tiny-model"]
    ok = subprocess.run(
        cli + [str(tmp_path / "m"), "--arch", "mistral", "--seed", "1"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert "digest sha256:" in ok.stdout
    bad = subprocess.run(cli + [str(tmp_path / "x"), "--arch", "gpt2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--arch" in bad.stderr and "gpt2" in bad.stderr
