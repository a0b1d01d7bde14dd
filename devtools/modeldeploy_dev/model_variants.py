"""Model directories derived from a good one, for the quality gate's tests and benches.

Bad bundles that are neither slower nor failing, only worse (what the quality gate must catch), one
writer per class:
- weights: linear layers re-quantized to fewer bits (`requantize`), two decoder layers swapped
  (`swap_layers`), one layer's output projections zeroed so it adds nothing (`zero_layer`);
- config.json: a positional-encoding or normalization parameter changed (`config_edit`: rope_theta,
  rms_norm_eps), the end-of-sequence id moved to another token so answers run on (`special_ids`);
- tokenizer (modeldeploy_dev.model_variants_tokenizer): a chat template that drops the system turn
  (`drop_system_turn`) or emits no assistant header for add_generation_prompt
  (`no_generation_prompt`), BPE merges removed so some words split differently (`partial_tokenizer`).
Harmless ones that must pass: the same weights split over another file layout (`split`). The product
has no switch for any of this: a bad bundle is a different model or tokenizer directory, with its own
digest, made here. Every writer is deterministic (same input, same bytes), so a variant's digest can
be pinned like a real revision.

    python -m modeldeploy_dev.model_variants requantize SRC OUT --bits 3 --group 32
    python -m modeldeploy_dev.model_variants split SRC OUT --parts 2
    python -m modeldeploy_dev.model_variants swap-layers SRC OUT --a 14 --b 15
    python -m modeldeploy_dev.model_variants zero-layer SRC OUT --layer 15
    python -m modeldeploy_dev.model_variants config-edit SRC OUT --set rope_theta=50000.0 \\
        --set rms_norm_eps=1e-4          # KEY=JSON; a.b sets key b of object a; --allow-new
    python -m modeldeploy_dev.model_variants special-ids SRC OUT --eos '<|endoftext|>'
    python -m modeldeploy_dev.model_variants drop-system-turn SRC OUT
    python -m modeldeploy_dev.model_variants no-generation-prompt SRC OUT
    python -m modeldeploy_dev.model_variants partial-tokenizer SRC OUT --every 50
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

from modeldeploy_dev.model_variants_tokenizer import drop_system_turn, no_generation_prompt, partial_tokenizer

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
    return write_weights(src, out, done)


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


def write_weights(src: Path, out: Path, weights: dict[str, torch.Tensor]) -> Path:
    """`weights` as one model.safetensors in `out`, with everything else of `src` as it is."""
    copy_rest(src, out)
    save_file(dict(sorted(weights.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


LAYERS = "model.layers."


def _layer_names(weights: dict[str, torch.Tensor], i: int) -> list[str]:
    names = sorted(n for n in weights if n.startswith(f"{LAYERS}{i}."))
    if not names:
        count = len({n.split(".")[2] for n in weights if n.startswith(LAYERS)})
        raise SystemExit(f"layer {i}: no {LAYERS}{i}.* weights (the model has {count} layers)")
    return names


def swap_layers(src: Path, out: Path, a: int, b: int) -> Path:
    """Decoder layers `a` and `b` trade places: every `model.layers.{a}.*` tensor is stored as
    `model.layers.{b}.*` and the other way round. Same shapes, same speed, a different function."""
    if a == b:
        raise SystemExit(f"swap-layers: {a} and {b} are the same layer")
    weights = read_weights(src)
    na, nb = _layer_names(weights, a), _layer_names(weights, b)
    pa, pb = f"{LAYERS}{a}.", f"{LAYERS}{b}."
    moved = {pb + n.removeprefix(pa): weights.pop(n) for n in na}
    moved.update({pa + n.removeprefix(pb): weights.pop(n) for n in nb})
    return write_weights(src, out, {**weights, **moved})


# A layer's writes into the residual stream: attention's and the MLP's output projections.
OUTPUTS = ("self_attn.o_proj.", "mlp.down_proj.")


def zero_layer(src: Path, out: Path, i: int) -> Path:
    """Layer `i`'s output projections (weights and biases, if any) zeroed: the layer still runs, and
    adds nothing to the residual stream."""
    weights = read_weights(src)
    names = [n for n in _layer_names(weights, i) if n.removeprefix(f"{LAYERS}{i}.").startswith(OUTPUTS)]
    missing = [o for o in OUTPUTS if not any(n.startswith(f"{LAYERS}{i}.{o}") for n in names)]
    if missing:
        raise SystemExit(f"layer {i}: no {', '.join(missing)}* weights among {_layer_names(weights, i)}")
    return write_weights(src, out, {**weights, **{n: torch.zeros_like(weights[n]) for n in names}})


def with_json(src: Path, out: Path, files: dict[str, dict]) -> Path:
    """`src` copied to `out`, byte for byte, but for the JSON `files` (name -> content), written with
    sorted keys."""
    shutil.copytree(src, out, dirs_exist_ok=True)
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out


def _merge(cfg: dict, changes: dict, allow_new: bool, where: str = "") -> None:
    for key, value in changes.items():
        if key == "rope_theta" and key not in cfg and isinstance(cfg.get("rope_parameters"), dict):
            key, value = "rope_parameters", {"rope_theta": value}  # transformers 5 keeps it there
        if key not in cfg and not allow_new:
            have = ", ".join(sorted(cfg))
            raise SystemExit(f"config.json has no {where}{key!r} (keys: {have}); allow_new to add it")
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            _merge(cfg[key], value, allow_new, f"{where}{key}.")
        else:
            cfg[key] = value


def config_edit(src: Path, out: Path, changes: dict, allow_new: bool = False) -> Path:
    """The same weights and tokenizer with config.json's `changes` set: an object value merges into
    the config's own object (key by key, as hf_overrides does), and `rope_theta` lands in
    `rope_parameters` where the config keeps it there. A key the config lacks is refused unless
    `allow_new`: a typo must not make a harmless variant."""
    cfg = json.loads((src / "config.json").read_text())
    _merge(cfg, changes, allow_new)
    return with_json(src, out, {"config.json": cfg})


def token_id(model_dir: Path, token: str) -> int:
    """The id of `token` (a special token or any vocabulary entry) in model_dir's tokenizer.json."""
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab = (tok.get("model") or {}).get("vocab")
    found = ids.get(token, vocab.get(token) if isinstance(vocab, dict) else None)
    if not isinstance(found, int):
        raise SystemExit(f"{model_dir}/tokenizer.json: no token {token!r}")
    return found


