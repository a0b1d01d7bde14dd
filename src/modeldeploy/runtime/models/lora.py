"""LoRA adapters in PEFT format, and the device slots a mixed batch reads them from.

An adapter directory holds `adapter_config.json` and `adapter_model.safetensors` as
`peft` saves them. Each targeted linear W gets W x + scale * B (A x), A [r, in], B [out, r],
scale = alpha / r (or alpha / sqrt(r) with rsLoRA). Targets are any of q/k/v/o/gate/up/down;
anything else PEFT can express (DoRA, trained biases, extra saved modules, per-module
rank/alpha patterns, embedding or lm_head targets) is refused by name rather than served
wrong.

The model fuses q/k/v and gate/up into one GEMM each, so adapters are stacked per fused
*site* (qkv, o, gate_up, down): a site's A is its targets' A matrices one after another
along the rank axis and its B is block-diagonal, so one `dispatch.lora_apply` per site adds
every target's delta. Ranks are zero-padded to the largest adapter's, which adds exact zeros.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from modeldeploy.kernels import dispatch
from modeldeploy.runtime.models.llama import ModelArgs

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
SITES: dict[str, tuple[str, ...]] = {
    "qkv": ("q", "k", "v"),
    "o": ("o",),
    "gate_up": ("gate", "up"),
    "down": ("down",),
}
SITE_OF = {t: site for site, ts in SITES.items() for t in ts}
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_KEY = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.lora_([AB])\.weight$"
)
# PEFT options that change the computation; serving an adapter that uses them as plain LoRA
# would answer wrong, so each is refused by name unless it has its neutral value.
_NEUTRAL = {
    "use_dora": (False, None),
    "bias": ("none", None),
    "lora_bias": (False, None),
    "modules_to_save": (None, [], ()),
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None),
    "layer_replication": (None,),
    "fan_in_fan_out": (False, None),
    "trainable_token_indices": (None,),
    "alora_invocation_tokens": (None,),
}


def target_dims(args: ModelArgs, target: str) -> tuple[int, int]:
    """(in, out) features of a target projection."""
    E, inter, D = args.hidden_size, args.intermediate_size, args.head_dim
    q, kv = args.num_heads * D, args.num_kv_heads * D
    return {
        "q": (E, q),
        "k": (E, kv),
        "v": (E, kv),
        "o": (q, E),
        "gate": (E, inter),
        "up": (E, inter),
        "down": (inter, E),
    }[target]


@dataclass
class Adapter:
    """One adapter's weights in host memory, per (layer, target): (A [r, in], B [out, r])."""

    name: str
    path: str
    rank: int
    alpha: float
    rslora: bool
    targets: tuple[str, ...]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def read_adapter(name: str, path: str | Path, args: ModelArgs, dtype: torch.dtype) -> Adapter:
    """Read and check a PEFT LoRA directory against the base model's shapes.

    Raises ValueError naming the adapter and what is wrong with it.
    """
    path = Path(path)
    where = f"adapter {name!r} ({path})"
    cfg_path, w_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not cfg_path.is_file() or not w_path.is_file():
        raise ValueError(f"{where}: expected {CONFIG_FILE} and {WEIGHTS_FILE} (PEFT format)")
    cfg = json.loads(cfg_path.read_text())
    rank, alpha = _check_config(cfg, where)
    raw = _read_tensors(w_path, args, dtype, where)
    weights = _pair_weights(raw, args, rank, where)
    targets = tuple(t for t in TARGETS if any(t == k[1] for k in weights))
    return Adapter(name, str(path), rank, float(alpha), bool(cfg.get("use_rslora", False)), targets, weights)


def _check_config(cfg: dict[str, Any], where: str) -> tuple[int, float]:
    """adapter_config.json: a plain LoRA (no option this runtime would ignore); its rank and alpha."""
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where}: peft_type {cfg.get('peft_type')!r} is not supported (only LORA)")
    for key, neutral in _NEUTRAL.items():
        if key in cfg and cfg[key] not in neutral:
            raise ValueError(f"{where}: {key}={cfg[key]!r} is not supported")
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{where}: r must be a positive integer, got {rank!r}")
    if not isinstance(alpha, int | float) or alpha <= 0:
        raise ValueError(f"{where}: lora_alpha must be a positive number, got {alpha!r}")
    return rank, alpha


def _read_tensors(
    w_path: Path, args: ModelArgs, dtype: torch.dtype, where: str
) -> dict[tuple[int, str, str], torch.Tensor]:
    """Every tensor of the weights file, keyed (layer, target, "A" | "B"); none may be anything else."""
    from safetensors import safe_open

    raw: dict[tuple[int, str, str], torch.Tensor] = {}
    with safe_open(str(w_path), framework="pt", device="cpu") as f:
        for key in f.keys():
            m = _KEY.search(key)
            if m is None:
                raise ValueError(
                    f"{where}: tensor {key} is not a LoRA A/B weight of a supported target "
                    f"({', '.join(t + '_proj' for t in TARGETS)})"
                )
            layer, target, ab = int(m.group(1)), m.group(2), m.group(3)
            if layer >= args.num_layers:
                raise ValueError(
                    f"{where}: tensor {key} names layer {layer}; the model has {args.num_layers}"
                )
            raw[(layer, target, ab)] = f.get_tensor(key).to(dtype)
    if not raw:
        raise ValueError(f"{where}: {WEIGHTS_FILE} holds no LoRA weights")
    return raw


