"""GPTQ and AWQ int4 safetensors checkpoints served with their weights kept quantized
(runtime/int4_checkpoint.py, dispatched by runtime/loader.py).

The test is its own reference. It quantizes a tiny random model by round-to-nearest (the integers
q, zeros and fp16 scales are the test's own) and packs them from the formats' description, not by
inverting the loader's unpacker:
- GPTQ qweight [in/8, out], input feature 8r + j in nibble j of row r; qzeros [groups, out/8],
  output 8c + j in nibble j of column c; v1 writes zero - 1 by subtracting 0x11111111 from each
  word (GPTQModel's v2-to-v1 conversion, borrows included), gptq_v2 the zeros as they are;
- AWQ qweight [in, out/8] and qzeros [groups, out/8], output 8c + (0,2,4,6,1,3,5,7)[i] in nibble i.
The reference weight is (q - zero) * scale in float32 from those integers. Checked:
- each loaded weight's `dequantize()` (and the C++ kernel's rebuild) equals it bit for bit, for
  GPTQ v1 symmetric, v1 asymmetric with a zero of 0 (the v1 borrow), v2, group 128/64/32/-1, a
  trivial g_idx under desc_act: true, and AWQ;
- a tiny llama as GPTQ (lm_head quantized too) and a tiny qwen2 (q/k/v biases, tied head) as AWQ,
  served greedy: every GEMM weight a QuantLinear, the same tokens as transformers on a float32
  directory of exactly the de-quantized weights, /v1/bundle's quantization summary;
- an older checkpoint's quantize_config.json / quant_config.json read when config.json has none;
- refusals naming the field: bits, group_size, quant_method, checkpoint_format, version,
  zero_point, dynamic, an act-order g_idx, a shape that does not match, tensor parallelism.

No package that packs these formats is in the project's environment: AutoAWQ (deprecated, pure
Python but its package pulls in a model zoo, datasets and triton) and AutoGPTQ (a CUDA wheel) are not
dependencies, GPTQModel builds CUDA/C++ extensions. Opt-in, the last test runs AutoAWQ's and
AutoGPTQ's own packing and de-quantization code, single modules of their downloaded sources
(MODELDEPLOY_INT4_REFS), against these packers and the loader: equal bytes, equal weights.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from modeldeploy.kernels import cpu_quant
from modeldeploy.kernels.quant import QuantLinear
from modeldeploy.runtime import int4_checkpoint as i4

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ's nibble i holds output column 8c + this[i]
GEMMS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---- the test's quantizer and packers (from the formats' description) ---------------------------


def rtn(w: np.ndarray, group: int, sym: bool):
    """Round-to-nearest 4-bit of w [N, K] in groups of `group` along K (-1: the whole row):
    (q [N, K], zeros [N, G], fp16 scales [N, G]). Symmetric: zero 8 (GPTQ's sym)."""
    n, k = w.shape
    group = k if group == -1 else group
    wg = w.reshape(n, k // group, group).astype(np.float32)
    if sym:
        s = (np.abs(wg).max(-1) * 2 / 15).astype(np.float16)
        z = np.full(s.shape, 8, np.int64)
    else:
        lo, hi = np.minimum(wg.min(-1), 0), np.maximum(wg.max(-1), 0)
        s = ((hi - lo) / 15).astype(np.float16)
        z = np.clip(np.round(-lo / np.maximum(s.astype(np.float32), 1e-6)), 0, 15).astype(np.int64)
    s = np.maximum(s, np.float16(1e-4))
    sf = s.astype(np.float32)[..., None]
    q = np.clip(np.round(wg / sf) + z[..., None], 0, 15).astype(np.int64)
    return q.reshape(n, k), z, s


def reference(q: np.ndarray, z: np.ndarray, s: np.ndarray) -> torch.Tensor:
    """(q - zero) * scale in float32: the format's de-quantization, from the test's own integers."""
    n, k = q.shape
    group = k // z.shape[1]
    zz = np.repeat(z, group, axis=1).astype(np.float32)
    ss = np.repeat(s.astype(np.float32), group, axis=1)
    return torch.from_numpy(((q.astype(np.float32) - zz) * ss).astype(np.float32))


def words(nibbles: np.ndarray) -> np.ndarray:
    """[..., 8] values 0..15 -> uint64 words, value j at bits 4j..4j+3."""
    out = np.zeros(nibbles.shape[:-1], np.uint64)
    for j in range(8):
        out |= nibbles[..., j].astype(np.uint64) << np.uint64(4 * j)
    return out


def as_int32(w: np.ndarray) -> torch.Tensor:
    return torch.from_numpy((w & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32).copy())


def pack_gptq(q: np.ndarray, z: np.ndarray, s: np.ndarray, v1: bool) -> dict[str, torch.Tensor]:
    """q [N, K], z/s [N, G] -> GPTQ tensors (g_idx trivial)."""
    n, k = q.shape
    qweight = words(q.T.reshape(k // 8, 8, n).transpose(0, 2, 1))  # [K/8, N]: nibble j = in 8r + j
    zw = words(z.T.reshape(z.shape[1], n // 8, 8))  # [G, N/8]: nibble j = out 8c + j
    if v1:  # GPTQModel's convert_gptq_v2_to_v1: one word-wide subtraction, borrows and all
        zw = (zw + np.uint64(1 << 32) - np.uint64(0x11111111)) & np.uint64(0xFFFFFFFF)
    return {
        "qweight": as_int32(qweight),
        "qzeros": as_int32(zw),
        "scales": torch.from_numpy(s.T.copy()),
        "g_idx": torch.arange(k, dtype=torch.int32) // (k // z.shape[1]),
    }


def pack_awq(q: np.ndarray, z: np.ndarray, s: np.ndarray) -> dict[str, torch.Tensor]:
    n, k = q.shape
    order = list(AWQ_PACK_ORDER)
    qweight = words(q.T.reshape(k, n // 8, 8)[..., order])  # [K, N/8]: nibble i = out 8c + order[i]
    zw = words(z.T.reshape(z.shape[1], n // 8, 8)[..., order])
    return {"qweight": as_int32(qweight), "qzeros": as_int32(zw), "scales": torch.from_numpy(s.T.copy())}


def quant_config(method: str, group: int, **extra) -> dict:
    if method == "gptq":
        base = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": True}
        return base | {"checkpoint_format": "gptq"} | extra
    return {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "version": "gemm",
        "zero_point": True,
    } | extra


# ---- de-quantization, bit for bit -----------------------------------------------------------------

CASES = {
    "gptq-v1-sym-g128": ("gptq", 128, True, {}),
    "gptq-v1-asym-g32-desc_act-trivial": ("gptq", 32, False, {"desc_act": True, "sym": False}),
    "gptq-v2-asym-g64": ("gptq", 64, False, {"checkpoint_format": "gptq_v2", "sym": False}),
    "gptq-v1-sym-per-row": ("gptq", -1, True, {}),
    "awq-g128": ("awq", 128, False, {}),
    "awq-g32": ("awq", 32, False, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_format_dequantizes_bit_for_bit_like_its_reference(case, caplog):
    method, group, sym, extra = CASES[case]
    rng = np.random.default_rng(3)
    n, k = 48, 256
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[:, :32] = np.abs(w[:, :32])  # an all-positive group: round-to-nearest gives it zero 0
    q, z, s = rtn(w, group, sym)
    cfg = i4.parse_config(quant_config(method, group, **extra))
    v1 = cfg.checkpoint_format == "gptq"
    if method == "gptq" and not sym and group == 32:
        assert (z == 0).any() and v1  # v1's ambiguous nibble: stored as 15 with a borrow, read back as 0
    parts = pack_gptq(q, z, s, v1) if method == "gptq" else pack_awq(q, z, s)
    build = i4.gptq_linear if method == "gptq" else i4.awq_linear
    with caplog.at_level(logging.WARNING, logger="modeldeploy.runtime"):
        got = build("layer.proj", parts, n, k, cfg)
    ref = reference(q, z, s)
    assert isinstance(got, QuantLinear) and got.bits == 4 and got.fmt == method.upper()
    assert (got.out_features, got.in_features) == (n, k)
    assert torch.equal(got.dequantize(), ref)  # the twin, bit for bit
    if cpu_quant.available():
        assert torch.equal(cpu_quant.dequantize(got), ref)  # the C++ kernel's rebuild, bit for bit
    assert got.nbytes == n * k * 0.75
    assert ("zero nibble of 15" in caplog.text) == (v1 and bool((z == 0).any()))


def test_the_v1_zero_of_zero_reads_as_written_not_as_sixteen():
    """A stored v1 nibble of 15 is zero 0 (GPTQModel) where AutoGPTQ/vLLM's per-nibble +1 says 16."""
    q = np.zeros((8, 32), np.int64)
    z = np.array([[0], [8], [15], [0], [1], [2], [3], [15]], np.int64)
    s = np.full((8, 1), 0.5, np.float16)
    parts = pack_gptq(q, z, s, v1=True)
    got = i4.gptq_linear("x", parts, 8, 32, i4.parse_config(quant_config("gptq", 32, sym=False)))
    assert torch.equal(got.dequantize()[:, 0], torch.tensor([0, -4, -7.5, 0, -0.5, -1, -1.5, -7.5]))


# ---- a tiny model in each format, served ----------------------------------------------------------


def write_checkpoint(src: Path, out: Path, ref: Path, method: str, group: int, sym: bool, **extra) -> None:
    """`src` quantized into `out` (config.json with quantization_config, int32/fp16 tensors, the rest
    in fp16 as GPTQ/AWQ files keep it) and `ref`: `src`'s config with exactly the de-quantized weights
    (and the fp16 values of the rest) in float32."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    quant_lm_head = bool(extra.pop("lm_head", False))
    qc = quant_config(method, group, **extra) | ({"lm_head": True} if quant_lm_head else {})
    tensors, refs = {}, {}
    for name, t in sorted(load_file(str(src / "model.safetensors")).items()):
        base = name.removesuffix(".weight")
        if name.endswith(tuple(f"{g}.weight" for g in GEMMS)) or (quant_lm_head and name == "lm_head.weight"):
            q, z, s = rtn(t.numpy(), group, sym)
            if method == "gptq":
                parts = pack_gptq(q, z, s, v1=qc.get("checkpoint_format") == "gptq")
            else:
                parts = pack_awq(q, z, s)
            tensors |= {f"{base}.{p}": v for p, v in parts.items()}
            refs[name] = reference(q, z, s)
        else:
            tensors[name] = t.half()
            refs[name] = t.half().float()
    for d, weights, config in ((out, tensors, cfg | {"quantization_config": qc}), (ref, refs, cfg)):
        d.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name not in ("model.safetensors", "config.json"):
                shutil.copy(f, d / f.name)
        (d / "config.json").write_text(json.dumps(config, indent=2))
        save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})


MODELS = {
    "gptq-llama-lm_head": ("llama", "gptq", 128, True, {"lm_head": True}),
    "awq-qwen2-bias": ("qwen2", "awq", 64, False, {}),
}
SIZES = dict(hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module", params=list(MODELS))
def checkpoint(request, tiny_model, tmp_path_factory) -> tuple[str, Path, Path]:
    arch, method, group, sym, extra = MODELS[request.param]
    src = tiny_model(arch, **SIZES)
    root = tmp_path_factory.mktemp(request.param)
    write_checkpoint(src, root / "q", root / "ref", method, group, sym, **dict(extra))
    return request.param, root / "q", root / "ref"


def test_every_gemm_weight_is_kept_quantized_and_dequantizes_to_the_reference(checkpoint):
    from safetensors.torch import load_file

    from modeldeploy.runtime.config import EngineConfig
    from modeldeploy.runtime.loader import load

    name, qdir, ref_dir = checkpoint
    loaded = load(EngineConfig(model=str(qdir), dtype="float32", device="cpu", max_model_len=256))
    ref = load_file(str(ref_dir / "model.safetensors"))
    gemm = [n for n in ref if n.endswith(tuple(f"{g}.weight" for g in GEMMS))]
    assert len(gemm) == 7 * loaded.args.num_layers
    for n in gemm + (["lm_head.weight"] if "lm_head" in name else []):
        w = loaded.weights[n]
        assert isinstance(w, QuantLinear), n
        assert torch.equal(w.dequantize(), ref[n]), n
    for n in ("model.embed_tokens.weight", "model.norm.weight"):
        w = loaded.weights[n]
        assert isinstance(w, torch.Tensor) and w.dtype == torch.float32 and torch.equal(w, ref[n])
    q = loaded.quantization
    assert q is not None
    method = name.split("-")[0].upper()
    kept = len(gemm) + (1 if "lm_head" in name else 0)
    assert {k: q[k] for k in ("format", "bits", "group_size", "kept_quantized")} == {
        "format": method,
        "bits": 4,
        "group_size": MODELS[name][2],
        "kept_quantized": {method: kept},
    }
    assert q["checkpoint_format"] == ("gptq" if method == "GPTQ" else "gemm")
    assert set(q["float"]) == {"float16"}


def test_served_greedy_equals_transformers_on_the_dequantized_weights(checkpoint, float_prefill):
    from support.hf_reference import TEXT_PROMPTS, TOKEN_PROMPTS, hf_greedy

    from modeldeploy.runtime import LLM, SamplingParams

    name, qdir, ref_dir = checkpoint
    llm = LLM(str(qdir), dtype="float32", max_model_len=256, num_kv_blocks=64)
    try:
        prompts = [llm.engine.encode(p) for p in TEXT_PROMPTS] + TOKEN_PROMPTS
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24))
        info = llm.engine.info()
        quant_bytes = llm.engine.weight_bytes[0]
    finally:
        llm.engine.close()
    expected, _ = hf_greedy(ref_dir, prompts)
    for i, (out, exp) in enumerate(zip(outs, expected, strict=True)):
        assert out.token_ids == exp, f"{name} prompt {i}: engine {out.token_ids} != transformers {exp}"
    assert info["quantization"]["format"] == name.split("-")[0].upper()
    # the GEMMs at 0.75 B/weight against 4; the float embedding (and norms) stay float32
    float_bytes = sum(t.numel() * 4 for t in _float32_weights(ref_dir).values())
    assert quant_bytes < 0.6 * float_bytes, (quant_bytes, float_bytes)


def _float32_weights(ref_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(ref_dir / "model.safetensors"))


# ---- refusals --------------------------------------------------------------------------------------

BAD_CONFIGS = [
    ({"bits": 8}, "gptq", r"quantization_config\.bits: 8; only 4-bit GPTQ"),
    ({"bits": True}, "gptq", r"quantization_config\.bits: True"),
    ({"group_size": 48}, "gptq", r"quantization_config\.group_size: 48; served: a positive multiple of 32"),
    ({"group_size": 0}, "awq", r"quantization_config\.group_size: 0"),
    (
        {"checkpoint_format": "marlin"},
        "gptq",
        r"quantization_config\.checkpoint_format: 'marlin' is not served",
    ),
    ({"format": "gptq_p", "checkpoint_format": None}, "gptq", r"quantization_config\.format: 'gptq_p'"),
    ({"pack_dtype": "int16"}, "gptq", r"quantization_config\.pack_dtype: 'int16'"),
    ({"dynamic": {"-:.*mlp.*": {}}}, "gptq", r"quantization_config\.dynamic: per-module"),
    ({"version": "gemv"}, "awq", r"quantization_config\.version: 'gemv' is not served"),
    ({"backend": "llm-awq"}, "awq", r"quantization_config\.backend: 'llm-awq' is not served"),
    ({"zero_point": False}, "awq", r"quantization_config\.zero_point: False"),
    ({"quant_method": "fp8"}, "gptq", r"quantization_config\.quant_method: 'fp8' is not served"),
    ({"quant_method": "bitsandbytes"}, "awq", r"quantization_config\.quant_method: 'bitsandbytes'"),
]


@pytest.mark.parametrize(("change", "method", "match"), BAD_CONFIGS)
def test_unsupported_configs_are_refused_naming_the_field(change, method, match):
    with pytest.raises(ValueError, match=match):
        i4.parse_config(quant_config(method, 128) | change)


def test_format_keys_follow_transformers_precedence():
    """checkpoint_format over format (GPTQ), version over format (AWQ), as transformers reads them."""
    assert i4.parse_config(quant_config("gptq", 128, format="gptq_v2")).checkpoint_format == "gptq"
    no_legacy = quant_config("gptq", 128, format="gptq_v2", checkpoint_format=None)
    assert i4.parse_config(no_legacy).checkpoint_format == "gptq_v2"
    awq = {"quant_method": "AWQ", "w_bit": 4, "q_group_size": 64, "format": "GEMM"}
    assert i4.parse_config(awq) == i4.Int4Config("awq", 64, "gemm")


def test_an_older_checkpoints_side_file_is_read_when_config_json_has_no_quantization_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert i4.quantization_config(tmp_path) is None
    awq = {"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}  # AutoAWQ's spelling
    (tmp_path / "quant_config.json").write_text(json.dumps(awq))
    assert i4.parse_config(i4.quantization_config(tmp_path)) == i4.Int4Config("awq", 128, "gemm")
    (tmp_path / "quant_config.json").unlink()
    gptq = {"bits": 4, "group_size": 64, "desc_act": False, "sym": True}  # AutoGPTQ's, no quant_method
    (tmp_path / "quantize_config.json").write_text(json.dumps(gptq))
    assert i4.parse_config(i4.quantization_config(tmp_path)) == i4.Int4Config("gptq", 64, "gptq", True)
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": quant_config("awq", 32)}))
    assert i4.parse_config(i4.quantization_config(tmp_path)).method == "awq"  # config.json wins


def test_act_order_and_bad_shapes_are_refused_naming_tensor_and_field():
    rng = np.random.default_rng(0)
    q, z, s = rtn(rng.standard_normal((16, 128)).astype(np.float32), 32, True)
    cfg = i4.parse_config(quant_config("gptq", 32, desc_act=True))
    parts = pack_gptq(q, z, s, v1=True)
    parts["g_idx"] = torch.from_numpy(rng.permutation(128) // 32).to(torch.int32)
    with pytest.raises(
        ValueError, match=r"desc_act: True, and m\.g_idx is not k // group_size \(act-order\)"
    ):
        i4.gptq_linear("m", parts, 16, 128, cfg)
    parts = pack_gptq(q, z, s, v1=True)
    with pytest.raises(ValueError, match=r"m\.qweight has shape \(16, 16\), config implies \(16, 32\)"):
        i4.gptq_linear("m", parts, 32, 128, cfg)
    with pytest.raises(ValueError, match=r"group_size: 96 does not divide m's 128 input features"):
        i4.awq_linear("m", pack_awq(q, z, s), 16, 128, i4.Int4Config("awq", 96, "gemm"))


def test_the_loader_refuses_before_reading_weights(checkpoint, tmp_path):
    from modeldeploy.runtime import LLM

    name, qdir, _ = checkpoint
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 2; a (GPTQ|AWQ) int4 checkpoint is served"):
        LLM(str(qdir), tensor_parallel_size=2, max_model_len=256)
    bad = tmp_path / "bad"
    shutil.copytree(qdir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"]["bits"] = 3
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"quantization_config\.bits: 3"):
        LLM(str(bad), max_model_len=256)
    # a stored module without its scales names the module
    from safetensors.torch import load_file, save_file

    cfg["quantization_config"]["bits"] = 4
    (bad / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(bad / "model.safetensors"))
    del t["model.layers.1.mlp.down_proj.scales"]
    save_file(t, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.down_proj\.qweight has no scales"):
        LLM(str(bad), max_model_len=256)


# ---- opt-in: the reference implementations' own code ----------------------------------------------

REFS = os.environ.get("MODELDEPLOY_INT4_REFS", "")


def _stub_packages(monkeypatch, root: Path) -> None:
    """Import single modules of AutoAWQ and AutoGPTQ without their package __init__s (which pull
    in model zoos and CUDA kernels): stub parent packages pointing at the sources."""
    import types

    for name, path in {
        "awq": "autoawq-0.2.9/awq",
        "awq.modules": "autoawq-0.2.9/awq/modules",
        "awq.modules.linear": "autoawq-0.2.9/awq/modules/linear",
        "auto_gptq": "auto_gptq",
        "auto_gptq.nn_modules": "auto_gptq/nn_modules",
        "auto_gptq.nn_modules.qlinear": "auto_gptq/nn_modules/qlinear",
    }.items():
        m = types.ModuleType(name)
        m.__path__ = [str(root / path)]
        monkeypatch.setitem(sys.modules, name, m)


@pytest.mark.skipif(
    not REFS,
    reason="opt-in: MODELDEPLOY_INT4_REFS=DIR holding autoawq-0.2.9/ (the sdist, unpacked) and auto_gptq/ "
    "(the auto-gptq 0.7.1 wheel, unzipped), from `pip download --no-deps autoawq==0.2.9 auto-gptq==0.7.1`",
)
@pytest.mark.parametrize("group", [32, 128])
def test_packers_and_readers_agree_with_autoawq_and_autogptq_code(group, monkeypatch):
    """AutoAWQ's WQLinear_GEMM.from_linear and AutoGPTQ's exllama pack() write the bytes the test's
    packers write; the loader reads their tensors as AutoAWQ's dequantize_gemm (float32 scales) and
    AutoGPTQ's torch de-quantization (zeros = nibble + 1) do."""
    import importlib

    _stub_packages(monkeypatch, Path(REFS))
    for mod in [m for m in sys.modules if m.startswith(("awq.", "auto_gptq."))]:
        monkeypatch.delitem(sys.modules, mod)
    gemm = importlib.import_module("awq.modules.linear.gemm")
    packing = importlib.import_module("awq.utils.packing_utils")
    exllama = importlib.import_module("auto_gptq.nn_modules.qlinear.qlinear_exllama")
    rng = np.random.default_rng(group)
    n, k = 96, 256
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)

    q, z, s = rtn(w, group, sym=False)
    lin = torch.nn.Linear(k, n, bias=False)
    lin.weight.data = reference(q, z, s)  # rounds back to exactly q under AutoAWQ's (w + z s) / s
    ref_mod = gemm.WQLinear_GEMM.from_linear(
        lin, 4, group, scales=torch.from_numpy(s.T.astype(np.float32)), zeros=torch.from_numpy(z.T * 1.0)
    )
    mine = pack_awq(q, z, s)
    assert torch.equal(mine["qweight"], ref_mod.qweight) and torch.equal(mine["qzeros"], ref_mod.qzeros)
    theirs = packing.dequantize_gemm(ref_mod.qweight, ref_mod.qzeros, ref_mod.scales.float(), 4, group).T
    parts = {"qweight": ref_mod.qweight, "qzeros": ref_mod.qzeros, "scales": ref_mod.scales}
    assert torch.equal(
        i4.awq_linear("x", parts, n, k, i4.Int4Config("awq", group, "gemm")).dequantize(), theirs
    )

    for sym in (True, False):
        q, z, s = rtn(w, group, sym=sym)
        z = np.maximum(z, 1)  # AutoGPTQ casts zero - 1 = -1.0 to uint32: a zero of 0 is not comparable
        m = exllama.QuantLinear(4, group, k, n, bias=False)
        lin.weight.data = reference(q, z, s)
        g_idx = torch.arange(k, dtype=torch.int32) // group
        m.pack(lin, torch.from_numpy(s.astype(np.float32)), torch.from_numpy(z * 1.0), g_idx)
        mine = pack_gptq(q, z, s, v1=True)
        assert all(torch.equal(mine[p], getattr(m, p)) for p in ("qweight", "qzeros", "scales"))
        parts = {"qweight": m.qweight, "qzeros": m.qzeros, "scales": m.scales, "g_idx": m.g_idx}
        got = i4.gptq_linear("x", parts, n, k, i4.Int4Config("gptq", group, "gptq", sym)).dequantize()
        shifts = torch.arange(0, 32, 4)
        zn = ((m.qzeros.to(torch.int64)[..., None] >> shifts) & 15).reshape(-1, n) + 1
        qn = ((m.qweight.to(torch.int64)[:, None, :] >> shifts[None, :, None]) & 15).reshape(k, n)
        assert torch.equal(got, (m.scales.float()[g_idx.long()] * (qn - zn[g_idx.long()])).T)
