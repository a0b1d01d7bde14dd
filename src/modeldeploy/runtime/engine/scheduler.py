"""Continuous batching: which sequences run this step, and how many tokens each.

FCFS. Running sequences go first (a decode is one token; an unfinished prefill takes
the next chunk), then waiting ones are admitted while the token budget, the sequence
limit and the free blocks allow. When blocks run out, the most recently admitted
running sequence is preempted: its blocks are released and it is recomputed later.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from modeldeploy.runtime.engine.block_manager import BlockManager
from modeldeploy.runtime.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    """Sequences and their token counts for one step; decodes (1 token, past prefill) first."""

    seqs: list[Sequence]
    num_tokens: list[int]
    num_preempted: int = 0

    @property
    def empty(self) -> bool:
        return not self.seqs


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
        max_adapters: int | None = None,
    ):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.token_budget = max_num_batched_tokens  # tokens per step (not SamplingParams.max_tokens)
        self.chunked = enable_chunked_prefill
        self.max_adapters = max_adapters  # distinct LoRA adapters running at once (device slots)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions_total = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        budget = self.token_budget
        picked: dict[str, int] = {}
        preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq.num_uncomputed_tokens, budget)
            if n == 0:
                i += 1
                continue
            while not self.bm.can_grow(seq, seq.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                picked.pop(victim.request_id, None)
                preempted += 1
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break
            self.bm.grow(seq, seq.num_computed_tokens + n)
            picked[seq.request_id] = n
            budget -= n
            i += 1
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.bm.match_prefix(seq)
            n = self._chunk(seq.num_tokens - len(hits) * self.bm.block_size, budget)
            if n == 0 or not self.bm.can_admit(seq, hits, n) or not self._adapter_fits(seq):
                break
            self.waiting.popleft()
            self.bm.admit(seq, hits)
            self.bm.grow(seq, seq.num_computed_tokens + n)
            seq.status = Status.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            picked[seq.request_id] = n
            budget -= n
        order = [s for s in self.running if s.request_id in picked]
        order.sort(
            key=lambda s: not (picked[s.request_id] == 1 and s.num_uncomputed_tokens == 1)
        )  # decodes first
        return ScheduledBatch(order, [picked[s.request_id] for s in order], preempted)

    def _adapter_fits(self, seq: Sequence) -> bool:
        """FCFS: a sequence whose adapter would need one device slot more than there are waits."""
        if self.max_adapters is None or seq.adapter_id < 0:
            return True
        active = {s.adapter_id for s in self.running if s.adapter_id >= 0}
        return seq.adapter_id in active or len(active) < self.max_adapters

    def _chunk(self, remaining: int, budget: int) -> int:
        if remaining <= budget:
            return remaining
        return budget if self.chunked else 0

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.release(seq)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.preemptions_total += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove a running or waiting sequence and free its blocks."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        self.bm.release(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.finished_time = time.monotonic()

    def adopt(self, seq: Sequence) -> None:
        """Run a sequence forked from a running one (n > 1); it already holds its blocks."""
        seq.status = Status.RUNNING
        self.running.append(seq)
