"""LoRA adapters for tests and benches, with random A and B so each adapter really changes the
output (PEFT's default init makes B zero, i.e. the base model).

Two adapters per tiny model made with `peft` (`make_adapters`, `ADAPTERS`):

A: r=4, alpha=16 on q/v/down (alpha / r scaling). B: r=8, alpha=8 with rsLoRA
(alpha / sqrt(r)) on all seven projections. Different ranks and targets on purpose: the
runtime pads ranks and stacks targets per fused site.

Without peft (the GPU machine has none): `write_lora` writes a PEFT-format adapter on all seven
projections, and `merged_model` folds it into a copy of the base model, the reference a LoRA
engine's output must equal.
"""

from __future__ import annotations

from pathlib import Path

ADAPTERS = {
    "tenant-a": dict(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]),
    "tenant-b": dict(
        r=8,
        lora_alpha=8,
        use_rslora=True,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
}


def make_adapter(base_dir: Path, out_dir: Path, seed: int, **lora) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(init_lora_weights=False, **lora))
    peft_model.save_pretrained(str(out_dir))
    return out_dir


def make_adapters(base_dir: Path, out_root: Path) -> dict[str, Path]:
    """name -> adapter directory, for each of ADAPTERS."""
    return {
        name: make_adapter(base_dir, out_root / name, seed=1 + i, **cfg)
        for i, (name, cfg) in enumerate(ADAPTERS.items())
    }


def hf_greedy(
    base_dir: Path,
    adapter_dir: Path | None,
    prompts: list[list[int]],
    max_new: int,
    device: str = "cpu",
) -> list[list[int]]:
    """transformers (+ peft when an adapter is given) greedy continuations, float32 on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    # transformers' own annotations reject its own model type here (the `to` wrapper's and
    # GenerationMixin.generate's `self` types), so the two calls below carry pyright ignores
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = model.to(device)  # pyright: ignore[reportArgumentType]
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids], device=device)
            g = model.generate(  # pyright: ignore[reportAttributeAccessIssue]
                x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new
            )
            outs.append(g[0, len(ids) :].tolist())
    return outs


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def write_lora(out: Path, cfg, rank: int, alpha: float, seed: int, dtype, scale: float = 0.05) -> dict:
    """A PEFT-format adapter (random A and B on all seven projections) of the model `cfg` describes
    (a transformers config or the runtime's ModelArgs), written without peft; returns
    {(layer, target): (A, B)} in float32 for `merged_model`."""
    import json

    import torch
    from safetensors.torch import save_file

    from modeldeploy.runtime.models.llama import ModelArgs
    from modeldeploy.runtime.models.lora import target_dims

    args = cfg if isinstance(cfg, ModelArgs) else ModelArgs.from_hf(cfg)
    g = torch.Generator().manual_seed(seed)
    tensors, mats = {}, {}
    for i in range(args.num_layers):
        for t in LORA_TARGETS:
            fan_in, fan_out = target_dims(args, t)
            a = torch.randn(rank, fan_in, generator=g) * scale
            b = torch.randn(fan_out, rank, generator=g) * scale
            part = "self_attn" if t in ("q", "k", "v", "o") else "mlp"
            key = f"base_model.model.model.layers.{i}.{part}.{t}_proj"
            tensors[key + ".lora_A.weight"] = a.to(dtype).contiguous()
            tensors[key + ".lora_B.weight"] = b.to(dtype).contiguous()
            mats[(i, t)] = (a, b)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    targets = [f"{t}_proj" for t in LORA_TARGETS]
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets}
    (out / "adapter_config.json").write_text(json.dumps(config))
    return mats


def merged_model(base: Path, out: Path, mats: dict, scaling: float) -> Path:
    """A copy of the base model with W + scaling * B @ A folded in: the reference for an adapter."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(base, out)
    path = next(out.glob("*.safetensors"))
    w = load_file(str(path))
    for (i, t), (a, b) in mats.items():
        part = "self_attn" if t in ("q", "k", "v", "o") else "mlp"
        key = f"model.layers.{i}.{part}.{t}_proj.weight"
        w[key] = (w[key].double() + scaling * (b.double() @ a.double())).to(w[key].dtype)
    save_file(w, str(path), metadata={"format": "pt"})
    return out
