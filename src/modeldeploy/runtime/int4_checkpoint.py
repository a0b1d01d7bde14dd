"""GPTQ and AWQ int4 safetensors checkpoints, served with their linear weights kept quantized.

A Hugging Face model directory whose config.json carries `quantization_config` with `quant_method`
"gptq" or "awq" (or, from before transformers wrote it there, a quantize_config.json or AutoAWQ's
quant_config.json beside it) is read here (runtime/loader.py dispatches): every GEMM weight stored as
`qweight`/`qzeros`/`scales` (+ `g_idx` for GPTQ) becomes a `kernels.quant.QuantLinear`, everything
else (embedding, norms, biases, an unquantized lm_head) is read as floats, as for any directory.

The formats, as their packers write them and their reference unpackers read them (read, not copied:
AutoGPTQ 0.7.1 `nn_modules/qlinear/qlinear_exllama.py` pack() and its torch dequant in
`qlinear_cuda_old.py`; GPTQModel 7.7.0 `nn_modules/qlinear/__init__.py` pack()/dequantize_weight()
and `utils/model.py` convert_gptq_v1_to_v2_format / v2_to_v1; AutoAWQ 0.2.9
`awq/modules/linear/gemm.py` WQLinear_GEMM.from_linear and `awq/utils/packing_utils.py`
unpack_awq/reverse_awq_order/dequantize_gemm; vLLM `model_executor/layers/quantization/awq_triton.py`
awq_dequantize_kernel and `gptq.py`; transformers' GPTQConfig/AwqConfig for the config keys):

GPTQ (scales fp16 [groups, out]; g = g_idx[k], the group of input feature k):
- qweight int32 [in/8, out]: word r, nibble j (bits 4j..4j+3) holds q[in 8r + j, out n];
- qzeros int32 [groups, out/8]: word c, nibble j holds the zero of out 8c + j; v1 ("gptq") stores
  zero - 1, v2 ("gptq_v2") the zero;
- g_idx int32 [in]; w[n, k] = scales[g, n] (q - zero[g, n]).

AWQ "gemm" (scales fp16 [groups, out]; g = k // group_size):
- qweight int32 [in, out/8]: word c, nibble i holds q[in k, out 8c + AWQ_ORDER[i]], the order
  (0, 2, 4, 6, 1, 3, 5, 7);
- qzeros int32 [groups, out/8] in the same interleaved order, the zero as is;
- w[n, k] = (q - zero[g, n]) scales[g, n].

`group_size` -1 is one group per row (all of `in`). GPTQ v1's minus-one zeros are undone the way
GPTQModel (transformers' GPTQ backend) does, adding 0x11111111 to each int32 word: that is the exact
inverse of its v1 writer, which subtracts it word-wise, so a zero of 0 (stored as nibble 15 with a
borrow from the next nibble) reads back as 0. AutoGPTQ's and vLLM's kernels add 1 per nibble instead
and read a stored 15 as 16; the two readings differ only where a stored zero nibble is 15 (never in
a symmetric checkpoint, where every zero is 8), which a log line reports.

Onto QuantLinear (4-bit groups of 32 along `in`, float32 scale and zero, w = q * scale + zero): a
group of G = 32m becomes m groups of 32 with the same scale s and zero -z s. Exact in float32: s is
an fp16 value, z s is at most 5 x 11 significant bits, and q s + (-z s) = (q - z) s, itself exactly
representable, so `dequantize()` equals the float32 reference dequant (q - z) s bit for bit
(tests/runtime/models/test_int4_checkpoints.py). The fp16 reference dequant that vLLM and AutoAWQ
compute for fp16 activations rounds (q - z) s to 11 bits; float32 does not. Resident bytes: 0.75
per weight (against about 0.52 in a group-128 file: float32 scale and zero per 32 where the file has
an fp16 scale and a 4-bit zero per 128), the price of one QuantLinear layout for every format and
kernel.

Not served, refused naming the field: bits other than 4; a group size that is not a multiple of 32
(or -1); GPTQ act-order (a `g_idx` other than k // group_size, which `desc_act: true` writes; the
input columns would need a permutation per layer); GPTQ formats other than gptq (v1) and gptq_v2
(marlin, bitblas, gptq_p) and per-module `dynamic` overrides; AWQ formats other than gemm (gemv,
gemv_fast, llm-awq) and `zero_point: false`; any other `quant_method`. One rank: tensor
parallelism over quantized weights is refused by the loader, as for GGUF.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from modeldeploy.kernels.quant import QuantLinear
    from modeldeploy.runtime.models.llama import ModelArgs

log = logging.getLogger("modeldeploy.runtime")

METHODS = ("gptq", "awq")
GPTQ_FORMATS = ("gptq", "gptq_v2")
AWQ_FORMATS = ("gemm",)
# AWQ's packing order: nibble i of a word holds output column 8c + AWQ_ORDER[i] (AutoAWQ's order_map)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AMBIGUOUS = (
    "a v1 zero nibble of 15, read as zero 0 (GPTQModel's word-wise reading, the inverse of its "
    "writer); AutoGPTQ's and vLLM's kernels read it as 16"
)
_PARTS = {"gptq": ("qweight", "qzeros", "scales", "g_idx"), "awq": ("qweight", "qzeros", "scales")}


@dataclass(frozen=True)
class Int4Config:
    """What the loader needs of a checkpoint's `quantization_config` (parse_config checks it)."""

    method: str  # "gptq" | "awq"
    group_size: int  # -1: one group per row
    checkpoint_format: str  # "gptq" (v1: zeros stored minus one) | "gptq_v2" | "gemm" (AWQ)
    sym: bool | None = None  # GPTQ's `sym` (informational: the zeros are stored either way)
    desc_act: bool = False  # GPTQ's `desc_act`: allowed only with a trivial g_idx

    @property
    def name(self) -> str:
        """The format as /v1/bundle reports it, and QuantLinear.fmt."""
        return self.method.upper()


