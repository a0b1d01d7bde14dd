"""Load a pinned model directory: verify digests, read the config, the tokenizer and
the weights (single or sharded safetensors, or one GGUF file), or make dummy weights for benchmarks.

transformers is used only here, and only to read configs and tokenizers.

A directory holding one `*.gguf` file and no config.json is served as llama.cpp users serve it:
config and tokenizer (chat template included) from the file's metadata through transformers'
`gguf_file=` support, weights read with the `gguf` package's GGUFReader (gguf_import.py), the
Q4_0/Q4_1/Q4_K/Q8_0 GEMM weights and embedding kept quantized (`kernels.quant.QuantLinear`).
The digest covers the .gguf file like any other file.

A directory whose config.json has a GPTQ or AWQ `quantization_config` (4-bit) keeps its GEMM
weights quantized too (int4_checkpoint.py); one rank, like GGUF.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modeldeploy.digest import dir_digest, verify
from modeldeploy.kernels.quant import QuantLinear
from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.int4_checkpoint import read_int4_weights, served_config
from modeldeploy.runtime.models.llama import ModelArgs, expected_weight_shapes
from modeldeploy.runtime.models.shard import Shard

Progress = Callable[[str, float], None]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Loaded:
    args: ModelArgs
    weights: dict[str, torch.Tensor | QuantLinear]
    tokenizer: Any  # a Hugging Face tokenizer
    dtype: torch.dtype
    device: torch.device
    max_model_len: int
    model_digest: str
    tokenizer_digest: str
    eos_token_ids: list[int]
    shard: Shard = Shard()
    # what a GGUF model keeps quantized and what it de-quantized (gguf_import.GGUFWeights.summary),
    # or a GPTQ/AWQ model's format, bits and group size (int4_checkpoint.Int4Weights.summary);
    # None for a float model directory
    quantization: dict[str, Any] | None = None

    @property
    def rank_args(self) -> ModelArgs:
        """The shapes this rank's layers and KV cache have (the whole model when not parallel)."""
        return self.shard.rank_args(self.args) if self.shard.parallel else self.args


def resolve_device(name: str, shard: Shard = Shard()) -> torch.device:
    """The device this rank runs on: under tensor parallelism on cuda, GPU `rank` (one GPU per rank)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but CUDA is not available")
    if name == "cuda" and shard.parallel:
        if torch.cuda.device_count() < shard.size:
            raise ValueError(
                f"tensor_parallel_size: {shard.size} ranks need {shard.size} GPUs, "
                f"{torch.cuda.device_count()} visible"
            )
        return torch.device("cuda", shard.rank)
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


def load(
    config: EngineConfig,
    progress: Progress = lambda phase, frac: None,
    before_weights: Callable[[ModelArgs, torch.device], None] = lambda args, device: None,
) -> Loaded:
    """Rank 0's load: digests, config, tokenizer, then its weights (its shard under tensor
    parallelism). `before_weights` runs once the config is validated, before any weight is read:
    the engine starts the other ranks there, so they read their shards while rank 0 reads its own."""
    from transformers import AutoTokenizer

    model_dir = Path(config.model)
    gguf = gguf_file(model_dir)
    if gguf is None and not (model_dir / "config.json").is_file():
        raise ValueError(
            f"model: {model_dir} has no config.json (expected a Hugging Face model directory) "
            "and no .gguf file"
        )
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

    if gguf is not None:
        return _load_gguf(config, gguf, tok_dir, model_digest, tokenizer_digest, progress)
    hf = hf_config(model_dir, config.hf_overrides)
    int4 = served_config(model_dir, config.tensor_parallel_size, config.load_format)  # GPTQ/AWQ, or None
    shard = Shard(0, config.tensor_parallel_size)
    args, device, dtype, max_len = _model_setup(config, hf, shard)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    before_weights(args, device)
    progress("loading weights", 0.05)
    quantization = None
    if int4 is not None:
        read = read_int4_weights(model_dir, args, dtype, int4, progress)
        weights: dict[str, torch.Tensor | QuantLinear] = {k: v.to(device) for k, v in read.weights.items()}
        quantization = read.summary()
    else:
        weights = dict(load_weights(config, args, dtype, device, shard, progress))
    eos = getattr(hf, "eos_token_id", None)
    gen_cfg = model_dir / "generation_config.json"
    if gen_cfg.is_file():
        import json

        eos = json.loads(gen_cfg.read_text()).get("eos_token_id", eos)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    return Loaded(
        args,
        weights,
        tokenizer,
        dtype,
        device,
        max_len,
        model_digest,
        tokenizer_digest,
        eos_ids,
        shard,
        quantization=quantization,
    )


def gguf_file(model_dir: Path) -> Path | None:
    """The GGUF file a model directory is served from: its one `*.gguf` when it has no config.json
    (a directory with config.json is a Hugging Face one, whatever else it holds)."""
    if (model_dir / "config.json").is_file() or not model_dir.is_dir():
        return None
    found = sorted(model_dir.glob("*.gguf"))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ValueError(
            f"model: {model_dir} holds {len(found)} .gguf files ({names}); serve one per directory"
        )
    return found[0] if found else None


def load_tokenizer(tok_dir: Path) -> Any:
    """The tokenizer of a directory: a Hugging Face one, or, for a GGUF model directory, the one in
    the file's metadata (chat template included). The server process reads it this way too."""
    from transformers import AutoTokenizer

    gguf = gguf_file(tok_dir)
    if gguf is not None:
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return AutoTokenizer.from_pretrained(tok_dir)


