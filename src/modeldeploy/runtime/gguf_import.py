"""Import a GGUF file (llama.cpp's format) as a model directory the runtime serves.

transformers (with the `gguf` package) reads the file: it de-quantizes the weights (Q4_1, Q8_0, ...)
to float32, undoes llama.cpp's q/k row permutation, maps the metadata to a config and rebuilds the
tokenizer and chat template. We write the result ourselves, because the bundle pins the directory's
digest and so the bytes must be the same on every run and every machine:

- `model.safetensors`: tensors sorted by name, `{"format": "pt"}` metadata only; a tied `lm_head`
  is left out (the runtime and transformers tie it back), as `save_pretrained` does.
- `config.json`, `generation_config.json`, `tokenizer_config.json`, `tokenizer.json`: sorted keys,
  no `transformers_version` or local paths, so a transformers upgrade does not move the digest.
- `chat_template.jinja`: the template from the GGUF metadata, as transformers reads it back.
- `gguf_import.json`: where it came from (the GGUF file's name and sha256, the dtype).

The runtime serves the directory like any other (safetensors, not GGUF), so engine equality is
checked against transformers on exactly the weights it serves.

The runtime also serves a directory holding the .gguf file itself (runtime/loader.py), with the
weights kept quantized: `read_gguf_weights` below reads them for it.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

    from modeldeploy.kernels.quant import QuantLinear
    from modeldeploy.runtime.models.llama import ModelArgs

log = logging.getLogger("modeldeploy.runtime")

GGUF_MAGIC = b"GGUF"
# GGUF `general.architecture` -> the transformers class the runtime serves (models/llama.py SUPPORTED).
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
DTYPES = ("float32", "bfloat16", "float16")
# Keys transformers writes that say where or with what a file was made, not what the model is
# (`quantization_config` would make transformers read the safetensors as GGUF-quantized again).
_VOLATILE_KEYS = (
    "transformers_version",
    "_name_or_path",
    "_model_name_or_path",
    "_commit_hash",
    "quantization_config",
    "is_local",
    "local_files_only",
)


class GGUFImportError(ValueError):
    """A GGUF file this importer cannot turn into a model directory (the message names why)."""


def read_architecture(path: Path) -> str:
    """The GGUF file's `general.architecture`; GGUFImportError for a missing or non-GGUF file."""
    return open_gguf(path)[1]


def open_gguf(path: Path) -> tuple[Any, str]:
    """(a GGUFReader of the file, its `general.architecture`): one parse of the metadata (seconds
    for a 49k-token vocabulary), shared by the checks and the weights. GGUFImportError for a
    missing or non-GGUF file."""
    if not path.is_file():
        raise GGUFImportError(f"FILE: {path} does not exist or is not a file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFImportError(
            f"FILE: {path} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})"
        )
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        field = reader.fields.get("general.architecture")
        arch = field.contents() if field is not None else None
    except (ValueError, IndexError, OSError) as e:  # a truncated or corrupt header
        raise GGUFImportError(f"FILE: {path} is not a readable GGUF file: {e}") from None
    if not isinstance(arch, str):
        raise GGUFImportError(f"FILE: {path} has no general.architecture in its GGUF metadata")
    return reader, arch


# GGUF tensor names -> the transformers names the runtime reads ({i}: the layer).
_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_FLOAT_TYPES = ("F32", "F16", "BF16")


def hf_name(gguf_name: str) -> str | None:
    """The transformers name of a GGUF tensor name (None for one the runtime does not read)."""
    if gguf_name in _GGUF_NAMES:
        return _GGUF_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}"
    return None


