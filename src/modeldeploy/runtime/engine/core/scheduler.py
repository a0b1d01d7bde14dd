"""Continuous batching: which sequences run this step, and how many tokens each.

FCFS. Running sequences go first, decodes (one token each) before unfinished prefills (the
next chunk), then waiting ones are admitted while the token budget, the sequence limit and the
free blocks allow. When blocks run out, the most recently admitted running sequence is
preempted: its blocks are released and it is recomputed later.

With a target step time (EngineConfig.target_itl_ms) the prefill tokens of a step that also
decodes are bounded by time as well as by the token budget: `PrefillCost` learns, from the steps
the engine reports, a decode-only step's seconds and the seconds per prefill token, and the step
gets the prefill tokens that fit in what the decodes leave of the target, and never less than the
decodes' own time (nor MIN_PREFILL_CHUNK), so prompts still progress when decoding alone fills it. Decoding
streams then see one step per token at about the target, instead of a step that carries a whole
long prompt chunk (vLLM's chunked-prefill policy, with the chunk from measured cost, as in
Sarathi-Serve's stall-free batching).

`prefill_order="shortest"` serves prefills shortest-remaining-first instead: running chunks and
waiting prompts together, by prompt tokens left, except that a prompt waiting longer than AGE_S goes
first (arrival order among those), so long prompts still finish under a stream of short ones; and
with a target step time every step's prefill is bounded by it, decodes or not. Why: on 2 CPU cores a
1536-token prompt takes ~1.7 s as one step, and a short prompt arriving meanwhile waited for all of
it, missing a 1.5 s TTFT that its own prefill (~0.1 s) would meet (bench/results/serving_real_cpu.md).
With a TTFT target as well (target_ttft_s), a prompt whose remaining prefill (its tokens at the
learned per-token cost) still fits before its deadline (arrival + target) keeps its place in arrival
order ahead of the shortest-first rest, cut by the token budget only, and one that can no longer
make it falls behind them, its share of a step bounded by the target step time: a long prompt that
can meet the target is neither overtaken nor cut into extra steps into missing it (measured: on int8
prefill a 1536-token prompt takes ~1.2 s, and shortest-first in 500 ms steps pushed it to 1.5-2.2 s),
and one that cannot (float32: ~2 s) does not hold up the prompts that can, which overtake it at the
next step. The default on CPU: shortest with a 500 ms step and a 1500 ms TTFT target (EngineConfig
prefill_order "auto", resolve_schedule).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from modeldeploy.runtime.engine.core.block_manager import BlockManager
from modeldeploy.runtime.engine.core.sequence import Sequence, Status

MIN_PREFILL_CHUNK = 32  # tokens a step's prefill always gets: progress when decodes alone fill the target
COLD_PREFILL_CHUNK = 64  # before any prefill has been measured
AGE_S = 4.0  # prefill_order "shortest": a prompt waiting longer than this goes first


class PrefillCost:
    """Seconds a step costs, learned online from the steps run (exponentially weighted, so it follows
    a machine whose load changes): a decode-only step's time by decode rows (power-of-two buckets),
    and the seconds per prefill token over what the decodes cost. Pure: the engine reports each
    step's rows and measured seconds; tests feed it made-up times."""

    def __init__(self, alpha: float = 0.25, min_sample_tokens: int = 16):
        self.alpha = alpha
        self.min_sample_tokens = min_sample_tokens  # smaller chunks: noise swamps the per-token figure
        self.decode_by_bucket: dict[int, float] = {}
        self.per_token_s: float | None = None

    def _ewma(self, old: float | None, sample: float) -> float:
        return sample if old is None else old + self.alpha * (sample - old)

    def decode_s(self, decodes: int) -> float:
        """A decode-only step's seconds at `decodes` rows (the nearest measured bucket; 0 if none)."""
        if decodes <= 0 or not self.decode_by_bucket:
            return 0.0
        b = decodes.bit_length()
        near = min(self.decode_by_bucket, key=lambda k: (abs(k - b), -k))
        return self.decode_by_bucket[near]

    def observe(self, decodes: int, prefill_tokens: int, seconds: float) -> None:
        if prefill_tokens == 0:
            if decodes > 0:
                b = decodes.bit_length()
                self.decode_by_bucket[b] = self._ewma(self.decode_by_bucket.get(b), seconds)
            return
        if prefill_tokens < self.min_sample_tokens:
            return
        sample = max(seconds - self.decode_s(decodes), 0.0) / prefill_tokens
        self.per_token_s = self._ewma(self.per_token_s, sample)

    def prefill_tokens(self, target_s: float, decodes: int) -> int:
        """Prefill tokens a step with `decodes` decode rows may carry to stay under `target_s`."""
        if self.per_token_s is None:
            return COLD_PREFILL_CHUNK
        # Where the decodes alone take most of the target (a loaded machine, a big batch), prefill still
        # gets as much time as they do: a step lasts at most max(target, 2 x decode-only), and prompts
        # keep being served at half the machine instead of MIN_PREFILL_CHUNK a step (measured: with the
        # floor at MIN_PREFILL_CHUNK alone, queued prompts piled up once decode steps passed the target).
        decode = self.decode_s(decodes)
        left = max(target_s - decode, decode)
        if self.per_token_s <= 0:
            return 1 << 30
        return max(MIN_PREFILL_CHUNK, int(left / self.per_token_s))


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
        target_step_s: float | None = None,
        cost: PrefillCost | None = None,
        prefill_order: str = "fcfs",
        target_ttft_s: float | None = None,
    ):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.token_budget = max_num_batched_tokens  # tokens per step (not SamplingParams.max_tokens)
        self.chunked = enable_chunked_prefill
        self.max_adapters = max_adapters  # distinct LoRA adapters running at once (device slots)
        # The time bound needs chunks: a whole prompt cannot be cut to fit (EngineConfig.validate).
        self.target_step_s = target_step_s if enable_chunked_prefill else None
        self.cost = cost if cost is not None else PrefillCost()
        self.shortest_first = prefill_order == "shortest"
        self.target_ttft_s = target_ttft_s  # "shortest" only: prompts that can meet it keep arrival order
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions_total = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def observe(self, batch: ScheduledBatch, seconds: float) -> None:
        """The engine ran `batch` in `seconds` (the whole step): the cost model learns from it."""
        decodes = sum(1 for n in batch.num_tokens if n == 1)
        self.cost.observe(decodes, sum(n for n in batch.num_tokens if n > 1), seconds)

    def schedule(self) -> ScheduledBatch:
        picked: dict[str, int] = {}
        preempted = 0
        # decodes first: a decoding stream's next token never waits behind a prompt's chunk
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        stalled = False
        for seq in decodes:
            if seq.status is Status.RUNNING and self._room(picked) > 0:
                ok, p = self._grow(seq, 1, picked)
                preempted += p
                if not ok:
                    stalled = True
                    break
        prefill_left = self._prefill_limit(len(picked))
        if not stalled:
            preempted += self._prefills(picked, prefill_left)
        return self._batch(picked, preempted)

    def _take_running(self, seq: Sequence, budget: int, picked: dict[str, int]) -> tuple[int, bool, int]:
        """The next chunk of a running prefill: (tokens, whether `seq` still runs, preemptions)."""
        n = self._chunk(seq.num_uncomputed_tokens, budget)
        if n == 0:
            return 0, True, 0
        ok, p = self._grow(seq, n, picked)
        return n, ok, p

    def _take_waiting(self, seq: Sequence, budget: int, picked: dict[str, int]) -> int:
        """Admit a waiting prompt with its first chunk where the budget, blocks and adapter slots
        allow: its tokens, else 0."""
        hits = self.bm.match_prefix(seq)
        n = self._chunk(seq.num_tokens - len(hits) * self.bm.block_size, budget)
        if budget <= 0 or n == 0 or not self.bm.can_admit(seq, hits, n) or not self._adapter_fits(seq):
            return 0
        self._admit(seq, hits, n, picked)
        return n

    def _batch(self, picked: dict[str, int], preempted: int) -> ScheduledBatch:
        order = [s for s in self.running if s.request_id in picked]
        order.sort(
            key=lambda s: not (picked[s.request_id] == 1 and s.num_uncomputed_tokens == 1)
        )  # decodes first
        return ScheduledBatch(order, [picked[s.request_id] for s in order], preempted)

    def _admit(self, seq: Sequence, hits: list, n: int, picked: dict[str, int]) -> None:
        self.waiting.remove(seq)
        self.bm.admit(seq, hits)
        self.bm.grow(seq, seq.num_computed_tokens + n)
        seq.status = Status.RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
        self.running.append(seq)
        picked[seq.request_id] = n

    def _prefills(self, picked: dict[str, int], prefill_left: int) -> int:
        """Prompt chunks for this step from one line: running prefills, then waiting prompts, in
        arrival order (fcfs); or (shortest) aged ones (waiting > AGE_S) by arrival, then the rest by
        prompt tokens left. The line stops at the first prompt that cannot have its share (blocks,
        sequence limit, adapter slots; no admission after a preemption), so nothing behind it
        overtakes it. Returns preemptions."""
        line = [s for s in self.running if s.request_id not in picked] + list(self.waiting)
        ranks: dict[str, tuple[int, float, float]] = {}
        if self.shortest_first:
            now = time.monotonic()
            ranks = {s.request_id: self._rank(s, now) for s in line}
            line.sort(key=lambda s: ranks[s.request_id])
        preempted = taken = 0
        for seq in line:
            limit = prefill_left
            if ranks and ranks[seq.request_id][0] == 1:  # rank 1 exists only with a TTFT target
                # it can meet its deadline: only the token budget cuts it. A later arrival that can
                # too waits for it anyway (earliest deadline first); a time bound would only add steps
                limit = self.token_budget
            budget = min(self._room(picked), limit - taken)
            if budget <= 0:
                break
            if seq.status is Status.RUNNING:
                n, ok, p = self._take_running(seq, budget, picked)
                preempted += p
                if not ok:
                    break
            else:  # waiting, or preempted by a chunk earlier in this line
                if preempted or len(self.running) >= self.max_num_seqs:
                    break
                n = self._take_waiting(seq, budget, picked)
                if n == 0:
                    break
            taken += n
        return preempted

    def _rank(self, seq: Sequence, now: float) -> tuple[int, float, float]:
        """Place in the shortest-first line: aged prompts by arrival; then, with a TTFT target, those
        that can still meet it by arrival (earliest deadline first); then the rest by tokens left."""
        waited = now - seq.arrival_time
        if waited > AGE_S:
            return (0, seq.arrival_time, 0)
        per_token = self.cost.per_token_s
        if self.target_ttft_s is not None and per_token is not None:
            # a preempted stream (its first token long out) recomputes in arrival order: its TTFT is
            # history, and what it waits for now is its next token
            if seq.first_token_time is not None:
                return (1, seq.arrival_time, 0)
            if seq.num_uncomputed_tokens * per_token <= self.target_ttft_s - waited:
                return (1, seq.arrival_time, 0)
        return (2, seq.num_uncomputed_tokens, seq.arrival_time)

    def _room(self, picked: dict[str, int]) -> int:
        return self.token_budget - sum(picked.values())

    def _prefill_limit(self, decodes: int) -> int:
        """Prefill tokens this step may carry: unbounded (the token budget decides) without a target
        or, in arrival order, without decodes (no stream waits on this step); else what fits the
        target's time (shortest-first: also without decodes, so a prompt arriving next waits a
        chunk, not a whole long prompt, once a prefill has been measured: before that, with no
        stream waiting, the first step measures it rather than cut every prompt to the cold chunk)."""
        if self.target_step_s is None or (decodes == 0 and not self.shortest_first):
            return self.token_budget
        if decodes == 0 and self.cost.per_token_s is None:
            return self.token_budget
        return self.cost.prefill_tokens(self.target_step_s, decodes)

    def _grow(self, seq: Sequence, n: int, picked: dict[str, int]) -> tuple[bool, int]:
        """Give `seq` blocks for `n` more tokens, preempting the newest running sequences as needed;
        (False, preempted) when `seq` itself had to go."""
        preempted = 0
        while not self.bm.can_grow(seq, seq.num_computed_tokens + n):
            victim = self.running[-1]
            self._preempt(victim)
            picked.pop(victim.request_id, None)
            preempted += 1
            if victim is seq:
                return False, preempted
        self.bm.grow(seq, seq.num_computed_tokens + n)
        picked[seq.request_id] = n
        return True, preempted

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