def _load_gguf(
    config: EngineConfig,
    path: Path,
    tok_dir: Path,
    model_digest: str,
    tokenizer_digest: str,
    progress: Progress,
) -> Loaded:
    """A GGUF model directory: config and tokenizer from the file's metadata (transformers), the
    weights through gguf_import.read_gguf_weights, quantized ones kept so. One rank: the quantized
    GEMMs are not sharded (tensor_parallel_size > 1 is refused)."""
    from transformers import AutoConfig

    from modeldeploy.runtime.gguf_import import ARCHITECTURES, open_gguf, read_gguf_weights

    if config.tensor_parallel_size > 1:
        raise ValueError(
            f"tensor_parallel_size: {config.tensor_parallel_size}; a GGUF model is served on one rank "
            "(import it with `modeldeploy model import-gguf` to shard the float weights)"
        )
    if config.hf_overrides:
        raise ValueError(
            "hf_overrides: not applied to a GGUF model directory (its config is the file's metadata); "
            "import it with `modeldeploy model import-gguf` to override config fields"
        )
    if config.load_format == "dummy":
        raise ValueError("load_format: 'dummy' needs a Hugging Face model directory, not a GGUF file")
    reader, arch = open_gguf(path)
    if arch not in ARCHITECTURES:
        served = ", ".join(sorted(ARCHITECTURES))
        raise ValueError(f"model: {path} has architecture {arch!r}; served: {served}")
    d, name = str(path.parent), path.name
    hf = AutoConfig.from_pretrained(d, gguf_file=name)
    hf.architectures = [ARCHITECTURES[arch]]
    args, device, dtype, max_len = _model_setup(config, hf, Shard())
    tokenizer = load_tokenizer(tok_dir)
    progress("loading weights", 0.05)
    read = read_gguf_weights(path, args, dtype, arch, reader)
    del reader  # its memory map: the weights are copies
    weights = {k: v.to(device) for k, v in read.weights.items()}
    progress("loading weights", 0.9)
    eos = getattr(hf, "eos_token_id", None)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    return Loaded(
        args,
        weights,
        tokenizer,
        dtype,
        device,
        max_len,
        model_digest,
        tokenizer_digest,
        eos_ids,
        Shard(),
        quantization=read.summary(),
    )


def hf_config(model_dir: Path, overrides: dict[str, Any]) -> Any:
    """The model's transformers config with `overrides` applied (vLLM's hf_overrides): nested
    objects merge into the config's own, and `rope_theta` lands in `rope_parameters` where the
    config keeps it there (transformers 5), so the override reaches the forward instead of being
    shadowed. A name that is neither in config.json nor a field of the model type is refused:
    a typo must not serve the unchanged model under a new bundle id."""
    import json

    from transformers import AutoConfig

    if not overrides:
        return AutoConfig.from_pretrained(model_dir)
    d = json.loads((model_dir / "config.json").read_text())
    model_type = d.pop("model_type", None)
    if not model_type:
        raise ValueError(f"hf_overrides: {model_dir}/config.json has no model_type to apply them to")
    known = set(d) | set(AutoConfig.for_model(model_type).to_dict()) | {"rope_theta"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"hf_overrides: {', '.join(unknown)} is not a field of the {model_type} config")
    for key, value in overrides.items():
        if key == "rope_theta" and isinstance(d.get("rope_parameters"), dict):
            d["rope_parameters"] = {**d["rope_parameters"], "rope_theta": value}
        elif isinstance(value, dict) and isinstance(d.get(key), dict):
            d[key] = {**d[key], **value}
        else:
            d[key] = value
    return AutoConfig.for_model(model_type, **d)


