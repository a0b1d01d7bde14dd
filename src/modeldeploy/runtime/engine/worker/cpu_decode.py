"""Decode steps on CPU as one flat list of kernel calls over static buffers: graphs.py's CUDA
graphs, as far as a CPU has an analogue.

Why: a decode step of a small batch on the real model (30 layers) is short on arithmetic and long
on dispatch. At batch 1 on the Q4_1 GGUF, 8.6 ms of a 14.4 ms step were the GEMVs and most of
the rest the ten dispatches per layer around them: Python checks, tensor allocations, then a
ctypes call to a kernel that itself runs for microseconds (bench/results/serving_real_cpu.md,
"Decode on the kernels' own calls"). Here the checks are made once, for the whole model, when
the runner is built. Each step copies its inputs into static buffers and makes the same C calls,
with the same pointers and the same arguments, that the generic path would make.

Eligible (`CpuDecode.build` says why not, and the runner keeps its generic path):
- CPU float32 weights and KV cache, with both C++ kernel objects loaded;
- every layer GEMM a QuantLinear, a plain float32 weight (the float32 default on Intel CPUs) or a
  oneDNN-packed one (the default elsewhere; `kernels/cpu_gemm.py`). The packed ones run as the
  torch op they are, its result copied into the static buffer: the only calls left in Python;
- no q/k/v bias, no q/k norm, one rank;
- MODELDEPLOY_CPU_DECODE not "0".

Per step it also needs: decode-only, no LoRA adapter, and at most `max_rows` sequences, the rows up
to which `dispatch.linear` sends these weights to the same GEMM kernel. A step with its own cos/sin
rows (dynamic NTK RoPE past max_position_embeddings: models/rope.py) copies them into a static
buffer of its own, which a second set of calls rotates from (rows 0..n-1). So the hidden states are
bit-identical to the generic path's (tests/runtime/engine/worker/test_cpu_decode.py); this changes
speed, never output.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from modeldeploy.kernels import dispatch
from modeldeploy.kernels.cpu_gemm import PackedLinear
from modeldeploy.kernels.quant import QuantLinear
from modeldeploy.runtime.engine.worker.graphs import DecodeInputs
from modeldeploy.runtime.models.llama import LlamaModel

log = logging.getLogger("modeldeploy.engine")

ENV_SWITCH = "MODELDEPLOY_CPU_DECODE"  # "0": every step through the generic path
F32 = 0  # the kernels' dtype code for float32
GEMMS = ("qkv", "o", "gate_up", "down")

# (C function or a closure, its arguments, what a nonzero return means)
Call = tuple[Callable[..., Any], tuple[Any, ...], str]
Weight = torch.Tensor | QuantLinear | PackedLinear


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class CpuDecode:
    """Static buffers for up to `max_rows` decoding sequences, and `run` for one decode step."""

    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        kernels: dispatch.CpuKernels,
        max_rows: int,
        max_blocks: int,
    ):
        a = model.args
        self.model, self.kv_caches, self.k = model, kv_caches, kernels
        self.max_rows, self.width = max_rows, max_blocks
        R, E, D = max_rows, a.hidden_size, a.head_dim
        self.q_size, self.kv_size = a.num_heads * D, a.num_kv_heads * D
        self.qkv_size = self.q_size + 2 * self.kv_size
        self.inter = a.intermediate_size
        f32 = torch.float32
        self.inputs = DecodeInputs(R, max_blocks, torch.device("cpu"))
        self.res, self.x, self.h = (torch.zeros(R, E, dtype=f32) for _ in range(3))
        self.qkv = torch.zeros(R, self.qkv_size, dtype=f32)
        self.o = torch.zeros(R, self.q_size, dtype=f32)
        self.gate_up = torch.zeros(R, 2 * self.inter, dtype=f32)
        self.act = torch.zeros(R, self.inter, dtype=f32)
        self.hidden = torch.zeros(R, E, dtype=f32)
        # a step's own cos/sin rows (length-dependent RoPE), read at rows 0..n-1
        self.rope_pos = torch.arange(R, dtype=torch.int64)
        self.rope_rows = torch.zeros(R, D, dtype=f32) if model.rope.length_dependent else None
        self._calls: dict[tuple[int, int, bool], list[Call]] = {}
        self.steps = 0  # steps served here (tests and the bench read it)

    @classmethod
    def build(
        cls, model: LlamaModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], max_blocks: int
    ) -> CpuDecode | str:
        """A CpuDecode for this model, or why its steps stay generic (also logged)."""
        why = cls.unsupported(model, kv_caches)
        kernels = dispatch.cpu_kernels() if why is None else why
        if isinstance(kernels, str):
            log.info("CPU decode steps: generic path (%s)", kernels)
            return kernels
        weights = [layer.w[n] for layer in model.layers for n in GEMMS]
        rows = kernels.quant_max_rows
        if any(isinstance(w, torch.Tensor) for w in weights):
            rows = min(rows, kernels.float_max_rows)
        if any(isinstance(w, PackedLinear) for w in weights):
            rows = min(rows, kernels.packed_max_rows)
        built = cls(model, kv_caches, kernels, rows, max_blocks)
        log.info("CPU decode steps: %s", built.describe())
        return built

    def describe(self) -> str:
        """For the log and /v1/bundle `engine_info.kernels.decode_steps`."""
        return f"static kernel calls up to {self.max_rows} sequences"

    @staticmethod
    def unsupported(model: LlamaModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> str | None:
        """Why this model's decode steps cannot be replayed here, or None."""
        a = model.args
        if os.environ.get(ENV_SWITCH, "1") == "0":
            return f"{ENV_SWITCH}=0"
        if not kv_caches or kv_caches[0][0].device.type != "cpu" or kv_caches[0][0].dtype != torch.float32:
            return "not a CPU float32 KV cache"
        if model.norm.dtype != torch.float32:
            return f"model dtype {model.norm.dtype}"
        if a.qkv_bias or a.qk_norm:
            return "q/k/v bias or q/k norm"
        for layer in model.layers:
            if layer.reduce is not None:
                return "tensor parallelism"
            for name in GEMMS:
                w = layer.w[name]
                if isinstance(w, QuantLinear):
                    if w.device.type != "cpu":
                        return "a weight off the CPU"
                elif isinstance(w, PackedLinear):
                    continue
                elif not (isinstance(w, torch.Tensor) and w.dtype == torch.float32 and w.is_contiguous()):
                    return f"a {type(w).__name__} weight"
                elif w.shape[1] % 32:
                    return f"a weight of {w.shape[1]} inputs, not a multiple of 32"
        return None

    def eligible(self, num_tokens: int, num_decode: int, has_lora: bool) -> bool:
        """A step runs here when every token is a decode, no row uses an adapter and it fits."""
        return not has_lora and 0 < num_decode == num_tokens <= self.max_rows

    def _gemm(self, w: Weight, x: torch.Tensor, n: int, out: torch.Tensor, threads: int) -> Call:
        """The call `dispatch.linear(x[:n], w)` makes for these weights at n <= max_rows rows."""
        if isinstance(w, PackedLinear):
            rows_in, rows_out = x[:n], out[:n]

            def packed() -> None:  # oneDNN's op allocates its result: copied into the buffer
                rows_out.copy_(dispatch.linear(rows_in, w))

            return packed, (), ""
        if isinstance(w, QuantLinear):
            args = (w.bits, _ptr(x), n, w.in_features, _ptr(w.qweight), _ptr(w.scales), _ptr(w.zeros))
            return self.k.gemm.mdq_linear, (*args, w.out_features, _ptr(out), threads), ""
        args = (32, _ptr(x), n, w.shape[1], _ptr(w), None, None, w.shape[0], _ptr(out), threads)
        return self.k.gemm.mdq_linear, args, ""

    def _norm(self, w: Weight, x: torch.Tensor, first: bool, out: torch.Tensor, n: int, threads: int) -> Call:
        """`dispatch.rms_norm(x, w, eps, residual)`: the residual stream `self.res` is x + residual,
        updated in place (each element read, then written, by the same iteration); the first
        layer's has no residual (its input is the stream)."""
        assert isinstance(w, torch.Tensor), "norm weights are plain tensors"
        E, eps = self.res.shape[1], float(self.model.args.rms_norm_eps)
        res = None if first else _ptr(self.res)
        args = (F32, _ptr(x), E, res, 0 if first else E, res, _ptr(w), _ptr(out), n, E, eps, threads)
        return self.k.attention.md_rms_norm, args, ""

    def _layer_calls(self, i: int, n: int, threads: int, own_rows: bool = False) -> list[Call]:
        """Layer i's calls, in `Layer.forward`'s order (the same arguments its dispatches pass);
        `own_rows`: rotary reads the step's rows in `rope_rows` instead of the model's cache."""
        a, at, w, (kc, vc) = self.model.args, self.k.attention, self.model.layers[i].w, self.kv_caches[i]
        H, Hkv, D, S, width = a.num_heads, a.num_kv_heads, a.head_dim, kc.shape[1], self.qkv_size
        q = self.qkv.data_ptr()  # q, k, v: views of one [n, width] row block, as in the generic path
        k, v = q + 4 * self.q_size, q + 4 * (self.q_size + self.kv_size)
        inputs, cs = self.inputs, self.model.cos_sin
        pos, slots, tables, lens = (_ptr(t) for t in (inputs.pos, inputs.slots, inputs.tables, inputs.lens))
        if own_rows:
            assert self.rope_rows is not None, "own cos/sin rows on a model with static RoPE"
            pos, cs = _ptr(self.rope_pos), self.rope_rows
        num_slots, scale = kc.shape[0] * S, float(self.model.layers[i].scale)
        rotary = (F32, pos, q, width, H, k, width, Hkv, n, D, _ptr(cs), cs.shape[0])
        write = (4, k, width, v, width, _ptr(kc), _ptr(vc), slots, n, Hkv * D, num_slots)
        attn = (F32, q, width, _ptr(kc), _ptr(vc), tables, self.width, lens, _ptr(self.o), n, H, Hkv, D, S)
        silu = (F32, _ptr(self.gate_up), 2 * self.inter, _ptr(self.act), n, self.inter, threads)
        return [
            self._norm(w["input_norm"], self.res if i == 0 else self.x, i == 0, self.h, n, threads),
            self._gemm(w["qkv"], self.h, n, self.qkv, threads),
            (at.md_rotary, rotary, f"position(s) outside the cos/sin cache ({cs.shape[0]})"),
            (at.md_write_kv, write, f"slot(s) outside the cache ({num_slots} slots)"),
            (at.md_paged_decode, (*attn, scale, threads), ""),
            self._gemm(w["o"], self.o, n, self.x, threads),
            self._norm(w["post_norm"], self.x, False, self.h, n, threads),
            self._gemm(w["gate_up"], self.h, n, self.gate_up, threads),
            (at.md_silu_and_mul, silu, ""),
            self._gemm(w["down"], self.act, n, self.x, threads),
        ]

    def _calls_for(self, n: int, threads: int, own_rows: bool) -> list[Call]:
        """Every C call of a step of n sequences: the layers', then the final norm."""
        layers = range(len(self.model.layers))
        calls = [c for i in layers for c in self._layer_calls(i, n, threads, own_rows)]
        return [*calls, self._norm(self.model.norm, self.x, False, self.hidden, n, threads)]

    def run(
        self,
        ids: list[int],
        positions: list[int],
        slots: list[int],
        tables: list[list[int]],
        lens: list[int],
        cos_sin: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states [n, E] of a decode step of n sequences (a view of a static buffer,
        valid until the next step). `positions` index the model's cos/sin cache, or with `cos_sin`
        ([n, D], the step's own rows: `LlamaModel.rotary_inputs`) row t rotates token t."""
        n = len(ids)
        self.inputs.fill(ids, positions, slots, tables, lens, n)
        own_rows = cos_sin is not None
        if cos_sin is not None:
            assert self.rope_rows is not None, "own cos/sin rows on a model with static RoPE"
            self.rope_rows[:n].copy_(cos_sin)
        self.res[:n].copy_(dispatch.embedding(self.inputs.ids[:n], self.model.embed, torch.float32))
        threads = torch.get_num_threads()
        calls = self._calls.get((n, threads, own_rows))
        if calls is None:
            calls = self._calls[(n, threads, own_rows)] = self._calls_for(n, threads, own_rows)
        for fn, args, bad in calls:
            if fn(*args) and bad:
                raise IndexError(f"decode step: {bad}")
        self.steps += 1
        return self.hidden[:n]
