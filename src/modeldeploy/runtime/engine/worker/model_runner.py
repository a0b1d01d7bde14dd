"""Runs one forward over a scheduled mixed batch against the paged KV cache.

Owns the model weights and the per-layer KV cache tensors; turns the scheduler's
(sequence, token count) pairs into flat input ids, positions, slot mapping and block
tables, and returns last-token logits for the sequences that will sample this step. Under
tensor parallelism the flat batch (a `StepPlan`) goes to the other ranks before rank 0 runs it:
rank 0's runner is handed them as `Ranks` (parallel/tensor_parallel.py's `TensorParallel`), so this
module never imports the package that runs it in the worker ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from modeldeploy.kernels import dispatch
from modeldeploy.runtime.engine.core.scheduler import ScheduledBatch
from modeldeploy.runtime.engine.core.sequence import Sequence
from modeldeploy.runtime.engine.lora.pool import AdapterPool
from modeldeploy.runtime.engine.worker import prompt_logprobs
from modeldeploy.runtime.engine.worker.cpu_decode import CpuDecode
from modeldeploy.runtime.engine.worker.graphs import DecodeGraphs
from modeldeploy.runtime.loader import Loaded
from modeldeploy.runtime.models.llama import AttnMeta, LlamaModel
from modeldeploy.runtime.models.lora import LoraBatch


@dataclass
class StepPlan:
    """One forward's inputs as plain lists: built once on rank 0, sent as is to the other ranks."""

    ids: list[int]
    positions: list[int]
    slots: list[int]
    decode_tables: list[list[int]]
    decode_lens: list[int]
    prefill_tables: list[list[int]]
    prefill_cu: list[int]
    prefill_lens: list[int]
    sample_rows: list[int]
    # dynamic and longrope RoPE only (else None): each token's max(prompt length, position + 1), the
    # sequence length whose frequencies rotate it (models/rope.py), so every rank rotates alike
    rope_lens: list[int] | None = None


class Ranks(Protocol):
    """The other tensor-parallel ranks, as rank 0's runner drives them: each gets the same work first."""

    def run(self, plan: StepPlan) -> None: ...

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None: ...


