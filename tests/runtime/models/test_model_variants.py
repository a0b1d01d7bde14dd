"""modeldeploy_dev.model_variants: the quality gate's bad and harmless bundles are what they claim.

Re-quantized weights differ only in the linear layers and sit on 2**bits levels per group; a split
layout serves the very same tokens; a template without the system turn renders requests without it;
swapped or zeroed layers change those layers' tensors only; a config edit changes config.json only
and refuses a key the config lacks; a moved end-of-sequence id is the one the runtime stops at; a
template without the generation prompt renders no assistant header; a tokenizer without some merges
splits some words differently with the same vocabulary. Each writer gives the same digest twice (a
variant is pinned like any revision), from its CLI subcommand too."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from modeldeploy.digest import dir_digest
from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy_dev.model_variants import (
    config_edit,
    drop_system_turn,
    main,
    no_generation_prompt,
    partial_tokenizer,
    read_weights,
    requantize,
    special_ids,
    split,
    swap_layers,
    zero_layer,
)

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


def _same_files_but(a, b, changed: set[str]) -> None:  # noqa: ANN001
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    differ = {n for n in names if (a / n).read_bytes() != (b / n).read_bytes()}
    assert differ == changed, differ


def test_swap_layers_trades_the_two_layers_tensors(llama_dir, tmp_path):
    out = swap_layers(llama_dir, tmp_path / "swap", 0, 1)
    before, after = read_weights(llama_dir), read_weights(out)
    assert sorted(before) == sorted(after)
    layer0 = [n for n in before if n.startswith("model.layers.0.")]
    assert layer0
    for n in layer0:
        other = n.replace("model.layers.0.", "model.layers.1.")
        assert torch.equal(after[n], before[other]) and torch.equal(after[other], before[n])
    rest = [n for n in before if not n.startswith("model.layers.")]
    assert all(torch.equal(before[n], after[n]) for n in rest)
    assert dir_digest(swap_layers(llama_dir, tmp_path / "swap2", 1, 0)) == dir_digest(out)
    for a, b in ((0, 0), (0, 2)):
        with pytest.raises(SystemExit, match="layer"):
            swap_layers(llama_dir, tmp_path / "bad", a, b)


def test_zero_layer_zeroes_its_output_projections_only(llama_dir, tmp_path):
    out = zero_layer(llama_dir, tmp_path / "zero", 1)
    before, after = read_weights(llama_dir), read_weights(out)
    zeroed = {"model.layers.1.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"}
    assert {n for n in before if not torch.equal(before[n], after[n])} == zeroed
    assert all(not after[n].any() for n in zeroed)
    assert greedy(out) != greedy(llama_dir)
    assert dir_digest(zero_layer(llama_dir, tmp_path / "zero2", 1)) == dir_digest(out)
    with pytest.raises(SystemExit, match="layer 2"):
        zero_layer(llama_dir, tmp_path / "bad", 2)


def test_config_edit_changes_config_json_only_and_refuses_unknown_keys(llama_dir, tmp_path):
    from modeldeploy.runtime.loader import hf_config

    out = config_edit(llama_dir, tmp_path / "cfg", {"rope_theta": 5000.0, "rms_norm_eps": 1e-4})
    _same_files_but(llama_dir, out, {"config.json"})
    hf = hf_config(out, {})
    assert hf.rope_parameters["rope_theta"] == 5000.0 and hf.rms_norm_eps == 1e-4
    assert hf.rope_parameters["rope_type"] == "default"  # a nested object merges, key by key
    again = config_edit(
        llama_dir, tmp_path / "cfg2", {"rope_parameters": {"rope_theta": 5000.0}, "rms_norm_eps": 1e-4}
    )
    assert dir_digest(again) == dir_digest(out)
    for typo in ({"rms_norm_epsilon": 1e-4}, {"rope_parameters": {"theta": 1.0}}):
        with pytest.raises(SystemExit, match="allow_new"):
            config_edit(llama_dir, tmp_path / "typo", typo)
    added = config_edit(llama_dir, tmp_path / "new", {"rope_scaling": {"factor": 2.0}}, allow_new=True)
    assert json.loads((added / "config.json").read_text())["rope_scaling"] == {"factor": 2.0}


def test_special_ids_moves_the_id_the_runtime_stops_at(llama_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(llama_dir)
    old, new = tok.convert_tokens_to_ids("<|eos|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    out = special_ids(llama_dir, tmp_path / "eos", "<|endoftext|>")
    _same_files_but(llama_dir, out, {"config.json", "generation_config.json"})
    llm = LLM(str(out), dtype="float32", max_model_len=128, num_kv_blocks=24)
    assert llm.engine.eos_token_ids == {new} and new != old
    assert dir_digest(special_ids(llama_dir, tmp_path / "eos2", "<|endoftext|>")) == dir_digest(out)
    with pytest.raises(SystemExit, match="no token"):
        special_ids(llama_dir, tmp_path / "bad", "<|nope|>")


def test_no_generation_prompt_renders_no_assistant_header(llama_dir, tmp_path):
    out = no_generation_prompt(llama_dir, tmp_path / "nogen")
    msgs = [{"role": "user", "content": "Hi"}]
    good, bad = (AutoTokenizer.from_pretrained(d) for d in (llama_dir, out))
    prompt = good.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert isinstance(prompt, str) and prompt.endswith("<|im_start|>assistant\n")
    assert bad.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        good.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    )
    assert dir_digest(no_generation_prompt(llama_dir, tmp_path / "nogen2")) == dir_digest(out)


def test_partial_tokenizer_splits_some_words_differently_with_the_same_vocabulary(llama_dir, tmp_path):
    out = partial_tokenizer(llama_dir, tmp_path / "merges", every=5)
    _same_files_but(llama_dir, out, {"tokenizer.json"})
    good, bad = (AutoTokenizer.from_pretrained(d) for d in (llama_dir, out))
    assert bad.get_vocab() == good.get_vocab() and bad.chat_template == good.chat_template
    words = "the scheduler admits new requests while the cache has room".split()
    changed = [w for w in words if good(" " + w)["input_ids"] != bad(" " + w)["input_ids"]]
    assert 0 < len(changed) < len(words), changed
    assert bad.decode(bad(" ".join(words))["input_ids"]) == " ".join(words)  # still lossless
    assert dir_digest(partial_tokenizer(llama_dir, tmp_path / "merges2", every=5)) == dir_digest(out)
    with pytest.raises(SystemExit, match="every"):
        partial_tokenizer(llama_dir, tmp_path / "bad", every=1)


@pytest.mark.parametrize(
    ("args", "write"),
    [
        (["swap-layers", "--a", "0", "--b", "1"], lambda s, o: swap_layers(s, o, 0, 1)),
        (["zero-layer", "--layer", "0"], lambda s, o: zero_layer(s, o, 0)),
        (
            ["config-edit", "--set", "rope_parameters.rope_theta=5000.0", "--set", "rms_norm_eps=1e-4"],
            lambda s, o: config_edit(s, o, {"rope_theta": 5000.0, "rms_norm_eps": 1e-4}),
        ),
        (["special-ids", "--eos", "<|im_end|>"], lambda s, o: special_ids(s, o, "<|im_end|>")),
        (["no-generation-prompt"], no_generation_prompt),
        (["partial-tokenizer", "--every", "7"], lambda s, o: partial_tokenizer(s, o, 7)),
    ],
)
def test_cli_subcommand_writes_what_the_function_does(llama_dir, tmp_path, args, write):
    assert main([args[0], str(llama_dir), str(tmp_path / "cli"), *args[1:]]) == 0
    assert dir_digest(tmp_path / "cli") == dir_digest(write(llama_dir, tmp_path / "api"))


def _small_gguf(path) -> None:  # noqa: ANN001
    """A GGUF like the shipped one in kind: Q4_1 block weights, a Q8_0 embedding, a float norm."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_string("tokenizer.chat_template", "{{ messages }}")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    q41, q80 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0
    w.add_tensor(
        "token_embd.weight",
        gguf.quants.quantize(rng.standard_normal((8, 64), np.float32), q80),
        raw_dtype=q80,
    )
    w.add_tensor(
        "blk.0.ffn_up.weight",
        gguf.quants.quantize(rng.standard_normal((16, 64), np.float32), q41),
        raw_dtype=q41,
    )
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_requantize_changes_the_block_weights_type_and_keeps_the_rest(tmp_path):
    import gguf
    import numpy as np

    from modeldeploy_dev.model_variants import gguf_requantize

    src = tmp_path / "m.Q4_1.gguf"
    _small_gguf(src)
    a = gguf.GGUFReader(src)
    for qtype, tol in (("Q8_0", 0.02), ("Q4_0", 0.3)):
        out = gguf_requantize(src, tmp_path / qtype, qtype)
        assert [p.name for p in (tmp_path / qtype).iterdir()] == [f"m.{qtype}.gguf"]  # serves as a directory
        b = gguf.GGUFReader(out)
        ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
        assert tb["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType[qtype]
        wa, wb = (
            gguf.quants.dequantize(t.data, t.tensor_type)
            for t in (ta["blk.0.ffn_up.weight"], tb["blk.0.ffn_up.weight"])
        )
        assert wa.shape == wb.shape and 0 < np.abs(wa - wb).max() < tol * np.abs(wa).max()
        for name in ("token_embd.weight", "blk.0.attn_norm.weight"):  # kept as they were, bit for bit
            assert tb[name].tensor_type == ta[name].tensor_type and np.array_equal(
                tb[name].data, ta[name].data
            )
        assert b.fields["tokenizer.chat_template"].contents() == "{{ messages }}"
        assert b.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "c"]
        assert "general.file_type" not in b.fields  # it named the source's format
        again = gguf_requantize(src, tmp_path / f"{qtype}-again", qtype)
        assert again.read_bytes() == out.read_bytes()  # deterministic: a variant pins like a revision
    with pytest.raises(SystemExit, match="--type"):
        gguf_requantize(src, tmp_path / "k", "Q4_K")
