"""Model directories derived from a good one, for the quality gate's tests and benches.

Bad bundles that are neither slower nor failing, only worse (what the quality gate must catch):
weights re-quantized to fewer bits, and a chat template that silently drops the system turn.
Harmless ones that must pass: the same weights split over another file layout. The product has no
switch for any of this: a bad bundle is a different model or tokenizer directory, with its own
digest, made here. Every writer is
deterministic (same input, same bytes), so a variant's digest can be pinned like a real revision.

    python -m modeldeploy_dev.model_variants requantize SRC OUT --bits 3 --group 32
    python -m modeldeploy_dev.model_variants drop-system-turn SRC OUT
    python -m modeldeploy_dev.model_variants split SRC OUT --parts 2
    python -m modeldeploy_dev.model_variants gguf-requantize SRC.gguf OUT --type Q8_0

GGUF formats (to measure what a weight format costs in answers): `gguf_requantize` writes a GGUF
whose block weights are re-quantized to another GGML type, as `llama-quantize --allow-requantize`
does, with gguf-py's reference quantizers. The served format is then that file, kept quantized.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# Weights whose rounding changes answers without changing shapes or speed: every linear layer of
# every block. Norms and embeddings stay exact (re-quantizing those breaks the model outright, which
# any check catches; the gate must catch the subtle case).
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name)
    if not weights:
        raise SystemExit(f"{model_dir}: no *.safetensors files")
    return weights


def copy_rest(src: Path, out: Path) -> None:
    """Everything but the weights, byte for byte (config, tokenizer, chat template)."""
    out.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        if p.is_file() and not p.name.endswith(".safetensors") and p.name != "model.safetensors.index.json":
            shutil.copyfile(p, out / p.name)


def rtn(w: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Round-to-nearest, asymmetric (min/max) per group of `group` input columns: what a careless
    low-bit export does. Returned in w's dtype, same shape."""
    rows, cols = w.shape
    if cols % group:
        raise SystemExit(f"--group {group} does not divide {cols} columns")
    g = w.float().reshape(rows, cols // group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    levels = (1 << bits) - 1
    scale = ((hi - lo) / levels).clamp_min(1e-12)
    q = torch.round((g - lo) / scale).clamp(0, levels)
    return (q * scale + lo).reshape(rows, cols).to(w.dtype)


def requantize(src: Path, out: Path, bits: int, group: int) -> Path:
    if not 1 <= bits <= 8:
        raise SystemExit(f"--bits: must be 1..8, got {bits}")
    weights = read_weights(src)
    done = {n: rtn(w, bits, group) if n.split(".")[-2] in LINEAR else w for n, w in weights.items()}
    copy_rest(src, out)
    save_file(dict(sorted(done.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def split(src: Path, out: Path, parts: int) -> Path:
    """The same tensors over `parts` files plus the index transformers writes for sharded models."""
    weights = read_weights(src)
    names = sorted(weights)
    if not 1 <= parts <= len(names):
        raise SystemExit(f"--parts: must be 1..{len(names)}, got {parts}")
    copy_rest(src, out)
    per = -(-len(names) // parts)
    index: dict[str, str] = {}
    for i in range(parts):
        chunk = names[i * per : (i + 1) * per]
        fname = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
        save_file({n: weights[n] for n in chunk}, str(out / fname), metadata={"format": "pt"})
        index.update(dict.fromkeys(chunk, fname))
    total = sum(w.numel() * w.element_size() for w in weights.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=2, sort_keys=True) + "\n"
    )
    return out


# Prepended to the template: the system turn is filtered out before the template sees it. Subtle on
# purpose: every request still renders and answers, the conformance gate passes, and a template with
# a default system prompt (SmolLM2's) silently swaps the user's instructions for its own.
DROP_SYSTEM = "{%- set messages = messages | rejectattr('role', 'equalto', 'system') | list -%}\n"


def drop_system_turn(src: Path, out: Path) -> Path:
    """A tokenizer revision whose chat template ignores system messages."""
    shutil.copytree(src, out, dirs_exist_ok=True)
    jinja = out / "chat_template.jinja"
    if jinja.is_file():
        jinja.write_text(DROP_SYSTEM + jinja.read_text())
        return out
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    if not isinstance(cfg.get("chat_template"), str):
        raise SystemExit(f"{src}: no chat template (chat_template.jinja or tokenizer_config.json)")
    cfg["chat_template"] = DROP_SYSTEM + cfg["chat_template"]
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


# The GGML types gguf-py can write (its quantizers; the K-quants it only reads) and the runtime
# serves natively (modeldeploy.kernels.quant).
GGUF_TYPES = ("Q8_0", "Q4_0", "Q4_1")
# Kept at the source file's type: the token embedding, which is also SmolLM2's (tied) output head;
# llama.cpp too keeps the output at a higher precision than the layers.
GGUF_KEEP = ("token_embd.weight", "output.weight")


def gguf_requantize(src: Path, out: Path, qtype: str) -> Path:
    """`out`/<stem>.<qtype>.gguf, alone in `out` so it serves as a model directory: `src` with every
    block-quantized tensor but the embedding de-quantized to float32 and quantized again to `qtype`;
    float tensors (norms) and every metadata field (config, tokenizer, chat template) as they are,
    general.file_type excepted (it names the source's format). Deterministic: same input, same bytes."""
    import gguf

    if qtype not in GGUF_TYPES:
        raise SystemExit(f"--type: one of {', '.join(GGUF_TYPES)}, got {qtype!r}")
    target = gguf.GGMLQuantizationType[qtype]
    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    reader = gguf.GGUFReader(src)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.gguf"):
        old.unlink()
    dest = out / f"{src.stem.split('.')[0]}.{qtype}.gguf"
    writer = gguf.GGUFWriter(dest, str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents()))
    for f in reader.fields.values():
        if f.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) or f.name.startswith(
            "GGUF."
        ):
            continue  # the writer adds the architecture and its own header fields
        vtype = f.types[0]
        writer.add_key_value(
            f.name, f.contents(), vtype, f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        )
    for t in reader.tensors:
        if t.tensor_type in floats or t.name in GGUF_KEEP:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        writer.add_tensor(t.name, gguf.quants.quantize(w, target), raw_dtype=target)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeldeploy_dev.model_variants", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("requantize", help="linear weights rounded to --bits per --group columns (worse)")
    q.add_argument("--bits", type=int, default=3)
    q.add_argument("--group", type=int, default=32)
    s = sub.add_parser("split", help="the same weights over --parts safetensors files (harmless)")
    s.add_argument("--parts", type=int, default=2)
    sub.add_parser("drop-system-turn", help="a chat template that ignores system messages (worse)")
    g = sub.add_parser("gguf-requantize", help="a GGUF's block weights re-quantized to --type")
    g.add_argument("--type", default="Q8_0", choices=GGUF_TYPES)
    for sp in sub.choices.values():
        sp.add_argument("src", type=Path)
        sp.add_argument("out", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "gguf-requantize":
        if not a.src.is_file() or a.src.suffix != ".gguf":
            p.error(f"src: {a.src} is not a .gguf file")
        print(gguf_requantize(a.src, a.out, a.type))
        return 0
    if not a.src.is_dir():
        p.error(f"src: {a.src} is not a directory")
    if a.cmd == "requantize":
        requantize(a.src, a.out, a.bits, a.group)
    elif a.cmd == "split":
        split(a.src, a.out, a.parts)
    else:
        drop_system_turn(a.src, a.out)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
