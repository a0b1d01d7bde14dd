"""Runs one forward over a scheduled mixed batch against the paged KV cache.

Owns the model weights and the per-layer KV cache tensors; turns the scheduler's
(sequence, token count) pairs into flat input ids, positions, slot mapping and block
tables, and returns last-token logits for the sequences that will sample this step.
"""

from __future__ import annotations

import torch

from modeldeploy.runtime.engine.lora import AdapterPool
from modeldeploy.runtime.engine.scheduler import ScheduledBatch
from modeldeploy.runtime.engine.sequence import Sequence
from modeldeploy.runtime.loader import Loaded
from modeldeploy.runtime.models.llama import AttnMeta, LlamaModel
from modeldeploy.runtime.models.lora import LoraBatch


class ModelRunner:
    def __init__(
        self,
        loaded: Loaded,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        adapters: AdapterPool | None = None,
    ):
        a = loaded.args
        self.adapters = adapters
        self.device, self.dtype = loaded.device, loaded.dtype
        self.block_size = block_size
        self.max_blocks_per_seq = (max_model_len + block_size - 1) // block_size
        self.model = LlamaModel(a, loaded.weights, max_pos=max(max_model_len, 1))
        shape = (num_blocks, block_size, a.num_kv_heads, a.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(a.num_layers)
        ]

    @staticmethod
    def block_bytes(loaded: Loaded, block_size: int) -> int:
        a = loaded.args
        return 2 * a.num_layers * block_size * a.num_kv_heads * a.head_dim * loaded.dtype.itemsize

    def _tensor(self, data: list, dtype=torch.int32) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype).to(self.device, non_blocking=True)

    def _tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max((len(s.block_table) for s in seqs), default=0)
        return self._tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs]).reshape(
            len(seqs), width
        )

    def _lora(self, rows: list[tuple[Sequence, int]]) -> LoraBatch | None:
        """Each token's adapter slot (-1 = base), or None when no row of the step uses an adapter."""
        used = {s.adapter_id for s, _ in rows if s.adapter_id >= 0}
        if not used:
            return None
        slot = self.adapters.prepare(used)
        token_slots: list[int] = []
        for seq, n in rows:
            token_slots += [slot.get(seq.adapter_id, -1)] * n
        return LoraBatch(self.adapters.slots, self._tensor(token_slots))

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        """Forward the batch; return logits [B, V] float32 for the sequences that sample, and those sequences."""
        ids, pos, slots, sample_rows, sample_seqs = [], [], [], [], []
        decode, prefill, cu, prefill_lens = [], [], [0], []
        bs = self.block_size
        rows = list(zip(batch.seqs, batch.num_tokens, strict=True))
        if self.adapters is not None:  # decodes first as always, then each part grouped by adapter
            rows.sort(key=lambda r: (not (r[1] == 1 and r[0].num_uncomputed_tokens == 1), r[0].adapter_id))
        for seq, n in rows:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            ids.extend(seq.token_ids[start:end])
            pos.extend(range(start, end))
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
        lora = self._lora(rows)
        meta = AttnMeta(
            slot_mapping=self._tensor(slots, torch.int64),
            num_decode=len(decode),
            decode_tables=self._tables(decode),
            decode_lens=self._tensor([s.num_computed_tokens + 1 for s in decode]),
            prefill_tables=self._tables(prefill),
            prefill_cu_q=self._tensor(cu),
            prefill_lens=self._tensor(prefill_lens),
        )
        hidden = self.model.forward(
            self._tensor(ids, torch.int64), self._tensor(pos, torch.int64), meta, self.kv_caches, lora
        )
        logits = self.model.logits(hidden[self._tensor(sample_rows, torch.int64)])
        return logits, sample_seqs