# Where AutoGPTQ and AutoAWQ wrote the config before transformers put it in config.json (vLLM reads
# them too); AutoAWQ's quant_config.json names no quant_method.
SIDE_FILES = {"quantize_config.json": None, "quant_config.json": "awq"}


def quantization_config(model_dir: Path) -> dict[str, Any] | None:
    """config.json's `quantization_config`, else that of an older checkpoint's quantize_config.json
    or quant_config.json (None when there is none: float weights). A side file without
    `quant_method` is AWQ when it spells AutoAWQ's keys (zero_point, version, w_bit), else GPTQ."""
    data = json.loads((model_dir / "config.json").read_text())
    q = data.get("quantization_config") if isinstance(data, dict) else None
    if q is not None:
        return q
    for name, method in SIDE_FILES.items():
        path = model_dir / name
        if path.is_file():
            side = json.loads(path.read_text())
            if isinstance(side, dict) and not side.get("quant_method"):
                awq = method or ("awq" if {"zero_point", "version", "w_bit"} & set(side) else "gptq")
                side = side | {"quant_method": awq}
            return side
    return None


def served_config(model_dir: Path, tensor_parallel_size: int, load_format: str) -> Int4Config | None:
    """The checked int4 config of a model directory the loader is about to read (None: float
    weights, or `load_format: dummy`, which makes random float weights whatever the files hold).
    ValueError names the field it does not serve, or tensor parallelism (one rank, as for GGUF)."""
    q = quantization_config(model_dir)
    if q is None or load_format == "dummy":
        return None
    cfg = parse_config(q)
    if tensor_parallel_size > 1:
        raise ValueError(
            f"tensor_parallel_size: {tensor_parallel_size}; a {cfg.name} int4 checkpoint is served "
            "on one rank"
        )
    return cfg


def _field(q: dict[str, Any], *names: str) -> tuple[str, Any]:
    """(the key the config spells, its value): the first of `names` present and not null, in
    transformers' precedence (a legacy key such as checkpoint_format or version first)."""
    for n in names:
        if q.get(n) is not None:
            return n, q[n]
    return names[-1], None


