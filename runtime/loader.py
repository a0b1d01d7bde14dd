"""Load a pinned model directory: verify digests, read the config, the tokenizer and
the weights (single or sharded safetensors), or make dummy weights for benchmarks.

transformers is used only here, and only to read configs and tokenizers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from modeldeploy.digest import dir_digest, verify
from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.models.llama import ModelArgs, expected_weight_shapes

Progress = Callable[[str, float], None]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Loaded:
    args: ModelArgs
    weights: dict[str, torch.Tensor]
    tokenizer: object
    dtype: torch.dtype
    device: torch.device
    max_model_len: int
    model_digest: str
    tokenizer_digest: str
    eos_token_ids: list[int]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but CUDA is not available")
    return torch.device(name)


def resolve_dtype(name: str, hf_config, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    cfg_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(cfg_dtype, str):
        cfg_dtype = _DTYPES.get(cfg_dtype)
    return cfg_dtype if cfg_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


def load(config: EngineConfig, progress: Progress = lambda phase, frac: None) -> Loaded:
    from transformers import AutoConfig, AutoTokenizer

    model_dir = Path(config.model)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"model: {model_dir} has no config.json (expected a Hugging Face model directory)")
    tok_dir = Path(config.tokenizer or config.model)
    progress("verifying", 0.0)
    if config.model_digest:
        verify(model_dir, config.model_digest)
    if config.tokenizer_digest:
        verify(tok_dir, config.tokenizer_digest)
    model_digest = config.model_digest or dir_digest(model_dir)
    tokenizer_digest = config.tokenizer_digest or (
        model_digest if tok_dir == model_dir else dir_digest(tok_dir)
    )

    hf = AutoConfig.from_pretrained(model_dir)
    args = ModelArgs.from_hf(hf)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, hf, device)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    max_len = config.max_model_len or args.max_position_embeddings
    if args.sliding_window:
        max_len = min(max_len, args.sliding_window)
    if max_len > args.max_position_embeddings:
        raise ValueError(
            f"max_model_len: {max_len} exceeds the model's max_position_embeddings "
            f"{args.max_position_embeddings}"
        )

    progress("loading weights", 0.05)
    if config.load_format == "dummy":
        weights = _dummy_weights(args, dtype, device, config.seed)
    else:
        weights = _read_safetensors(model_dir, args, dtype, device, progress)
    eos = getattr(hf, "eos_token_id", None)
    gen_cfg = model_dir / "generation_config.json"
    if gen_cfg.is_file():
        import json

        eos = json.loads(gen_cfg.read_text()).get("eos_token_id", eos)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    return Loaded(args, weights, tokenizer, dtype, device, max_len, model_digest, tokenizer_digest, eos_ids)


def _read_safetensors(
    model_dir: Path, args: ModelArgs, dtype: torch.dtype, device: torch.device, progress: Progress
) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors files in {model_dir}")
    want = expected_weight_shapes(args)
    weights: dict[str, torch.Tensor] = {}
    for i, path in enumerate(files):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name in want:
                    weights[name] = f.get_tensor(name).to(device=device, dtype=dtype)
        progress("loading weights", 0.05 + 0.85 * (i + 1) / len(files))
    missing = [n for n in want if n not in weights]
    if missing:
        raise ValueError(
            f"model: weights missing from {model_dir}: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    for name, shape in want.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(
                f"model: weight {name} has shape {tuple(weights[name].shape)}, config implies {shape}"
            )
    return weights


def _dummy_weights(
    args: ModelArgs, dtype: torch.dtype, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in expected_weight_shapes(args).items():
        if len(shape) == 1:
            out[name] = (
                torch.ones(shape, dtype=dtype, device=device)
                if "norm" in name
                else torch.zeros(shape, dtype=dtype, device=device)
            )
        else:
            out[name] = (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02).to(
                dtype
            )
    return out
