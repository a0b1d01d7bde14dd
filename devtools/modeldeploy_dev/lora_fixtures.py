"""Two LoRA adapters per tiny model, made with `peft` at test time (random A and B, so each
adapter really changes the output; PEFT's default init makes B zero, i.e. the base model).

A: r=4, alpha=16 on q/v/down (alpha / r scaling). B: r=8, alpha=8 with rsLoRA
(alpha / sqrt(r)) on all seven projections. Different ranks and targets on purpose: the
runtime pads ranks and stacks targets per fused site.
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
    peft_model.save_pretrained(out_dir)
    return out_dir


def make_adapters(base_dir: Path, out_root: Path) -> dict[str, Path]:
    """name -> adapter directory, for each of ADAPTERS."""
    return {
        name: make_adapter(base_dir, out_root / name, seed=1 + i, **cfg)
        for i, (name, cfg) in enumerate(ADAPTERS.items())
    }


def hf_greedy(
    base_dir: Path, adapter_dir: Path | None, prompts: list[list[int]], max_new: int
) -> list[list[int]]:
    """transformers (+ peft when an adapter is given) greedy continuations."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new)
            outs.append(g[0, len(ids) :].tolist())
    return outs