def parse_config(q: Any) -> Int4Config:
    """A checked Int4Config; ValueError naming the `quantization_config` field for anything this
    runtime does not serve."""
    if not isinstance(q, dict):
        raise ValueError(f"quantization_config: expected an object, got {type(q).__name__}")
    method = q.get("quant_method")
    if not isinstance(method, str) or method.lower() not in METHODS:
        raise ValueError(
            f"quantization_config.quant_method: {method!r} is not served (served: 4-bit "
            f"{', '.join(METHODS)} safetensors; a GGUF file, or float weights)"
        )
    method = method.lower()
    key, bits = _field(q, "w_bit", "bits")
    if bits != 4 or isinstance(bits, bool):
        raise ValueError(
            f"quantization_config.{key}: {bits!r}; only 4-bit {method.upper()} weights are served"
        )
    key, group = _field(q, "q_group_size", "group_size")
    if not isinstance(group, int) or isinstance(group, bool) or (group != -1 and (group <= 0 or group % 32)):
        raise ValueError(
            f"quantization_config.{key}: {group!r}; served: a positive multiple of 32, "
            "or -1 (one group per row)"
        )
    if method == "gptq":
        return _gptq_config(q, group)
    return _awq_config(q, group)


def _gptq_config(q: dict[str, Any], group: int) -> Int4Config:
    key, fmt = _field(q, "checkpoint_format", "format")
    fmt = "gptq" if fmt is None else str(fmt).lower()
    if fmt not in GPTQ_FORMATS:
        raise ValueError(
            f"quantization_config.{key}: {fmt!r} is not served "
            f"(served GPTQ formats: {', '.join(GPTQ_FORMATS)})"
        )
    pack = q.get("pack_dtype", "int32")
    if pack != "int32":
        raise ValueError(f"quantization_config.pack_dtype: {pack!r}; only int32 words are served")
    if q.get("dynamic"):
        raise ValueError(
            "quantization_config.dynamic: per-module bits or group sizes are not served "
            "(one bits/group_size for every quantized module)"
        )
    return Int4Config("gptq", group, fmt, bool(q.get("sym", True)), bool(q.get("desc_act", False)))


def _awq_config(q: dict[str, Any], group: int) -> Int4Config:
    key, fmt = _field(q, "version", "format")
    fmt = "gemm" if fmt is None else str(fmt).lower()
    if str(q.get("backend") or "").lower() == "llm-awq":  # transformers: backend llm-awq means that format
        key, fmt = "backend", "llm-awq"
    if fmt not in AWQ_FORMATS:
        raise ValueError(
            f"quantization_config.{key}: {fmt!r} is not served (served AWQ formats: {', '.join(AWQ_FORMATS)})"
        )
    if q.get("zero_point", True) is not True:
        raise ValueError(
            f"quantization_config.zero_point: {q.get('zero_point')!r}; only AWQ with zero points "
            "(qzeros) is served"
        )
    return Int4Config("awq", group, fmt)


