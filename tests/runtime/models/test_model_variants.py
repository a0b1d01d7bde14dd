"""modeldeploy_dev.model_variants: the quality gate's bad and harmless bundles are what they claim.

Re-quantized weights differ only in the linear layers and sit on 2**bits levels per group; a split
layout serves the very same tokens; a template without the system turn renders requests without it;
each writer gives the same digest twice (a variant is pinned like any revision)."""

from __future__ import annotations

import pytest
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
