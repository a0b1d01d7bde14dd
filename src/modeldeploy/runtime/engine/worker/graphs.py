"""Decode steps replayed from captured CUDA graphs: a small batch's launch overhead paid once, at load.

A decode step of a small batch is dominated by launches, not arithmetic: each layer launches about
ten kernels (norms, four matmuls, rotary, the KV write, attention), each costing microseconds of
Python and driver work while the GPU does little. A CUDA graph records one step's launches and replays
them in one call. vLLM and gpt-fast capture decode the same way; prefill (long, variable) stays eager.

Only pure-decode steps replay: no prefill chunk, no LoRA adapter in the batch (their slots vary per
step), no tensor parallelism (the all-reduce is host-driven), no step with its own cos/sin rows
(dynamic NTK RoPE past max_position_embeddings, models/rope.py: the graphs read the model's cache).
Anything else runs eagerly, so the flag never changes what is served, only how fast. A batch of n
is padded up to the captured bucket b >= n: the padded rows write their KV nowhere (slot -1, which
every write_kv path skips), attend position 0 of block 0 (read only) and are dropped. Block tables
are always max_blocks_per_seq wide, so the attention kernel's partitioning (chosen from the table
width) is fixed at capture.

On CPU there is no graph: `DecodeGraphs(capture=False)` runs the same static, padded buffers eagerly.
That is what CI checks (tests/runtime/engine/worker/test_graphs.py: padded and unpadded steps agree,
greedy output identical); tests/gpu/test_gpu_graphs.py checks captured replay against eager on the GPU.
"""

from __future__ import annotations

import bisect

import torch

from modeldeploy.runtime.models.llama import AttnMeta, LlamaModel

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # batch sizes captured (up to max_num_seqs)


def buckets_for(max_batch: int) -> list[int]:
    return [b for b in BUCKETS if b < max_batch] + [max_batch]


class DecodeInputs:
    """A decode step's inputs in static buffers for up to `rows` sequences: token ids, positions, KV
    slots, block tables (`max_blocks` wide) and context lengths. What the captured graphs read here
    and `cpu_decode.py`'s replayed kernel calls read on CPU: their addresses never change."""

    def __init__(self, rows: int, max_blocks: int, device: torch.device):
        self.ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.pos = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slots = torch.full((rows,), -1, dtype=torch.int64, device=device)
        self.tables = torch.zeros(rows, max_blocks, dtype=torch.int32, device=device)
        self.lens = torch.ones(rows, dtype=torch.int32, device=device)

    def fill(
        self,
        ids: list[int],
        positions: list[int],
        slots: list[int],
        tables: list[list[int]],
        lens: list[int],
        rows: int,
    ) -> None:
        """Rows [0, rows) from a step of n = len(ids) sequences; rows n.. are padding (token 0 at
        position 0, slot -1: written nowhere, block 0, length 1). Table columns past a row's
        blocks are 0."""
        n, pad = len(ids), rows - len(ids)
        host = torch.tensor(
            [*ids, *[0] * pad, *positions, *[0] * pad, *slots, *[-1] * pad], dtype=torch.int64
        ).view(3, rows)
        self.ids[:rows].copy_(host[0], non_blocking=True)
        self.pos[:rows].copy_(host[1], non_blocking=True)
        self.slots[:rows].copy_(host[2], non_blocking=True)
        widest = max(len(t) for t in tables)
        flat = [x for t in tables for x in (t + [0] * (widest - len(t)))]
        self.tables[:n, :widest].copy_(
            torch.tensor(flat, dtype=torch.int32).view(n, widest), non_blocking=True
        )
        self.tables[:n, widest:] = 0
        self.tables[n:rows] = 0
        self.lens[:rows].copy_(torch.tensor([*lens, *[1] * pad], dtype=torch.int32), non_blocking=True)


class DecodeGraphs:
    """Static input buffers, one captured graph per bucket (or none: eager), and `run` for a decode plan."""

    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_batch: int,
        max_blocks: int,
        device: torch.device,
        capture: bool = True,
    ):
        self.model, self.kv_caches, self.device = model, kv_caches, device
        self.buckets = buckets_for(max_batch)
        self.inputs = DecodeInputs(self.buckets[-1], max_blocks, device)
        self._no_prefill = (
            torch.zeros(0, max_blocks, dtype=torch.int32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device),
            torch.zeros(0, dtype=torch.int32, device=device),
        )
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.replays = 0  # steps served by a graph (eager static runs on CPU count too)
        if capture:
            self._capture()

    def _forward(self, b: int) -> torch.Tensor:
        tables, cu, lens = self._no_prefill
        i = self.inputs
        meta = AttnMeta(
            slot_mapping=i.slots[:b],
            num_decode=b,
            decode_tables=i.tables[:b],
            decode_lens=i.lens[:b],
            prefill_tables=tables,
            prefill_cu_q=cu,
            prefill_lens=lens,
        )
        return self.model.forward(i.ids[:b], i.pos[:b], meta, self.kv_caches)

    @torch.inference_mode()
    def _capture(self) -> None:
        """Warm every bucket up on a side stream (kernels compiled, allocator settled), then capture the
        largest first into one memory pool the smaller ones reuse."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for b in self.buckets:
                self._forward(b)
        torch.cuda.current_stream(self.device).wait_stream(side)
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.buckets):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = self._forward(b)
            self.graphs[b] = (g, out)
        torch.cuda.synchronize(self.device)

    def eligible(self, num_tokens: int, num_decode: int, has_lora: bool) -> bool:
        """A step replays when every token is a decode, no row uses an adapter and it fits a bucket."""
        return not has_lora and 0 < num_decode == num_tokens <= self.buckets[-1]

    def run(
        self, ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]], lens: list[int]
    ) -> torch.Tensor:
        """Hidden states [n, E] of a decode batch of n, through the bucket's graph (or eagerly)."""
        n = len(ids)
        b = self.buckets[bisect.bisect_left(self.buckets, n)]
        self.inputs.fill(ids, positions, slots, tables, lens, b)
        self.replays += 1
        if b in self.graphs:
            graph, out = self.graphs[b]
            graph.replay()
            return out[:n]
        return self._forward(b)[:n]
