"""Llama-family decoder (Llama, Qwen2, Qwen3, Mistral) over a paged KV cache.

One readable file in the gpt-fast manner. The variants differ only in flags:
Qwen2 has q/k/v biases, Qwen3 RMS-normalises q and k per head, Mistral may use a
sliding window (the loader caps max_model_len at it instead). Every hot op goes through
`modeldeploy.kernels.dispatch`: the matrix products are torch's (on CPU float32, oneDNN's with
the weights packed once at load), the rest CuPy kernels or their twins.

RoPE and its scaling types are models/rope.py's: static types index one cos/sin cache by position;
dynamic and longrope rotate each token with the frequencies of its own sequence's length
(`LlamaModel.rotary_inputs`).

Under tensor parallelism each rank builds this model from its own slices (`shard.py`) with
its own head and intermediate counts in `args`; `reduce` sums the row-parallel partial outputs
of o_proj and down_proj across ranks (the only two collectives of a layer).

Shapes: T tokens in the step, H query heads, Hkv kv heads, D head dim, E hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from modeldeploy.kernels import dispatch
from modeldeploy.kernels.quant import QuantLinear, cat_rows
from modeldeploy.runtime.models import rope as rotary
from modeldeploy.runtime.models.rope import ROPE_TYPES, Rope

if TYPE_CHECKING:
    from collections.abc import Callable

    from modeldeploy.kernels.cpu_gemm import PackedLinear

SUPPORTED = {
    "LlamaForCausalLM": dict(qkv_bias=False, qk_norm=False),
    "MistralForCausalLM": dict(qkv_bias=False, qk_norm=False),
    "Qwen2ForCausalLM": dict(qkv_bias=True, qk_norm=False),
    "Qwen3ForCausalLM": dict(qkv_bias=False, qk_norm=True),
}


class LoraDelta(Protocol):
    """A step's LoRA adapters as the layers apply them (`lora.LoraBatch`): a protocol, so this module
    does not import lora.py, which imports ModelArgs from here."""

    def apply(self, layer: int, site: str, x: torch.Tensor, out: torch.Tensor) -> None:
        """out [T, N] += the LoRA delta of x [T, K] at `site` of `layer`, per token's adapter."""
        ...