@dataclass
class GGUFWeights:
    """The weights of a GGUF file as the runtime holds them, and what happened to each type."""

    weights: dict[str, torch.Tensor | QuantLinear]
    file: str
    file_type: str  # general.file_type as llama.cpp names it (e.g. MOSTLY_Q4_1), "" when absent
    kept: Counter = field(default_factory=Counter)  # GGUF type -> tensors kept quantized
    dequantized: Counter = field(default_factory=Counter)  # GGUF type -> tensors de-quantized
    floats: Counter = field(default_factory=Counter)  # F32/F16/BF16 -> tensors (read as floats)

    def summary(self) -> dict[str, Any]:
        """For /v1/bundle (engine_info.quantization): what the served bytes are."""
        from modeldeploy.kernels.quant import nbytes

        return {
            "format": "gguf",
            "file": self.file,
            "file_type": self.file_type,
            "kept_quantized": dict(sorted(self.kept.items())),
            "dequantized": dict(sorted(self.dequantized.items())),
            "float": dict(sorted(self.floats.items())),
            "weight_bytes": sum(nbytes(w) for w in self.weights.values()),
        }


def _reverse_permute(n: int, heads: int) -> np.ndarray:
    """Row order undoing llama.cpp's q/k permutation (transformers' `_reverse_permute_weights`):
    within each head, the interleaved (even, odd) rotary rows back to halves."""
    import numpy as np

    return np.arange(n).reshape(heads, n // heads // 2, 2).transpose(0, 2, 1).reshape(-1)


def _float_data(t: Any, kind: str, quants: Any) -> np.ndarray:
    """A GGUF tensor that is not kept quantized, as a float32 array (de-quantized by gguf-py)."""
    import numpy as np

    from modeldeploy.kernels.quant import GGUF_TYPES

    if kind in _FLOAT_TYPES:
        return np.array(t.data, dtype=np.float32)
    try:
        return np.asarray(quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
    except NotImplementedError:
        raise ValueError(
            f"model: GGUF tensor {t.name} has type {kind}, which neither the runtime nor gguf-py "
            f"reads; kept quantized: {', '.join(GGUF_TYPES)}"
        ) from None


def read_gguf_weights(
    path: Path, args: ModelArgs, dtype: torch.dtype, arch: str, reader: Any = None
) -> GGUFWeights:
    """Every tensor the model reads from a GGUF file: Q4_0/Q4_1/Q4_K/Q8_0 matrices kept quantized
    (QuantLinear), F32/F16/BF16 read as `dtype`, any other type de-quantized to `dtype` with a log
    line naming the tensors (a type gguf-py cannot de-quantize is refused, naming tensor and type).
    ValueError names a missing tensor or a shape that does not match the config. `reader`: the
    file's GGUFReader when the caller has one (open_gguf)."""
    import numpy as np
    import torch
    from gguf import GGUFReader, quants

    from modeldeploy.kernels.quant import GGUF_TYPES, from_gguf
    from modeldeploy.runtime.models.llama import expected_weight_shapes

    reader = reader if reader is not None else GGUFReader(path)
    ft = reader.fields.get("general.file_type")
    file_type = ""
    if ft is not None:
        from gguf import LlamaFileType

        try:
            file_type = LlamaFileType(int(ft.contents())).name
        except (ValueError, TypeError):
            file_type = str(ft.contents())
    out = GGUFWeights({}, path.name, file_type)
    want = expected_weight_shapes(args)
    # llama.cpp permutes llama's q/k rows for its rotary layout; transformers undoes it, and so do we
    heads = {"q_proj": args.num_heads, "k_proj": args.num_kv_heads} if arch == "llama" else {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None or name not in want:
            continue
        shape = tuple(int(x) for x in reversed(list(t.shape)))  # GGUF lists ne0 (the row length) first
        if shape != want[name]:
            raise ValueError(
                f"model: GGUF tensor {t.name} ({name}) has shape {shape}, config implies {want[name]}"
            )
        kind = t.tensor_type.name
        h = next((n for k, n in heads.items() if name.endswith(f"self_attn.{k}.weight")), None)
        order = None if h is None else torch.from_numpy(_reverse_permute(shape[0], h))
        if kind in GGUF_TYPES and len(shape) == 2:
            q = from_gguf(kind, np.asarray(t.data).reshape(shape[0], -1), shape[1])
            out.weights[name] = q if order is None else q.take_rows(order)
            out.kept[kind] += 1
            continue
        (out.floats if kind in _FLOAT_TYPES else out.dequantized)[kind] += 1
        w = torch.from_numpy(_float_data(t, kind, quants)).reshape(shape).to(dtype)
        out.weights[name] = w if order is None else w[order]
    missing = [n for n in want if n not in out.weights]
    if missing:
        raise ValueError(
            f"model: tensors missing from {path.name}: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    if out.dequantized:
        log.warning(
            "GGUF %s: de-quantized to %s (not kept quantized, only %s are): %s",
            path.name,
            dtype,
            ", ".join(GGUF_TYPES),
            ", ".join(f"{n} tensors of {k}" for k, n in sorted(out.dequantized.items())),
        )
    log.info(
        "GGUF %s (%s): kept quantized %s; float %s",
        path.name,
        file_type,
        dict(out.kept) or "none",
        dict(out.floats) or "none",
    )
    return out


def _clean(data: Any) -> Any:
    """JSON data with the volatile keys dropped (top level), ready to dump with sorted keys."""
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if k not in _VOLATILE_KEYS}
    return data


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(_clean(data), indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _write_weights(model, out: Path, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file

    target = getattr(torch, dtype)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tensors = {
        name: t.detach().to(dtype=target, device="cpu").contiguous().clone()
        for name, t in sorted(model.state_dict().items())
        if not (tied and name == "lm_head.weight")
    }
    path = out / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # safetensors creates it 0600; a pod that mounts the directory reads it as any user


def _write_tokenizer(tokenizer, out: Path) -> None:
    """Save through transformers (so it loads back the same), then normalise every JSON file it
    wrote; the chat template stays in chat_template.jinja where transformers reads it."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        for p in sorted(Path(tmp).iterdir()):
            if p.suffix == ".json":
                _write_json(out / p.name, json.loads(p.read_text()))
            else:
                shutil.copyfile(p, out / p.name)
    if not (out / "chat_template.jinja").is_file() and getattr(tokenizer, "chat_template", None):
        (out / "chat_template.jinja").write_text(tokenizer.chat_template)


def import_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write the model directory for `gguf_path` into `out_dir` (created; its old files replaced)
    and return it. GGUFImportError names the problem for a missing, non-GGUF or unsupported file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from modeldeploy.digest import file_sha256

    src = Path(gguf_path)
    if dtype not in DTYPES:
        raise GGUFImportError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    arch = read_architecture(src)
    if arch not in ARCHITECTURES:
        raise GGUFImportError(
            f"FILE: {src} has architecture {arch!r}; the runtime serves {', '.join(sorted(ARCHITECTURES))}"
        )
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise GGUFImportError(f"OUT_DIR: {out} exists and is not a directory")
    d, name = str(src.parent), src.name
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=name)
    if type(model).__name__ != ARCHITECTURES[arch]:
        raise GGUFImportError(
            f"FILE: {src}: transformers built {type(model).__name__}, expected {ARCHITECTURES[arch]}"
        )

    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():  # a re-import leaves no stale file behind to change the digest
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    _write_weights(model, out, dtype)
    config = model.config.to_dict()
    config.update(architectures=[ARCHITECTURES[arch]], dtype=dtype)
    _write_json(out / "config.json", config)
    gen = GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
        do_sample=False,
    )
    _write_json(out / "generation_config.json", gen.to_diff_dict())
    _write_tokenizer(tokenizer, out)
    _write_json(
        out / "gguf_import.json", {"dtype": dtype, "gguf_file": name, "gguf_sha256": file_sha256(src)}
    )
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the .gguf file (llama, mistral, qwen2 or qwen3)")
    parser.add_argument(
        "out_dir", metavar="OUT_DIR", help="the model directory to write (its files are replaced)"
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="weight dtype in model.safetensors (float32: exact)",
    )


def main(args: argparse.Namespace) -> int:
    from modeldeploy.digest import dir_digest

    try:
        out = import_gguf(args.file, args.out_dir, args.dtype)
    except GGUFImportError as e:
        raise SystemExit(f"modeldeploy model import-gguf: {e}") from None
    print(f"imported {args.file} into {out}  digest {dir_digest(out)}")
    return 0