def _pair_weights(
    raw: dict[tuple[int, str, str], torch.Tensor], args: ModelArgs, rank: int, where: str
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(lora_A, lora_B) per (layer, target), each pair complete and shaped for this base model."""
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for layer, target, ab in sorted(raw):
        if ab != "A":
            continue
        a, b = raw[(layer, target, "A")], raw.get((layer, target, "B"))
        if b is None:
            raise ValueError(f"{where}: layer {layer} {target}_proj has lora_A but no lora_B")
        fan_in, fan_out = target_dims(args, target)
        if tuple(a.shape) != (rank, fan_in) or tuple(b.shape) != (fan_out, rank):
            raise ValueError(
                f"{where}: layer {layer} {target}_proj lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)}, "
                f"expected {(rank, fan_in)} / {(fan_out, rank)} (r={rank} on this base model)"
            )
        weights[(layer, target)] = (a.contiguous(), b.contiguous())
    orphans = [k for k in raw if k[2] == "B" and (k[0], k[1]) not in weights]
    if orphans:
        raise ValueError(f"{where}: layer {orphans[0][0]} {orphans[0][1]}_proj has lora_B but no lora_A")
    return weights


class LoraSlots:
    """`num_slots` adapters' worth of stacked weights on the device, written slot by slot.

    Per layer and site: a [num_slots, len(site) * rank, in], b [num_slots, len(site) * rank, out]
    (lora_B transposed, as `dispatch.lora_apply` takes it);
    scales [num_slots] float32. Only sites some adapter targets are allocated.
    """

    def __init__(
        self,
        args: ModelArgs,
        num_slots: int,
        rank: int,
        sites: tuple[str, ...],
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.args, self.num_slots, self.rank, self.sites = args, num_slots, rank, sites
        self.a: list[dict[str, torch.Tensor]] = []
        self.b: list[dict[str, torch.Tensor]] = []
        for _ in range(args.num_layers):
            la, lb = {}, {}
            for site in sites:
                parts = SITES[site]
                fan_in = target_dims(args, parts[0])[0]
                fan_out = sum(target_dims(args, t)[1] for t in parts)
                r = len(parts) * rank
                la[site] = torch.zeros(num_slots, r, fan_in, dtype=dtype, device=device)
                lb[site] = torch.zeros(num_slots, r, fan_out, dtype=dtype, device=device)
            self.a.append(la)
            self.b.append(lb)
        self.scales = torch.zeros(num_slots, dtype=torch.float32, device=device)

    @staticmethod
    def slot_bytes(args: ModelArgs, rank: int, sites: tuple[str, ...], dtype: torch.dtype) -> int:
        """Device bytes one slot takes (what each resident adapter costs, padding included)."""
        n = 0
        for site in sites:
            parts = SITES[site]
            fan_in = target_dims(args, parts[0])[0]
            fan_out = sum(target_dims(args, t)[1] for t in parts)
            n += len(parts) * rank * (fan_in + fan_out)
        return n * args.num_layers * dtype.itemsize

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for layer in self.a + self.b for t in layer.values()) + self.scales.nbytes

    def write(self, slot: int, adapter: Adapter) -> None:
        """Copy an adapter into a slot (overwriting whatever was there)."""
        R = self.rank
        for layer in range(self.args.num_layers):
            for site in self.sites:
                a, b = self.a[layer][site][slot], self.b[layer][site][slot]
                a.zero_()
                b.zero_()
                row = 0
                for j, t in enumerate(SITES[site]):
                    out = target_dims(self.args, t)[1]
                    w = adapter.weights.get((layer, t))
                    if w is not None:
                        wa, wb = w
                        r = wa.shape[0]
                        a[j * R : j * R + r].copy_(wa, non_blocking=True)
                        b[j * R : j * R + r, row : row + out].copy_(wb.T, non_blocking=True)
                    row += out
        self.scales[slot] = adapter.scaling


@dataclass
class LoraBatch:
    """This step's view: the slots, and each token's slot (-1 = base model)."""

    slots: LoraSlots
    token_slots: torch.Tensor  # [T] int32

    def apply(self, layer: int, site: str, x: torch.Tensor, out: torch.Tensor) -> None:
        """out [T, N] += the LoRA delta of x [T, K] for each token's adapter, in place."""
        if site in self.slots.sites:
            s = self.slots
            dispatch.lora_apply(out, x, s.a[layer][site], s.b[layer][site], s.scales, self.token_slots)
