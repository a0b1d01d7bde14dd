"""Model directories derived from a good one, for the quality gate's tests and benches.

Bad bundles that are neither slower nor failing, only worse (issue 36): weights re-quantized to
fewer bits, and a chat template that silently drops the system turn. Harmless ones that must pass:
the same weights split over another file layout. The product has no switch for any of this: a bad
bundle is a different model or tokenizer directory, with its own digest, made here. Every writer is
deterministic (same input, same bytes), so a variant's digest can be pinned like a real revision.

    python -m modeldeploy_dev.model_variants requantize SRC OUT --bits 3 --group 32
    python -m modeldeploy_dev.model_variants drop-system-turn SRC OUT
    python -m modeldeploy_dev.model_variants split SRC OUT --parts 2
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeldeploy_dev.model_variants", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("requantize", help="linear weights rounded to --bits per --group columns (worse)")
    q.add_argument("--bits", type=int, default=3)
    q.add_argument("--group", type=int, default=32)
    s = sub.add_parser("split", help="the same weights over --parts safetensors files (harmless)")
    s.add_argument("--parts", type=int, default=2)
    sub.add_parser("drop-system-turn", help="a chat template that ignores system messages (worse)")
    for sp in sub.choices.values():
        sp.add_argument("src", type=Path)
        sp.add_argument("out", type=Path)
    a = p.parse_args(argv)
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
