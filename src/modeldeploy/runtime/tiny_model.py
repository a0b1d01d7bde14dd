"""The embedded default model: a small random-weight causal LM in the Hugging Face
on-disk format, written with transformers' own `save_pretrained`.

Tests and `make demo` serve these, since no model hub is reachable. The tokenizer is a
byte-level BPE trained with `tokenizers` on `data/corpus.txt`; the same seed gives
byte-identical files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ARCHS = ("llama", "qwen2", "qwen3", "mistral")
# RoPE scaling types a tiny model can carry (models/rope.py); None/absent: default RoPE
ROPE_SCALINGS = ("llama3", "linear", "dynamic", "yarn", "longrope")
# <|endoftext|> is in the vocab because transformers loads Qwen2Tokenizer for qwen2/qwen3 configs and
# that class adds it as its unknown token; without it the tokenizer would be one id larger than the model.
SPECIAL = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = Path(__file__).parent / "data" / "corpus.txt"


def train_tokenizer(vocab_size: int = 512):
    """Byte-level BPE wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS.read_text().splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        additional_special_tokens=SPECIAL[3:5],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _config(arch: str, vocab: int, bos: int, eos: int, pad: int, sizes: dict[str, Any]):
    import transformers as tf

    # Any: each config class types its own keywords; these are the ones all four share.
    common: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=sizes["num_layers"],
        num_attention_heads=sizes["num_heads"],
        num_key_value_heads=sizes["num_kv_heads"],
        max_position_embeddings=sizes["max_position_embeddings"],
        rms_norm_eps=1e-6,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        initializer_range=0.1,
        tie_word_embeddings=arch == "qwen2",
    )
    rope, common["max_position_embeddings"] = _rope(
        sizes.get("rope_scaling"),
        sizes["max_position_embeddings"],
        sizes["hidden_size"] // sizes["num_heads"],
    )
    if arch == "llama":
        return tf.LlamaConfig(
            **common, rope_parameters=rope, head_dim=sizes["hidden_size"] // sizes["num_heads"]
        )
    if arch == "qwen2":
        return tf.Qwen2Config(**common, rope_parameters=rope, use_sliding_window=False)
    if arch == "qwen3":
        return tf.Qwen3Config(
            **common,
            rope_parameters=rope,
            head_dim=sizes["hidden_size"] // sizes["num_heads"],
            use_sliding_window=False,
        )
    if arch == "mistral":
        return tf.MistralConfig(
            **common,
            rope_parameters=rope,
            sliding_window=None,
            head_dim=sizes["hidden_size"] // sizes["num_heads"],
        )
    raise ValueError(f"unsupported --arch {arch!r}; choose from {', '.join(ARCHS)}")


def _rope(kind: str | None, max_positions: int, head_dim: int) -> tuple[dict[str, Any], int]:
    """(rope_parameters, max_position_embeddings) for a scaling type. `max_positions` is the context
    the model was "trained" for: max_position_embeddings, except for longrope, whose configs (Phi-3)
    state the extended length there and the trained one as original_max_position_embeddings (so
    here max_position_embeddings = 4 x max_positions). The longest context each allows:
    models/rope.py `max_length` (linear, dynamic 2x, yarn 4x, longrope 4x, llama3 1x)."""
    if kind is None:
        return {"rope_type": "default", "rope_theta": 10000.0}, max_positions
    if kind == "llama3":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return rope, max_positions
    if kind in ("linear", "dynamic"):
        return {"rope_type": kind, "rope_theta": 10000.0, "factor": 2.0}, max_positions
    if kind == "yarn":  # Qwen2.5's long-context form: max_position_embeddings = the original length
        rope = {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": max_positions,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        }
        return rope, max_positions
    if kind == "longrope":  # Phi-3's form; short factors near 1, long ones rising to the factor
        half = head_dim // 2
        rope = {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": max_positions,
            "short_factor": [round(1.0 + 0.05 * i / max(half - 1, 1), 4) for i in range(half)],
            "long_factor": [round(4.0 ** (i / max(half - 1, 1)), 4) for i in range(half)],
        }
        return rope, 4 * max_positions
    raise ValueError(f"unsupported rope scaling {kind!r}; choose from {', '.join(ROPE_SCALINGS)}")


def make_tiny_model(
    out_dir: str | Path,
    arch: str = "llama",
    seed: int = 0,
    *,
    hidden_size: int = 64,
    intermediate_size: int | None = None,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 1024,
    vocab_size: int = 512,
    rope_scaling: str | None = None,
    shards: int = 1,
) -> Path:
    """Write a random-weight model + tokenizer to `out_dir` and return it."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if arch not in ARCHS:
        raise ValueError(f"unsupported --arch {arch!r}; choose from {', '.join(ARCHS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab_size)
    sizes = dict(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        rope_scaling=rope_scaling,
    )
    bos, eos, pad = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    # train_tokenizer sets each of these to one special token, so each id is a single int
    assert isinstance(bos, int) and isinstance(eos, int) and isinstance(pad, int), (bos, eos, pad)
    cfg = _config(arch, len(tok), bos, eos, pad, sizes)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )
    shard_size = None
    if shards > 1:
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        shard_size = f"{max(1, total // shards // 1000)}KB"
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(out, **kwargs)
    tok.save_pretrained(out)
    _normalize_json(out)
    return out


def _normalize_json(out: Path) -> None:
    """Rewrite JSON files with sorted keys so equal content is equal bytes, and drop the writer's
    `transformers_version`, so the embedded model (and the digest examples pin) does not change
    with every transformers release."""
    for p in out.glob("*.json"):
        data = json.loads(p.read_text())
        if isinstance(data, dict):
            data.pop("transformers_version", None)
        p.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", help="directory to write the model into")
    parser.add_argument("--arch", choices=ARCHS, default="llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument(
        "--rope-scaling",
        choices=ROPE_SCALINGS,
        default=None,
        help="RoPE scaling type (default: none); longrope's max_position_embeddings is 4x --max-positions",
    )
    parser.add_argument("--shards", type=int, default=1, help="split weights over N safetensors files")
    parser.add_argument(
        "--max-positions",
        type=int,
        default=1024,
        help="max_position_embeddings, the context the model is made for (RoPE scaling extends it; "
        "longrope: original_max_position_embeddings)",
    )


def main(args: argparse.Namespace) -> int:
    from modeldeploy.digest import dir_digest

    if args.max_positions < 16:
        raise SystemExit(f"--max-positions must be >= 16, got {args.max_positions}")
    out = make_tiny_model(
        args.out_dir,
        args.arch,
        args.seed,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        rope_scaling=args.rope_scaling,
        shards=args.shards,
        max_position_embeddings=args.max_positions,
    )
    print(f"wrote {args.arch} model to {out}  digest {dir_digest(out)}")
    return 0