class ModelRunner:
    """Rank 0's runner plans each step and runs its shard; a tensor-parallel worker's runner
    (`ranks` None, `lm_head` absent) only executes plans it receives (parallel/rank_worker.py)."""

    def __init__(
        self,
        loaded: Loaded,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        adapters: AdapterPool | None = None,
        ranks: Ranks | None = None,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        a = loaded.rank_args
        self.adapters, self.ranks = adapters, ranks
        self.device, self.dtype = loaded.device, loaded.dtype
        self.block_size = block_size
        self.vocab_size = a.vocab_size
        self.max_blocks_per_seq = (max_model_len + block_size - 1) // block_size
        self.model = LlamaModel(a, loaded.weights, max_pos=max(max_model_len, 1), reduce=reduce)
        shape = (num_blocks, block_size, a.num_kv_heads, a.head_dim)  # this rank's kv heads
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(a.num_layers)
        ]
        self.graphs: DecodeGraphs | None = None  # capture_graphs(): pure-decode steps replay (graphs.py)
        # decode-only steps on CPU as static kernel calls where the model allows (cpu_decode.py)
        self.cpu_decode: CpuDecode | None = None
        self.decode_steps = "generic (not a single-rank CPU engine)"
        if self.device.type == "cpu" and reduce is None:
            built = CpuDecode.build(self.model, self.kv_caches, self.max_blocks_per_seq)
            self.cpu_decode = built if isinstance(built, CpuDecode) else None
            self.decode_steps = built.describe() if isinstance(built, CpuDecode) else f"generic ({built})"
        # whole fresh prompts through SDPA: only where the paged prefill is the gathering twin
        self.sdpa_fresh = bool(self.kv_caches) and dispatch.sdpa_for_fresh_prompts(self.kv_caches[0][0])

    def capture_graphs(self, max_batch: int, capture: bool = True) -> None:
        """Capture decode steps up to `max_batch` sequences (capture=False: the static buffers, eager)."""
        self.graphs = DecodeGraphs(
            self.model, self.kv_caches, max_batch, self.max_blocks_per_seq, self.device, capture
        )

    def _tensor(self, data: list, dtype=torch.int32) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype).to(self.device, non_blocking=True)

    def _tables(self, rows: list[list[int]]) -> torch.Tensor:
        width = max((len(t) for t in rows), default=0)
        return self._tensor([t + [0] * (width - len(t)) for t in rows]).reshape(len(rows), width)

    def _lora(self, rows: list[tuple[Sequence, int]]) -> LoraBatch | None:
        """Each token's adapter slot (-1 = base), or None when no row of the step uses an adapter."""
        used = {s.adapter_id for s, _ in rows if s.adapter_id >= 0}
        if not used:
            return None
        pool = self.adapters
        if pool is None or pool.slots is None:  # the engine refuses adapter names it has not allocated
            raise RuntimeError(f"lora: adapter ids {sorted(used)} in a step without allocated adapters")
        slot = pool.prepare(used)
        token_slots: list[int] = []
        for seq, n in rows:
            token_slots += [slot.get(seq.adapter_id, -1)] * n
        return LoraBatch(pool.slots, self._tensor(token_slots))

    def _fresh(self, plan: StepPlan) -> list[tuple[int, int]] | None:
        """Each prefill chunk's span when all are whole prompts with nothing cached and SDPA is the
        faster way to attend them (`sdpa_fresh`: CPU without the C++ prefill); None otherwise."""
        cu = plan.prefill_cu
        if not self.sdpa_fresh or len(cu) < 2:
            return None
        spans = list(zip(cu[:-1], cu[1:], strict=True))
        if any(end - start != n for (start, end), n in zip(spans, plan.prefill_lens, strict=True)):
            return None
        return spans

    def plan(self, batch: ScheduledBatch) -> tuple[StepPlan, list[tuple[Sequence, int]], list[Sequence]]:
        """Flatten the batch: decodes first, then prefill chunks; (plan, ordered rows, sampling seqs)."""
        ids, pos, slots, sample_rows, sample_seqs = [], [], [], [], []
        rope_lens: list[int] | None = [] if self.model.rope.length_dependent else None
        decode, prefill, cu, prefill_lens = [], [], [0], []
        bs = self.block_size
        rows = list(zip(batch.seqs, batch.num_tokens, strict=True))
        if self.adapters is not None:  # decodes first as always, then each part grouped by adapter
            rows.sort(key=lambda r: (not (r[1] == 1 and r[0].num_uncomputed_tokens == 1), r[0].adapter_id))
        for seq, n in rows:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            ids.extend(seq.token_ids[start:end])
            pos.extend(range(start, end))
            if rope_lens is not None:  # a prompt's tokens: its length; a later token at p: p + 1
                prompt = seq.num_prompt_tokens
                rope_lens.extend(max(prompt, p + 1) for p in range(start, end))
            slots.extend(seq.block_table[p // bs] * bs + p % bs for p in range(start, end))
            if n == 1 and end == seq.num_tokens and not prefill:
                decode.append(seq)
            else:
                prefill.append(seq)
                cu.append(cu[-1] + n)
                prefill_lens.append(end)
            if end == seq.num_tokens:
                sample_rows.append(len(ids) - 1)
                sample_seqs.append(seq)
        plan = StepPlan(
            ids=ids,
            positions=pos,
            slots=slots,
            decode_tables=[s.block_table for s in decode],  # read (or pickled) before any change
            decode_lens=[s.num_computed_tokens + 1 for s in decode],
            prefill_tables=[s.block_table for s in prefill],
            prefill_cu=cu,
            prefill_lens=prefill_lens,
            sample_rows=sample_rows,
            rope_lens=rope_lens,
        )
        return plan, rows, sample_seqs

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        """Forward the batch; return logits [B, V] float32 for the sequences that sample, and those
        sequences. Sequences that asked for prompt_logprobs get this chunk's prompt scores appended
        (`prompt_logprobs.py`); nothing is computed for the others."""
        plan, rows, sample_seqs = self.plan(batch)
        lora = self._lora(rows) if self.adapters is not None else None
        if self.ranks is not None:
            self.ranks.run(plan)  # the other ranks run the same plan on their shards
        hidden = self.execute(plan, lora)
        if any(s.scores_prompt for s, _ in rows):
            prompt_logprobs.score(hidden, rows, self.model.logits, self.vocab_size)
        logits = self.model.logits(hidden[self._tensor(plan.sample_rows, torch.int64)])
        return logits, sample_seqs

    @torch.inference_mode()
    def execute(self, plan: StepPlan, lora: LoraBatch | None = None) -> torch.Tensor:
        """The forward over this rank's shard: final hidden states [T, E]."""
        # rows of the model's cos/sin cache per token, or the step's own rows (models/llama.py
        # `rotary_inputs`: static types pass the positions through untouched)
        positions, cos_sin = plan.positions, None
        if plan.rope_lens is not None:
            positions, cos_sin = self.model.rotary_inputs(plan.positions, plan.rope_lens)
        g = self.graphs
        # A step with its own cos/sin rows (dynamic NTK past max_position_embeddings) runs eagerly: the
        # captured graphs read the model's cache, whose address they were captured with.
        if (
            g is not None
            and cos_sin is None
            and g.eligible(len(plan.ids), len(plan.decode_lens), lora is not None)
        ):
            return g.run(plan.ids, positions, plan.slots, plan.decode_tables, plan.decode_lens)
        c = self.cpu_decode
        if c is not None and c.eligible(len(plan.ids), len(plan.decode_lens), lora is not None):
            return c.run(plan.ids, positions, plan.slots, plan.decode_tables, plan.decode_lens, cos_sin)
        meta = AttnMeta(
            slot_mapping=self._tensor(plan.slots, torch.int64),
            num_decode=len(plan.decode_lens),
            decode_tables=self._tables(plan.decode_tables),
            decode_lens=self._tensor(plan.decode_lens),
            prefill_tables=self._tables(plan.prefill_tables),
            prefill_cu_q=self._tensor(plan.prefill_cu),
            prefill_lens=self._tensor(plan.prefill_lens),
            fresh_prefills=self._fresh(plan),
        )
        ids, pos = self._tensor(plan.ids, torch.int64), self._tensor(positions, torch.int64)
        return self.model.forward(ids, pos, meta, self.kv_caches, lora, cos_sin)

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks src -> dst in every layer (copy-on-fork of a partial block, n > 1)."""
        if self.ranks is not None:
            self.ranks.copy_blocks(pairs)
        src = torch.tensor([s for s, _ in pairs], dtype=torch.int64, device=self.device)
        dst = torch.tensor([d for _, d in pairs], dtype=torch.int64, device=self.device)
        for k, v in self.kv_caches:
            k[dst] = k[src]
            v[dst] = v[src]
