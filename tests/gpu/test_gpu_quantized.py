"""Quantized weights on CUDA (kernels/quant.py): the torch twin (de-quantize, then torch's GEMM) is
the CUDA path today; no CuPy int4/int8 GEMM kernel exists yet. Checked here: each GGUF format kept
quantized multiplies on the device like float64 on its de-quantized weight (float32 and bfloat16
activations), and a tiny llama written as a GGUF file (every kept format, llama.cpp's q/k
permutation, one de-quantized Q5_0 tensor) decodes greedily on CUDA to the same tokens as the
float32 directory of its de-quantized weights served on CUDA.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

_SHARED = Path(__file__).parents[1] / "test_quantized.py"
_spec = importlib.util.spec_from_file_location("test_quantized", _SHARED)
assert _spec is not None and _spec.loader is not None
tq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tq)  # the CPU tests' GGUF writer and block makers, shared


@pytest.mark.parametrize("fmt", tq.KEPT)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_quantized_linear_on_cuda_matches_float64(fmt, dtype):
    from modeldeploy.kernels import dispatch, quant

    rng = np.random.default_rng(3)
    n, k = 384, 1024
    w = quant.from_gguf(fmt, tq.blocks(fmt, rng.standard_normal((n, k)).astype(np.float32) * 0.05, rng), k)
    wd = w.to("cuda")
    assert wd.device.type == "cuda" and wd.nbytes == w.nbytes
    assert torch.equal(wd.dequantize().cpu(), w.dequantize())  # the rebuild is exact on the device too
    for rows in (1, 16, 300):
        x = torch.randn(rows, k)
        ref = x.double() @ w.dequantize().double().T
        out = dispatch.linear(x.to("cuda", dtype), wd)
        assert out.dtype == dtype and out.is_cuda
        err = (out.double().cpu() - ref).abs().max().item() / ref.abs().max().item()
        # float32 may run TF32 when torch allows it; bfloat16 rounds x and the weight to 8 bits
        assert err <= (2e-3 if dtype == torch.float32 else 2e-2), (rows, err)
    ids = torch.tensor([0, 5, 383], device="cuda")
    assert torch.equal(wd.rows(ids).cpu(), w.dequantize()[ids.cpu()])


def test_tiny_gguf_greedy_on_cuda_equals_its_dequantized_float32_model(tiny_model, tmp_path):
    from modeldeploy.runtime import LLM, SamplingParams

    hf_dir = tiny_model("llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2)
    (tmp_path / "gguf").mkdir()
    tq.write_tiny_gguf(hf_dir, tmp_path / "gguf" / "tiny.gguf", tmp_path / "ref", tq.LAYER_FORMATS)
    params = SamplingParams(temperature=0.0, max_tokens=24, min_tokens=24)
    runs = {}
    for name, d in (("gguf", tmp_path / "gguf"), ("ref", tmp_path / "ref")):
        llm = LLM(str(d), tokenizer=str(hf_dir), dtype="float32", device="cuda", max_model_len=256)
        try:
            runs[name] = ([o.token_ids for o in llm.generate(tq.PROMPTS, params)], llm.engine.info())
        finally:
            llm.engine.close()
    assert runs["gguf"][0] == runs["ref"][0]
    assert runs["gguf"][1]["quantization"]["kept_quantized"] == {"Q4_0": 2, "Q4_1": 5, "Q4_K": 5, "Q8_0": 3}
