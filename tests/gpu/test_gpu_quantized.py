"""Quantized weights on CUDA: the CuPy int4/int8 kernels (kernels/cuda/quant.cu through
kernels/quant_cuda.py) against float64 and the torch twin (de-quantize, then torch's GEMM) on the
device. Checked here:
- each GGUF format kept quantized, through dispatch, multiplies like float64 on its de-quantized
  weight (float32 and bfloat16 activations), and the kernels (not the twin) ran;
- the GEMV path (rows 1, 3, 8, 16; 17 and 32 with the row threshold raised) and the long-chunk path
  (de-quantize kernel + torch GEMM, 300 rows) for float32, float16 and bfloat16, with bias, against
  float64 and the twin; the de-quantize kernel equals `QuantLinear.dequantize(dtype)` bit for bit;
- 8B layer shapes (o 4096 x 4096 and gate_up 28672 x 4096 at 4-bit, down 4096 x 14336 at 8-bit) at
  decode batches 1/8/16, bf16;
- a tiny llama written as a GGUF file (every kept format, llama.cpp's q/k permutation, one
  de-quantized Q5_0 tensor) decodes greedily on CUDA, through the kernels, to the same tokens as the
  float32 directory of its de-quantized weights served on CUDA.
The same .cu text runs on the CPU emulator in CI (tests/kernels/test_kernels_quant_emulated.py); these
tests are what a lent GPU adds: the real compiler, memory model and warp scheduling.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

_SHARED = Path(__file__).parents[1] / "runtime" / "models" / "test_quantized.py"
_spec = importlib.util.spec_from_file_location("test_quantized", _SHARED)
assert _spec is not None and _spec.loader is not None
tq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tq)  # the CPU tests' GGUF writer and block makers, shared

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
# max |out - ref| / max |ref| against float64 on the exact float32 weights: the kernels keep the weight
# in float32 (fp16/bf16 only round x, which the reference shares, and the output)
TOL64 = {f32: 1e-5, f16: 1e-3, bf16: 8e-3}
TOL_TWIN = {f32: 2e-3, f16: 2e-3, bf16: 1.6e-2}  # the twin may run TF32 and rounds the weight to fp16/bf16


def weight(fmt: str, n: int, k: int, seed: int = 3):
    from modeldeploy.kernels import quant

    rng = np.random.default_rng(seed)
    return quant.from_gguf(fmt, tq.blocks(fmt, rng.standard_normal((n, k)).astype(np.float32) * 0.05, rng), k)


def errors(out: torch.Tensor, x: torch.Tensor, w, bias=None) -> tuple[float, float]:
    """(error against float64, against the twin), both relative to max |reference|."""
    from modeldeploy.kernels import quant

    ref = x.double() @ w.dequantize().double().T
    if bias is not None:
        ref = ref + bias.double()
    twin = quant.linear(x, w, bias)
    scale = ref.abs().max().item()
    assert torch.isfinite(out).all()
    return (out.double() - ref).abs().max().item() / scale, (
        out.double() - twin.double()
    ).abs().max().item() / scale


@pytest.mark.parametrize("fmt", tq.KEPT)
@pytest.mark.parametrize("dtype", [f32, bf16], ids=["f32", "bf16"])
def test_quantized_linear_on_cuda_matches_float64(fmt, dtype, launches):
    from modeldeploy.kernels import dispatch

    n, k = 384, 1024
    w = weight(fmt, n, k)
    wd = w.to("cuda")
    assert wd.device.type == "cuda" and wd.nbytes == w.nbytes
    assert torch.equal(wd.dequantize().cpu(), w.dequantize())  # the rebuild is exact on the device too
    for rows in (1, 16, 300):
        x = torch.randn(rows, k)
        ref = x.double() @ w.dequantize().double().T
        out = dispatch.linear(x.to("cuda", dtype), wd)
        assert out.dtype == dtype and out.is_cuda
        err = (out.double().cpu() - ref).abs().max().item() / ref.abs().max().item()
        # float32 may run TF32 in the long-chunk GEMM; bfloat16 rounds x and the weight to 8 bits
        assert err <= (2e-3 if dtype == torch.float32 else 2e-2), (rows, err)
    assert launches.get("quant_gemv_kernel") == 2 and launches.get("quant_dequant_kernel") == 1
    assert dispatch.describe("cuda")["quantized_linear"].startswith("cuda")
    ids = torch.tensor([0, 5, 383], device="cuda")
    assert torch.equal(wd.rows(ids).cpu(), w.dequantize()[ids.cpu()])


@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("fmt", tq.KEPT)
def test_kernel_paths_match_float64_and_twin(fmt, dtype, launches, monkeypatch):
    from modeldeploy.kernels import quant_cuda

    n, k = 333, 1280  # N odd, K = a 1024-weight chunk + 8 groups
    w = weight(fmt, n, k, seed=7).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    bias = torch.randn(n, device="cuda", generator=g).to(dtype)
    for rows in (1, 3, 8, 16, 300):
        x = torch.randn(rows, k, device="cuda", generator=g).to(dtype)
        e64, etwin = errors(quant_cuda.linear(x, w, bias), x, w, bias)
        # past the GEMV: torch's GEMM on the weight rounded to x's dtype (TF32, fp16 reductions allowed)
        tol64 = TOL64[dtype] if rows <= quant_cuda.GEMV_MAX_ROWS else TOL_TWIN[dtype]
        assert e64 <= tol64 and etwin <= TOL_TWIN[dtype], (rows, e64, etwin)
    monkeypatch.setattr(quant_cuda, "GEMV_MAX_ROWS", 64)
    for rows in (17, 32):  # the GEMV past its default threshold: several row tiles, one ragged
        x = torch.randn(rows, k, device="cuda", generator=g).to(dtype)
        e64, etwin = errors(quant_cuda.linear(x, w), x, w)
        assert e64 <= TOL64[dtype] and etwin <= TOL_TWIN[dtype], (rows, e64, etwin)
    assert launches == {"quant_gemv_kernel": 6, "quant_dequant_kernel": 1}
    assert torch.equal(quant_cuda.dequantize(w, dtype), w.dequantize(dtype))


def random_weight(bits: int, n: int, k: int):
    """Random bytes in QuantLinear's layout, made on the device (quantizing 58 M weights with gguf-py
    takes seconds; every byte value is as valid as a real file's)."""
    from modeldeploy.kernels.quant import GROUP, QuantLinear

    g = torch.Generator(device="cuda").manual_seed(n + k)
    lo, hi = (0, 256) if bits == 4 else (-128, 128)
    q = torch.randint(lo, hi, (n, k * bits // 8), generator=g, device="cuda", dtype=torch.int16)
    scales = torch.rand(n, k // GROUP, generator=g, device="cuda") * 1e-3 + 1e-4
    zeros = -torch.rand(n, k // GROUP, generator=g, device="cuda") * 1e-2 if bits == 4 else None
    return QuantLinear(q.to(torch.uint8 if bits == 4 else torch.int8), scales, zeros, f"Q{bits}")


@pytest.mark.parametrize("bits,n,k", [(4, 4096, 4096), (4, 28672, 4096), (8, 4096, 14336)], ids=str)
def test_8b_shapes_at_decode_batches(bits, n, k, launches):
    from modeldeploy.kernels import quant_cuda

    w = random_weight(bits, n, k)
    for rows in (1, 8, 16):
        x = torch.randn(rows, k, device="cuda").to(bf16)
        e64, etwin = errors(quant_cuda.linear(x, w), x, w)
        assert e64 <= TOL64[bf16] and etwin <= TOL_TWIN[bf16], (rows, e64, etwin)
    assert launches == {"quant_gemv_kernel": 3}


def test_tiny_gguf_greedy_on_cuda_equals_its_dequantized_float32_model(tiny_model, tmp_path, launches):
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
    assert runs["gguf"][1]["kernels"]["quantized_linear"].startswith("cuda")
    assert launches.get("quant_gemv_kernel"), launches  # decode steps ran the GEMV
