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
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

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
        field = GGUFReader(path).fields.get("general.architecture")
        arch = field.contents() if field is not None else None
    except (ValueError, IndexError, OSError) as e:  # a truncated or corrupt header
        raise GGUFImportError(f"FILE: {path} is not a readable GGUF file: {e}") from None
    if not isinstance(arch, str):
        raise GGUFImportError(f"FILE: {path} has no general.architecture in its GGUF metadata")
    return arch


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