def special_ids(src: Path, out: Path, eos_token: str) -> Path:
    """The end-of-sequence id moved to `eos_token`'s wherever the runtime reads its stop ids
    (modeldeploy.runtime.loader: generation_config.json's eos_token_id, else config.json's; both
    are written): a chat answer no longer ends at the template's end of turn but runs on to
    `eos_token` or max_tokens. Weights, tokenizer and chat template as they are."""
    new = token_id(src, eos_token)
    changed = {}
    for name in ("config.json", "generation_config.json"):
        path = src / name
        if not path.is_file():
            continue
        cfg = json.loads(path.read_text())
        old = cfg.get("eos_token_id")
        if old == new or old == [new]:
            raise SystemExit(f"{path}: eos_token_id is already {new} ({eos_token})")
        cfg["eos_token_id"] = [new] if isinstance(old, list) else new
        changed[name] = cfg
    if "config.json" not in changed:
        raise SystemExit(f"{src}: no config.json")
    return with_json(src, out, changed)


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


def parse_set(items: list[str]) -> dict:
    """--set KEY=VALUE pairs as config_edit's changes: VALUE is JSON (a bare word is a string), and a
    dotted KEY (rope_parameters.rope_theta) sets a key of a nested object."""
    changes: dict = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"--set: {item!r} is not KEY=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *parents, leaf = key.split(".")
        node = changes
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return changes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m modeldeploy_dev.model_variants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("requantize", help="linear weights rounded to --bits per --group columns (worse)")
    q.add_argument("--bits", type=int, default=3)
    q.add_argument("--group", type=int, default=32)
    s = sub.add_parser("split", help="the same weights over --parts safetensors files (harmless)")
    s.add_argument("--parts", type=int, default=2)
    w = sub.add_parser("swap-layers", help="decoder layers --a and --b swapped (worse)")
    w.add_argument("--a", type=int, required=True)
    w.add_argument("--b", type=int, required=True)
    z = sub.add_parser("zero-layer", help="layer --layer's output projections zeroed (worse)")
    z.add_argument("--layer", type=int, required=True)
    c = sub.add_parser("config-edit", help="config.json keys set to new values (worse)")
    c.add_argument("--set", action="append", required=True, metavar="KEY=JSON", dest="changes")
    c.add_argument("--allow-new", action="store_true", help="allow keys config.json does not have")
    e = sub.add_parser("special-ids", help="the end-of-sequence id moved to --eos's (worse)")
    e.add_argument("--eos", required=True, help="the token that now ends a sequence, e.g. '<|endoftext|>'")
    sub.add_parser("drop-system-turn", help="a chat template that ignores system messages (worse)")
    sub.add_parser("no-generation-prompt", help="a chat template without the assistant header (worse)")
    t = sub.add_parser("partial-tokenizer", help="every --every-th BPE merge removed (worse)")
    t.add_argument("--every", type=int, default=50)
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
    writers = {
        "requantize": lambda: requantize(a.src, a.out, a.bits, a.group),
        "split": lambda: split(a.src, a.out, a.parts),
        "swap-layers": lambda: swap_layers(a.src, a.out, a.a, a.b),
        "zero-layer": lambda: zero_layer(a.src, a.out, a.layer),
        "config-edit": lambda: config_edit(a.src, a.out, parse_set(a.changes), a.allow_new),
        "special-ids": lambda: special_ids(a.src, a.out, a.eos),
        "drop-system-turn": lambda: drop_system_turn(a.src, a.out),
        "no-generation-prompt": lambda: no_generation_prompt(a.src, a.out),
        "partial-tokenizer": lambda: partial_tokenizer(a.src, a.out, a.every),
    }
    print(writers[a.cmd]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