def load_shard(config: EngineConfig, shard: Shard, progress: Progress = lambda p, f: None) -> Loaded:
    """A worker rank's load: config and its own weight slices only (rank 0 verified the digests and
    holds the tokenizer)."""
    hf = hf_config(Path(config.model), config.hf_overrides)
    args, device, dtype, max_len = _model_setup(config, hf, shard)
    weights: dict[str, torch.Tensor | QuantLinear] = dict(
        load_weights(config, args, dtype, device, shard, progress)
    )
    return Loaded(args, weights, None, dtype, device, max_len, "", "", [], shard)


def _model_setup(config: EngineConfig, hf, shard: Shard) -> tuple[ModelArgs, torch.device, torch.dtype, int]:
    args = ModelArgs.from_hf(hf)
    if shard.parallel:
        shard.check(args)
    device = resolve_device(config.device, shard)
    dtype = resolve_dtype(config.dtype, hf, device)
    # the model's longest context: max_position_embeddings, scaled by its RoPE scaling where that
    # extends it (models/rope.py `max_length`: linear and dynamic x factor, yarn original x factor)
    bound, derived = args.max_length()
    max_len = config.max_model_len or bound
    if args.sliding_window:
        max_len = min(max_len, args.sliding_window)
    if max_len > bound:
        raise ValueError(f"max_model_len: {max_len} exceeds the model's maximum length {bound} ({derived})")
    return args, device, dtype, max_len


def load_weights(
    config: EngineConfig,
    args: ModelArgs,
    dtype: torch.dtype,
    device: torch.device,
    shard: Shard,
    progress: Progress = lambda p, f: None,
) -> dict[str, torch.Tensor]:
    if config.load_format == "dummy":
        return _dummy_weights(args, dtype, device, config.seed, shard)
    return _read_safetensors(Path(config.model), args, dtype, device, progress, shard)


def _read_safetensors(
    model_dir: Path,
    args: ModelArgs,
    dtype: torch.dtype,
    device: torch.device,
    progress: Progress,
    shard: Shard = Shard(),
) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors files in {model_dir}")
    want = {n: s for n, s in expected_weight_shapes(args).items() if shard.wants(n)}
    weights: dict[str, torch.Tensor] = {}
    for i, path in enumerate(files):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name not in want:
                    continue
                part = f.get_slice(name)  # reads only the rows or columns this rank holds
                shape = tuple(part.get_shape())
                if shape != want[name]:
                    raise ValueError(f"model: weight {name} has shape {shape}, config implies {want[name]}")
                weights[name] = _take(part, shard.slice_of(name, args)).to(device=device, dtype=dtype)
        progress("loading weights", 0.05 + 0.85 * (i + 1) / len(files))
    missing = [n for n in want if n not in weights]
    if missing:
        raise ValueError(
            f"model: weights missing from {model_dir}: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    return weights


def _take(part, spec: tuple[int, int, int] | None) -> torch.Tensor:
    """A safetensors slice (or a tensor) cut to `spec` = (dim, start, stop); whole when None."""
    if spec is None:
        return part[:]
    dim, start, stop = spec
    cut = part[start:stop] if dim == 0 else part[:, start:stop]
    return cut.clone() if isinstance(part, torch.Tensor) else cut.contiguous()  # never a view of the whole


def _dummy_weights(
    args: ModelArgs, dtype: torch.dtype, device: torch.device, seed: int, shard: Shard = Shard()
) -> dict[str, torch.Tensor]:
    """Random weights from one seeded stream, the same on every rank: each draws every tensor whole
    (one at a time, on the CPU) and keeps its slice, so TP=N equals TP=1 for benchmarks too."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_weight_shapes(args).items():
        if len(shape) == 1:
            full = torch.ones(shape) if "norm" in name else torch.zeros(shape)
        else:
            full = torch.randn(shape, generator=gen, dtype=torch.float32) * 0.02
        if shard.wants(name):
            out[name] = _take(full, shard.slice_of(name, args)).to(device=device, dtype=dtype)
    return out