@dataclass
class Int4Weights:
    """The weights of a GPTQ/AWQ directory as the runtime holds them."""

    weights: dict[str, torch.Tensor | QuantLinear]
    config: Int4Config
    kept: int = 0  # GEMM weights kept quantized
    floats: Counter = field(default_factory=Counter)  # safetensors dtype (F16, ...) -> float tensors read

    def summary(self) -> dict[str, Any]:
        """For /v1/bundle (engine_info.quantization): the format and what the served bytes are."""
        from modeldeploy.kernels.quant import nbytes

        c = self.config
        out: dict[str, Any] = {
            "format": c.name,
            "bits": 4,
            "group_size": c.group_size,
            "checkpoint_format": c.checkpoint_format,
            "kept_quantized": {c.name: self.kept},
            "float": dict(sorted(self.floats.items())),
            "weight_bytes": sum(nbytes(w) for w in self.weights.values()),
        }
        if c.method == "gptq":
            out.update(sym=c.sym, desc_act=c.desc_act)
        return out


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 words [..., W] -> their 8 nibbles [..., W, 8], nibble k = bits 4k..4k+3 (as int64)."""
    import torch

    u = words.to(torch.int64) & 0xFFFFFFFF
    return (u[..., None] >> torch.arange(0, 32, 4, dtype=torch.int64)) & 15


def _quant_linear(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, fmt: str) -> QuantLinear:
    """q [N, K] (0..15), zeros [N, G] integers, scales [N, G] float32 (G groups of K/G) -> a
    QuantLinear in groups of 32: w = q s - z s, each source group split into K/G/32 groups."""
    import torch

    from modeldeploy.kernels.quant import GROUP, QuantLinear

    n, k = q.shape
    per = k // scales.shape[1] // GROUP
    s = scales.repeat_interleave(per, dim=1).contiguous()
    zero = -(zeros.to(torch.float32).repeat_interleave(per, dim=1) * s)  # exact: <= 5 x 11 bits
    b = q.to(torch.uint8).reshape(n, k // GROUP, GROUP)
    packed = b[..., : GROUP // 2] | (b[..., GROUP // 2 :] << 4)  # byte j: q[j] low, q[j+16] high
    return QuantLinear(packed.reshape(n, k // 2).contiguous(), s, zero.contiguous(), fmt)


def _check_shapes(name: str, parts: dict[str, torch.Tensor], want: dict[str, tuple[int, ...]]) -> None:
    for part, shape in want.items():
        t = parts[part]
        if tuple(t.shape) != shape:
            raise ValueError(f"model: {name}.{part} has shape {tuple(t.shape)}, config implies {shape}")


def _groups(cfg: Int4Config, n: int, k: int, name: str) -> int:
    """The module's group count along `in`, once its [n, k] suits 4-bit words and groups of 32."""
    if n % 8 or k % 32:
        raise ValueError(f"model: {name} is [{n}, {k}]; {cfg.name} int4 needs out % 8 == 0 and in % 32 == 0")
    group = k if cfg.group_size == -1 else cfg.group_size
    if k % group:
        raise ValueError(
            f"quantization_config.group_size: {cfg.group_size} does not divide {name}'s {k} input features"
        )
    return k // group