@dataclass
class ModelArgs:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rope: dict
    sliding_window: int | None = None

    @classmethod
    def from_hf(cls, cfg) -> ModelArgs:
        arch = (getattr(cfg, "architectures", None) or ["<none>"])[0]
        if arch not in SUPPORTED:
            raise ValueError(f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED)}")
        rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
        rope.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"unsupported rope scaling type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}"
            )
        rope["rope_type"] = rope_type
        if rope_type in ("llama3", "yarn", "longrope"):  # as transformers' standardize_rope_params
            top = getattr(cfg, "original_max_position_embeddings", None)  # Phi-3 keeps it outside
            if top is not None:
                rope["original_max_position_embeddings"] = top
            rope.setdefault("original_max_position_embeddings", cfg.max_position_embeddings)
        window = getattr(cfg, "sliding_window", None)
        if arch == "Qwen2ForCausalLM" and not getattr(cfg, "use_sliding_window", False):
            window = None
        heads = cfg.num_attention_heads
        rotary.check(rope, getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return cls(
            architecture=arch,
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            rms_norm_eps=cfg.rms_norm_eps,
            max_position_embeddings=cfg.max_position_embeddings,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            rope=rope,
            sliding_window=window,
            **SUPPORTED[arch],
        )

    def max_length(self) -> tuple[int, str]:
        """The longest context the model is made for, per its RoPE scaling (`rope.max_length`), and
        how that was derived: the default max_model_len and its upper bound."""
        return rotary.max_length(self.rope, self.max_position_embeddings)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies [D/2] as transformers computes them at init (`rope.inv_freq`: for dynamic
    and longrope those of a sequence within the original context)."""
    return rotary.inv_freq(args.rope, args.head_dim, args.max_position_embeddings)[0]


def cos_sin_cache(args: ModelArgs, max_pos: int, device: torch.device) -> torch.Tensor:
    """[max_pos, D] float32: cos of the D/2 frequencies, then sin, scaled by the attention factor
    (yarn, longrope); longrope's long factors' rows follow (`Rope.cache`)."""
    return Rope(args.rope, args.head_dim, args.max_position_embeddings).cache(max_pos, device)


@dataclass
class AttnMeta:
    """Where this step's tokens go in the paged cache and what they attend to.

    The first `num_decode` tokens are decodes (one per sequence), the rest are prefill
    chunks packed by `cu_seqlens_q` (offsets relative to the first prefill token).
    """

    slot_mapping: torch.Tensor  # [T] flat cache slot per token
    num_decode: int
    decode_tables: torch.Tensor  # [Bd, M]
    decode_lens: torch.Tensor  # [Bd] context length including the new token
    prefill_tables: torch.Tensor  # [Bp, M]
    prefill_cu_q: torch.Tensor  # [Bp+1]
    prefill_lens: torch.Tensor  # [Bp]
    # (start, end) of each prefill chunk (host ints, relative to the first prefill token) when every
    # chunk is a whole fresh prompt (nothing cached before it) on CPU, else None: then its new K/V
    # are all it attends to, and SDPA over them beats walking the pages (bench/results/engine_cpu.md).
    fresh_prefills: list[tuple[int, int]] | None = None


class Layer:
    """One decoder block; norms as plain tensors, the four GEMM weights (q/k/v and gate/up fused)
    as `dispatch.pack_linear` made them (a QuantLinear stays quantized)."""

    def __init__(
        self,
        args: ModelArgs,
        w: dict[str, torch.Tensor | PackedLinear | QuantLinear],
        index: int = 0,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.args, self.index, self.reduce = args, index, reduce
        self.w = w
        self.scale = args.head_dim**-0.5
        self.q_size = args.num_heads * args.head_dim
        self.kv_size = args.num_kv_heads * args.head_dim

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttnMeta,
        lora: LoraDelta | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a, w = self.args, self.w
        T = x.shape[0]
        res: torch.Tensor  # the residual stream this layer hands on
        if residual is None:  # first layer: x is the stream
            res = x
            h, _ = dispatch.rms_norm(x, w["input_norm"], a.rms_norm_eps)
        else:
            h, res = dispatch.rms_norm(x, w["input_norm"], a.rms_norm_eps, residual)
        qkv = dispatch.linear(h, w["qkv"], w.get("qkv_bias"))  # [T, (H + 2Hkv) D]
        if lora is not None:
            lora.apply(self.index, "qkv", h, qkv)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(T, a.num_heads, a.head_dim)
        k = k.reshape(T, a.num_kv_heads, a.head_dim)
        v = v.reshape(T, a.num_kv_heads, a.head_dim)
        if a.qk_norm:
            q, _ = dispatch.rms_norm(q, w["q_norm"], a.rms_norm_eps)
            k, _ = dispatch.rms_norm(k, w["k_norm"], a.rms_norm_eps)
        # q, k, v stay views of qkv (packed head rows, token stride wider): every kernel and twin
        # takes them so, and rotary rotates them in place.
        dispatch.rotary_embedding(positions, q, k, cos_sin)
        dispatch.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        o = torch.empty(T, a.num_heads, a.head_dim, dtype=q.dtype, device=q.device)
        nd = meta.num_decode
        if nd:
            dispatch.paged_attention_decode(
                q[:nd], k_cache, v_cache, meta.decode_tables, meta.decode_lens, self.scale, out=o[:nd]
            )
        if T > nd and meta.fresh_prefills is not None:
            for start, end in meta.fresh_prefills:
                a0, a1 = nd + start, nd + end
                dispatch.causal_attention(q[a0:a1], k[a0:a1], v[a0:a1], self.scale, out=o[a0:a1])
        elif T > nd:
            dispatch.paged_attention_prefill(
                q[nd:],
                k_cache,
                v_cache,
                meta.prefill_tables,
                meta.prefill_cu_q,
                meta.prefill_lens,
                self.scale,
                out=o[nd:],
            )
        o = o.reshape(T, self.q_size)
        x = dispatch.linear(o, w["o"])  # [T, E]
        if lora is not None:
            lora.apply(self.index, "o", o, x)
        if self.reduce is not None:
            x = self.reduce(x)
        h, res = dispatch.rms_norm(x, w["post_norm"], a.rms_norm_eps, res)
        gate_up = dispatch.linear(h, w["gate_up"])
        if lora is not None:
            lora.apply(self.index, "gate_up", h, gate_up)
        act = dispatch.silu_and_mul(gate_up)
        x = dispatch.linear(act, w["down"])
        if lora is not None:
            lora.apply(self.index, "down", act, x)
        if self.reduce is not None:
            x = self.reduce(x)
        return x, res


class LlamaModel:
    def __init__(
        self,
        args: ModelArgs,
        weights: dict[str, torch.Tensor | QuantLinear],
        max_pos: int,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.args = args
        # [V, E]: a tensor, or a QuantLinear (a GGUF's quantized embedding, looked up row by row)
        self.embed = weights["model.embed_tokens.weight"]
        norm = weights["model.norm.weight"]
        assert isinstance(norm, torch.Tensor), "norm weights are never quantized"
        self.norm = norm
        # None on tensor-parallel ranks > 0: only rank 0 samples (shard.py)
        # (tied: the embedding itself, unpacked: the lookup needs it and a packed copy would double it;
        # untied: packed, and the loader's unpacked reference dropped)
        if args.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            head = weights.pop("lm_head.weight", None)
            self.lm_head = dispatch.pack_linear(head) if head is not None else None
        self.layers = [
            Layer(args, _layer_weights(weights, i, args), i, reduce) for i in range(args.num_layers)
        ]
        self.rope = Rope(args.rope, args.head_dim, args.max_position_embeddings)
        self.max_pos = max_pos
        self.cos_sin = self.rope.cache(max_pos, self.embed.device)

    def rotary_inputs(
        self, positions: list[int], lens: list[int] | None
    ) -> tuple[list[int], torch.Tensor | None]:
        """What the rotary kernel reads for tokens at `positions`: (cache rows, None) to index
        `cos_sin` with, or (0..T-1, a [T, D] table of the step's own rows). `lens` is None for the
        static types (rows = positions); for dynamic and longrope it holds each token's
        max(prompt length, position + 1), whose frequencies rotate it (models/rope.py): longrope's
        long rows sit in `cos_sin` after the short ones, dynamic NTK past max_position_embeddings
        needs per-step rows."""
        if lens is None:
            return positions, None
        rows = self.rope.indices(positions, lens, self.max_pos)
        if rows is not None:
            return rows, None
        return list(range(len(positions))), self.rope.rows(positions, lens, self.cos_sin.device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMeta,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        lora: LoraDelta | None = None,
        cos_sin: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, E] (LoRA deltas per token when given).
        `positions` index `cos_sin`, the model's cache unless a step's own rows are given
        (`rotary_inputs`)."""
        table = self.cos_sin if cos_sin is None else cos_sin
        x = dispatch.embedding(input_ids, self.embed, self.norm.dtype)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x, residual = layer.forward(x, residual, positions, table, k_cache, v_cache, meta, lora)
        x, _ = dispatch.rms_norm(x, self.norm, self.args.rms_norm_eps, residual)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, E] -> [B, V] float32."""
        return dispatch.head_linear(hidden, self.lm_head).float()


def _layer_weights(
    w: dict[str, torch.Tensor | QuantLinear], i: int, args: ModelArgs
) -> dict[str, torch.Tensor | PackedLinear | QuantLinear]:
    p = f"model.layers.{i}."
    qkv = cat_rows([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], f"{p}qkv")
    gate_up = cat_rows([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]], f"{p}gate_up")
    out: dict[str, torch.Tensor | PackedLinear | QuantLinear] = {
        "input_norm": w[p + "input_layernorm.weight"],
        "post_norm": w[p + "post_attention_layernorm.weight"],
        # the GEMM weights in the form dispatch.linear runs fastest (oneDNN-packed on CPU float32;
        # quantized ones stay so: QuantLinear, the fused ones concatenated by rows)
        "qkv": dispatch.pack_linear(qkv),
        "o": dispatch.pack_linear(w[p + "self_attn.o_proj.weight"]),
        "gate_up": dispatch.pack_linear(gate_up),
        "down": dispatch.pack_linear(w[p + "mlp.down_proj.weight"]),
    }
    if args.qkv_bias:
        out["qkv_bias"] = cat_rows([w[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])  # float tensors
    if args.qk_norm:
        out["q_norm"] = w[p + "self_attn.q_norm.weight"]
        out["k_norm"] = w[p + "self_attn.k_norm.weight"]
    # the layer holds what it runs: drop the loader's references, so unfused and unpacked copies go
    for name in ("q", "k", "v", "o"):
        w.pop(p + f"self_attn.{name}_proj.weight", None)
    for name in ("gate", "up", "down"):
        w.pop(p + f"mlp.{name}_proj.weight", None)
    return out


def expected_weight_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor name the model reads, with its shape: used by dummy loading and checks."""
    E, D = args.hidden_size, args.head_dim
    q, kv = args.num_heads * D, args.num_kv_heads * D
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (args.vocab_size, E),
        "model.norm.weight": (E,),
    }
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, E)
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (E,),
                p + "post_attention_layernorm.weight": (E,),
                p + "self_attn.q_proj.weight": (q, E),
                p + "self_attn.k_proj.weight": (kv, E),
                p + "self_attn.v_proj.weight": (kv, E),
                p + "self_attn.o_proj.weight": (E, q),
                p + "mlp.gate_proj.weight": (args.intermediate_size, E),
                p + "mlp.up_proj.weight": (args.intermediate_size, E),
                p + "mlp.down_proj.weight": (E, args.intermediate_size),
            }
        )
        if args.qkv_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (q,),
                    p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,),
                }
            )
        if args.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
    return shapes
