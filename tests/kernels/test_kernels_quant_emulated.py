"""The CUDA int4/int8 weight-only GEMM (kernels/cuda/quant.cu through kernels/quant_cuda.py), run on
the CPU through `modeldeploy_dev.kernel_emulate` (the exact .cu text, g++, one host thread per CUDA
thread) with the wrapper unchanged and only its `launch` patched.

Checked for every GGUF format kept quantized (Q4_0, Q4_1, Q4_K, Q8_0) and every activation dtype:
- the GEMV path (rows 1, 3, 17 with the row threshold raised; 8 and 9 around a ROWS tile) against
  float64 on the de-quantized weight and against the torch twin, with K not a multiple of the
  1024-weight chunk, N odd and not a multiple of a block's 32 columns, with and without bias;
- the de-quantize kernel (the long-chunk path) equal to `QuantLinear.dequantize(dtype)` bit for bit;
- the routing: dispatch sends CUDA tensors to the kernel, the wrapper sends what it does not cover
  to the twin without launching.
Nothing GPU-specific (speed, coalescing, the memory model) is checked here: tests/gpu and
bench/gpu/quant.py do that where a GPU is lent.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from modeldeploy.kernels import dispatch, quant, quant_cuda
from modeldeploy.kernels.quant import QuantLinear
from modeldeploy_dev import kernel_emulate as emulate

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason="g++ not found: cannot emulate CUDA on the CPU"
)
gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants as gq  # noqa: E402

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
# Relative error (max |out - ref| / max |ref|) against float64 on the exact float32 weights: float32
# differs by summation order only; fp16/bf16 by the rounding of the output (x is rounded already).
TOL64 = {f32: 2e-6, f16: 1e-3, bf16: 8e-3}
# Against the twin, which also rounds the weight to fp16/bf16 before its GEMM.
TOL_TWIN = {f32: 2e-6, f16: 2e-3, bf16: 1.6e-2}


def make_weight(fmt: str, n: int, k: int, seed: int) -> QuantLinear:
    """Real GGUF blocks: gguf-py's quantizer for Q4_0/Q4_1/Q8_0; random blocks for Q4_K (gguf-py has
    no Q4_K quantizer) with every nibble and 6-bit scale value possible."""
    rng = np.random.default_rng(seed)
    if fmt == "Q4_K":
        b = rng.integers(0, 256, size=(n, k // 256, 144), dtype=np.uint8)
        b[..., 0:4] = (rng.random((n, k // 256, 2)) * 4e-4 + 1e-4).astype(np.float16).view(np.uint8)
        data = b.reshape(n, -1)
    else:
        data = gq.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, QT[fmt])
    return quant.from_gguf(fmt, data, k)


@pytest.fixture(autouse=True)
def emulated(monkeypatch):
    launches: list[str] = []

    def record(*a, **k):
        launches.append(a[1])
        emulate.launch(*a, **k)

    monkeypatch.setattr(quant_cuda, "launch", record)
    monkeypatch.setattr(quant_cuda, "_sm_count", lambda device: 1)  # a 1-SM "GPU": 8 warps per block
    return launches


def check(x: torch.Tensor, w: QuantLinear, bias: torch.Tensor | None = None) -> None:
    out = quant_cuda.linear(x, w, bias)
    assert out.dtype == x.dtype and out.shape == (*x.shape[:-1], w.out_features)
    ref = x.double() @ w.dequantize().double().T  # float32 weights are exact: float64 is the truth
    if bias is not None:
        ref = ref + bias.double()
    scale = max(ref.abs().max().item(), 1e-30)
    assert torch.isfinite(out).all()
    err64 = (out.double() - ref).abs().max().item() / scale
    assert err64 <= TOL64[x.dtype], ("float64", err64)
    twin = quant.linear(x, w, bias)
    err_twin = (out.double() - twin.double()).abs().max().item() / scale
    assert err_twin <= TOL_TWIN[x.dtype], ("twin", err_twin)


# (format, N, K): ragged everywhere: K = 96 (3 groups, one chunk partly used), 1056 (a full 1024
# chunk + 1 group), N not a multiple of the block's 32 columns or of a warp's 4; Q4_K needs K % 256.
SHAPES = [("Q4_0", 37, 1056), ("Q4_1", 5, 96), ("Q8_0", 33, 160), ("Q4_K", 9, 256), ("Q8_0", 3, 1056)]


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("fmt,n,k", SHAPES, ids=[f"{f}-{n}x{k}" for f, n, k in SHAPES])
def test_gemv_matches_float64_and_twin(fmt, n, k, rows, emulated, monkeypatch):
    monkeypatch.setattr(quant_cuda, "GEMV_MAX_ROWS", 32)  # 17 rows: three ROWS=8 tiles, one ragged
    w = make_weight(fmt, n, k, seed=rows)
    g = torch.Generator().manual_seed(rows)
    check(torch.randn(rows, k, generator=g), w)
    assert emulated and all(s.startswith("quant_gemv_kernel") for s in emulated), emulated
    assert f", {w.bits}, " in emulated[0]


@pytest.mark.parametrize("dtype", [bf16, f16], ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0", "Q4_K"])
def test_half_activations_with_bias(fmt, dtype, emulated):
    k = 256 if fmt == "Q4_K" else 160
    w = make_weight(fmt, 13, k, seed=5)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, k, generator=g).to(dtype)  # 3-D input: [..., K]
    bias = torch.randn(13, generator=g).to(dtype)
    check(x, w, bias)
    assert emulated == [f"quant_gemv_kernel<{'__half' if dtype == f16 else '__nv_bfloat16'}, {w.bits}, 8, 4>"]


@pytest.mark.parametrize("rows", [8, 9])
def test_rows_around_a_tile_and_float32_bias(rows, emulated):
    w = make_weight("Q4_0", 40, 96, seed=rows)
    g = torch.Generator().manual_seed(rows)
    check(torch.randn(rows, 96, generator=g), w, torch.randn(40, generator=g))
    assert len(emulated) == 1  # one launch: the grid's y covers the row tiles


@pytest.mark.parametrize("sms", [3, 64])
def test_small_grids_take_fewer_warps_per_block(sms, emulated, monkeypatch):
    """More SMs than blocks of 32 columns: 4 or 2 warps per block (16 or 8 columns), same results."""
    monkeypatch.setattr(quant_cuda, "_sm_count", lambda device: sms)
    w = make_weight("Q4_1", 100, 160, seed=sms)
    check(torch.randn(3, 160), w)
    assert quant_cuda.warps_for(100, 1, sms) == (4 if sms == 3 else 2)
    assert quant_cuda.warps_for(4096, 1, 132) == 2 and quant_cuda.warps_for(28672, 1, 132) == 8


def test_strided_rows_are_copied_not_misread(emulated):
    """A [T, K] view whose rows are not 16-byte aligned (a slice of a wider tensor at an odd offset)."""
    w = make_weight("Q8_0", 7, 64, seed=1)
    wide = torch.randn(4, 64 + 3)
    check(wide[:, 1:65], w)


@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q4_K", "Q8_0"])
def test_dequantize_kernel_equals_the_twin_bit_for_bit(fmt, dtype, emulated):
    k = 256 if fmt == "Q4_K" else 96
    w = make_weight(fmt, 11, k, seed=3)
    assert torch.equal(quant_cuda.dequantize(w, dtype), w.dequantize(dtype))
    assert emulated == [f"quant_dequant_kernel<{quant_cuda.build.CTYPES[str(dtype)[6:]]}, {w.bits}>"]


def test_long_chunks_take_the_dequantize_path(emulated):
    w = make_weight("Q4_1", 21, 96, seed=4)
    x = torch.randn(quant_cuda.GEMV_MAX_ROWS + 1, 96)
    check(x, w)
    assert [s.split("<")[0] for s in emulated] == ["quant_dequant_kernel"]


def test_fused_rows_of_mixed_4bit_formats(emulated):
    """The fused q/k/v GEMM of a file mixing Q4_0 and Q4_K (cat_rows keeps them quantized)."""
    w = quant.cat_rows([make_weight("Q4_0", 6, 256, 1), make_weight("Q4_K", 5, 256, 2)])
    assert isinstance(w, QuantLinear) and w.fmt == "Q4_0+Q4_K"
    check(torch.randn(2, 256), w)


def test_what_the_kernel_does_not_cover_goes_to_the_twin(emulated):
    w = make_weight("Q4_0", 8, 64, seed=0)
    x64 = torch.randn(2, 64, dtype=torch.float64)
    assert torch.equal(quant_cuda.linear(x64, w), quant.linear(x64, w))  # float64: no instantiation
    odd = QuantLinear(w.qweight.t().contiguous().t(), w.scales, w.zeros, w.fmt)  # non-contiguous packing
    x = torch.randn(1, 64)
    assert not quant_cuda.supports(x, odd)
    assert torch.equal(quant_cuda.linear(x, odd), quant.linear(x, odd))
    assert emulated == []
    with pytest.raises(ValueError, match="input has 32 features, the weight takes 64"):
        quant_cuda.linear(torch.randn(1, 32), w)


def test_dispatch_routes_cuda_quantized_layers_to_the_kernel(monkeypatch):
    """dispatch picks the registered CUDA kernel for CUDA tensors and the twin otherwise; it says which."""
    calls = []
    monkeypatch.setitem(dispatch._CUDA, "quant_linear", lambda *a: calls.append(a) or "kernel")
    monkeypatch.setattr(dispatch, "_cuda_checked", True)
    fake_cuda = SimpleNamespace(is_cuda=True)  # _quant_impl reads nothing else of x
    assert dispatch._quant_impl(fake_cuda) is dispatch._CUDA["quant_linear"]  # type: ignore[arg-type]
    assert dispatch._quant_impl(torch.randn(1)) is quant.linear
    assert dispatch.describe("cuda:0")["quantized_linear"].startswith("cuda (fused int4/int8 GEMV")
    monkeypatch.delitem(dispatch._CUDA, "quant_linear")
    assert dispatch._quant_impl(fake_cuda) is quant.linear  # type: ignore[arg-type]
    assert dispatch.describe("cuda")["quantized_linear"].startswith("reference")


def test_launch_arguments_have_the_cpp_parameter_widths(monkeypatch):
    """Each launch passes one NumPy scalar per C++ parameter, of its width (a pointer as uint64, int
    as int32, long long as int64): on a GPU a wrong width misreads every later argument."""
    import re

    calls = []
    monkeypatch.setattr(quant_cuda, "launch", lambda *a, **k: calls.append((a[1], k["args"])))
    w = make_weight("Q4_1", 8, 64, seed=0)
    quant_cuda.linear(torch.randn(2, 64, dtype=bf16), w, torch.randn(8, dtype=bf16))
    quant_cuda.dequantize(w, f16)
    src = re.sub(r"//[^\n]*", "", quant_cuda.build.source("quant"))
    assert len(calls) == 2
    for name, args in calls:
        m = re.search(rf"__global__ void\s+{name.split('<')[0]}\(([^)]*)\)", src)
        assert m, name
        want = [
            np.uint64 if "*" in p else np.int64 if p.strip().startswith("long long") else np.int32
            for p in m.group(1).split(",")
        ]
        assert [type(a) for a in args] == want, name


@pytest.mark.slow
def test_the_engines_quantized_calls_all_take_the_kernel(tiny_model, tmp_path, monkeypatch):
    """A tiny llama served from a GGUF file (every kept format) on the CPU with the C++ kernel off:
    every QuantLinear call the engine makes (fused q/k/v and gate/up, the head; prefill and decode rows)
    is one the CUDA kernel takes (`supports`: dtype, contiguous packing, alignment), and the kernel,
    emulated on one recorded call (its input copied) per distinct (rows, N, K), matches float64 and
    the twin on it. The whole generation through the emulator would take minutes (one host thread
    per CUDA thread); tests/gpu/test_gpu_quantized.py runs it on a device."""
    import importlib.util
    from pathlib import Path

    from modeldeploy.kernels import cpu_quant
    from modeldeploy.runtime import LLM, SamplingParams

    spec = importlib.util.spec_from_file_location(
        "tq_shared", Path(__file__).parents[1] / "runtime" / "models" / "test_quantized.py"
    )
    assert spec is not None and spec.loader is not None
    tq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tq)  # the GGUF writer the CPU quantization tests use
    hf_dir = tiny_model("llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2)
    (tmp_path / "gguf").mkdir()
    tq.write_tiny_gguf(hf_dir, tmp_path / "gguf" / "tiny.gguf", tmp_path / "ref", tq.LAYER_FORMATS)
    calls: list[tuple[torch.Tensor, QuantLinear]] = []

    def record(x, w, bias=None):
        assert quant_cuda.supports(x, w), (x.shape, x.stride(), x.dtype, w.fmt)
        calls.append((torch.empty_strided(x.shape, x.stride()).copy_(x), w))  # the engine reuses buffers
        return quant.linear(x, w, bias)

    monkeypatch.setattr(cpu_quant, "supports", lambda x, w: False)
    monkeypatch.setattr(dispatch, "_quant_impl", lambda x: record)
    llm = LLM(
        str(tmp_path / "gguf"), tokenizer=str(hf_dir), dtype="float32", max_model_len=128, num_kv_blocks=32
    )
    try:
        llm.generate(["a b c d e f", "hello"], SamplingParams(temperature=0.0, max_tokens=3, min_tokens=3))
    finally:
        llm.engine.close()
    assert calls
    picked: dict[tuple, tuple[torch.Tensor, QuantLinear]] = {}
    for x, w in calls:
        picked.setdefault((x.reshape(-1, x.shape[-1]).shape[0], w.out_features, w.in_features), (x, w))
    rows = sorted({r for r, _, _ in picked})
    assert len(rows) >= 2 and rows[-1] > 2, sorted(picked)  # prefill and decode rows
    # per row count its smallest weight, and the widest (gate/up) at one row: the emulator is slow
    keys = [min((k for k in picked if k[0] == r), key=lambda k: k[1] * k[2]) for r in rows]
    keys.append(max((k for k in picked if k[0] == rows[0]), key=lambda k: k[1]))
    for key in keys:
        check(*picked[key])