def gptq_linear(
    name: str,
    parts: dict[str, torch.Tensor],
    n: int,
    k: int,
    cfg: Int4Config,
    ambiguous: list[str] | None = None,
) -> QuantLinear:
    """One GPTQ module (`parts`: its qweight, qzeros, scales and, when stored, g_idx) as a QuantLinear
    of [n, k]. A v1 module with a stored zero nibble of 15 (module docstring) is appended to
    `ambiguous` for the caller's one log line, or logged here when no list is given."""
    import torch

    g = _groups(cfg, n, k, name)
    _check_shapes(name, parts, {"qweight": (k // 8, n), "qzeros": (g, n // 8), "scales": (g, n)})
    if "g_idx" in parts:
        trivial = torch.arange(k, dtype=torch.int64) // (k // g)
        if tuple(parts["g_idx"].shape) != (k,) or not torch.equal(parts["g_idx"].to(torch.int64), trivial):
            raise ValueError(
                f"quantization_config.desc_act: {cfg.desc_act}, and {name}.g_idx is not k // group_size "
                "(act-order): an act-order GPTQ checkpoint is not served (re-quantize with desc_act: false)"
            )
    q = _nibbles(parts["qweight"]).permute(0, 2, 1).reshape(k, n)  # [k/8, 8, n] -> [k, n]
    words = parts["qzeros"].to(torch.int64) & 0xFFFFFFFF
    if cfg.checkpoint_format == "gptq":  # v1: zero - 1 stored; undone word-wise (module docstring)
        if bool((_nibbles(words) == 15).any()):
            if ambiguous is None:
                log.warning("GPTQ %s: %s", name, _AMBIGUOUS)
            else:
                ambiguous.append(name)
        words = (words + 0x11111111) & 0xFFFFFFFF
    z = _nibbles(words).reshape(g, n)
    s = parts["scales"].to(torch.float32)
    return _quant_linear(q.T, z.T, s.T, cfg.name)


def awq_linear(name: str, parts: dict[str, torch.Tensor], n: int, k: int, cfg: Int4Config) -> QuantLinear:
    """One AWQ (gemm) module (`parts`: its qweight, qzeros, scales) as a QuantLinear of [n, k]."""
    import torch

    g = _groups(cfg, n, k, name)
    _check_shapes(name, parts, {"qweight": (k, n // 8), "qzeros": (g, n // 8), "scales": (g, n)})
    # nibble i holds column AWQ_ORDER[i] of its 8: column j is nibble AWQ_ORDER.index(j)
    unorder = torch.tensor([AWQ_ORDER.index(j) for j in range(8)])
    q = _nibbles(parts["qweight"])[..., unorder].reshape(k, n)
    z = _nibbles(parts["qzeros"])[..., unorder].reshape(g, n)
    s = parts["scales"].to(torch.float32)
    return _quant_linear(q.T, z.T, s.T, cfg.name)


def _gather(
    model_dir: Path, want: dict[str, tuple[int, ...]], cfg: Int4Config, progress: Callable[[str, float], None]
) -> dict[str, torch.Tensor]:
    """Every tensor of the (possibly sharded) safetensors that a wanted weight needs, as stored."""
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors files in {model_dir}")
    needed = set(want)
    for name, shape in want.items():
        if len(shape) == 2 and name.endswith(".weight"):
            base = name[: -len(".weight")]
            needed |= {f"{base}.{p}" for p in _PARTS[cfg.method]}
    raw: dict[str, torch.Tensor] = {}
    for i, path in enumerate(files):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():
                if key in needed:
                    raw[key] = f.get_tensor(key)
        progress("loading weights", 0.05 + 0.6 * (i + 1) / len(files))
    return raw


def read_int4_weights(
    model_dir: Path,
    args: ModelArgs,
    dtype: torch.dtype,
    cfg: Int4Config,
    progress: Callable[[str, float], None] = lambda phase, frac: None,
) -> Int4Weights:
    """Every weight the model reads from a GPTQ/AWQ directory: a GEMM weight stored as qweight/
    qzeros/scales kept quantized (QuantLinear), one stored as `.weight` and every 1-D tensor read as
    `dtype`. ValueError names a missing tensor, a shape that does not match the config, or an
    act-order g_idx."""
    from modeldeploy.runtime.models.llama import expected_weight_shapes

    want = expected_weight_shapes(args)
    raw = _gather(model_dir, want, cfg, progress)
    out = Int4Weights({}, cfg)
    ambiguous: list[str] = []
    for name, shape in want.items():
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if len(shape) == 2 and base is not None and f"{base}.qweight" in raw:
            parts = {p: raw[f"{base}.{p}"] for p in _PARTS[cfg.method] if f"{base}.{p}" in raw}
            missing = [p for p in ("qzeros", "scales") if p not in parts]
            if missing:
                raise ValueError(f"model: {base}.qweight has no {' or '.join(missing)} in {model_dir}")
            if cfg.method == "gptq":
                out.weights[name] = gptq_linear(base, parts, shape[0], shape[1], cfg, ambiguous)
            else:
                out.weights[name] = awq_linear(base, parts, shape[0], shape[1], cfg)
            out.kept += 1
        elif name in raw:
            t = raw[name]
            if tuple(t.shape) != shape:
                raise ValueError(f"model: weight {name} has shape {tuple(t.shape)}, config implies {shape}")
            out.floats[str(t.dtype).removeprefix("torch.")] += 1
            out.weights[name] = t.to(dtype)
    missing = [n for n in want if n not in out.weights]
    if missing:
        raise ValueError(
            f"model: weights missing from {model_dir}: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    if ambiguous:
        log.warning("GPTQ: %d modules (%s...) have %s", len(ambiguous), ", ".join(ambiguous[:3]), _AMBIGUOUS)
    log.info(
        "%s int4 (group %d, %s): %d GEMM weights kept quantized; float %s",
        cfg.name,
        cfg.group_size,
        cfg.checkpoint_format,
        out.kept,
        dict(out.floats) or "none",
    )
    return out
