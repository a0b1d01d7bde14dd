"""Shared pieces of the GPU timing scripts (bench/gpu/*.py): CUDA-event timing, the copy-bandwidth
roofline, the Llama-3-8B shape with random weights, and the script entry point.

Each timing script is one function `measure() -> dict` handed to `main`, which writes the dict as
JSON to the path given as the script's only argument (or prints it), with "skipped" set when no
CUDA device is visible and "error" set when the measurement raised, so the runner
(bench/gpu_check.py) can report every script whatever happened to the others.
"""

from __future__ import annotations

import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def cuda_missing() -> str | None:
    """Why CUDA timings cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch not installed"
    if not torch.cuda.is_available():
        return "no CUDA device visible (torch.cuda.is_available() is False)"
    return None


def time_cuda(fn: Callable[[], object], warmup: int = 3, reps: int = 20) -> float:
    """Median seconds of fn() with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy, bytes read + written per second: the roofline of memory-bound work."""
    import torch

    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    t = time_cuda(functools.partial(dst.copy_, src), warmup=3, reps=10)
    del src, dst  # free before the caller allocates
    torch.cuda.empty_cache()
    return 2 * nbytes / t


def bytes_per_step(cfg: dict[str, Any], batch: int, context: int, itemsize: int = 2) -> int:
    """Least HBM traffic of one decode step: every weight once (not the embedding table, of
    which only `batch` rows are read) plus each sequence's K and V cache."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    layers, v = cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    layer = h * (h + 2 * kv) + h * h + 3 * h * i + 2 * h
    weights = layers * layer + v * h + h
    kv_cache = batch * context * layers * 2 * kv
    return itemsize * (weights + kv_cache)


def dummy_model(out: Path, cfg: dict[str, Any]) -> Path:
    """A model directory with `cfg` as config.json and the tiny model's tokenizer (ids < 512), no
    weights: load it with load_format="dummy"."""
    from modeldeploy.runtime.tiny_model import make_tiny_model

    d = make_tiny_model(out, "llama", seed=0)
    for f in d.glob("*.safetensors*"):
        f.unlink()
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


def error_fields(e: BaseException) -> dict[str, str]:
    return {"error": f"{type(e).__name__}: {e}"[:500], "trace": traceback.format_exc()[-3000:]}


def main(measure: Callable[[], dict[str, Any]], argv: list[str] | None = None) -> int:
    """Run `measure` unless CUDA is missing; write its dict (plus wall_s) to argv[0] or stdout."""
    argv = sys.argv[1:] if argv is None else argv
    t0 = time.time()
    reason = cuda_missing()
    if reason:
        data: dict[str, Any] = {"skipped": reason}
    else:
        try:
            data = measure()
        except Exception as e:  # recorded: the runner reports it next to the other scripts' figures
            data = error_fields(e)
    data["wall_s"] = round(time.time() - t0, 1)
    text = json.dumps(data, indent=1, default=str)
    if argv:
        Path(argv[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(argv[0]).write_text(text)
        status = f"skipped: {data['skipped']}" if "skipped" in data else data.get("error", "ok")
        print(f"[{Path(argv[0]).stem}] {data['wall_s']}s {status}")
    else:
        print(text)
    return 0
