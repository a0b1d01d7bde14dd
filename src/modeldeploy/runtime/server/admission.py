"""Admission: a bounded queue in front of the engine, by requests, prompt tokens and wait.

At most `max_running` requests are inside the engine; up to `max_queue` more wait for a
slot; anything beyond is refused at once (429 with Retry-After) instead of piling up
latency. Two more bounds keep an overload from turning into hopeless waits:
- `max_queued_tokens`: the prompt tokens waiting together (long prompts wait in a bounded
  queue instead of exhausting the KV cache once admitted); a request alone in the queue is
  always let in, whatever its length;
- a wait budget (the server's `queue_budget_s`, or the client's `x-request-deadline-ms`): a
  request whose estimated wait for a slot exceeds it is refused at once. One that was let in
  and still waited past the budget (the estimate was wrong) is refused when its slot comes only
  if the budget was the client's own deadline (it said a late answer is worthless); under the
  server's budget it is served late and counted (`late_starts`), because a 429 after waiting
  the whole budget is the worst answer: the client loses the wait and the reply (every refusal
  under the server's budget comes at once, bench/results/serving_cpu.md).
The estimate is (requests ahead / slots) x the moving average of how long a request holds a
slot. While draining, nothing new is admitted (503). Refusals are counted by reason; the
counters feed the `modeldeploy_requests_running` / `_waiting` gauges.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter

from modeldeploy.runtime.server.errors import APIError


class Ticket:
    """One request's place: waiting, then running, then released (idempotent)."""

    def __init__(
        self, admission: Admission, tokens: int = 0, deadline: float | None = None, strict: bool = False
    ):
        self._adm = admission
        self.state = "waiting"
        self.tokens, self.deadline = tokens, deadline  # deadline: monotonic, None = no budget
        self.strict = strict  # the deadline is the client's own: refuse past it rather than start late
        self.acquired_at: float | None = None  # monotonic; the request's trace shows the admission wait

    async def acquire(self) -> None:
        if self._adm._sem.locked():  # every slot taken: this request waits (counted, not sampled)
            self._adm.waits += 1
        try:
            await self._adm._sem.acquire()
        except BaseException:
            self.release()
            raise
        if self.state != "waiting":  # released while we waited (e.g. drain abort): give the slot back
            self._adm._sem.release()
            raise asyncio.CancelledError
        self.state = "running"
        self.acquired_at = time.monotonic()
        self._adm.waiting -= 1
        self._adm.queued_tokens -= self.tokens
        self._adm.running += 1
        self._adm.max_running_seen = max(self._adm.max_running_seen, self._adm.running)
        if self.deadline is not None and self.acquired_at > self.deadline:
            if not self.strict:
                self._adm.late_starts += 1
                return
            late = self.acquired_at - self.deadline
            self.release(count_slot=False)
            raise self._adm.refuse(
                "expired", f"waited {late:.2f}s past its budget for a running slot; retry later"
            )

    def release(self, count_slot: bool = True) -> None:
        if self.state == "waiting":
            self._adm.waiting -= 1
            self._adm.queued_tokens -= self.tokens
        elif self.state == "running":
            self._adm.running -= 1
            self._adm._sem.release()
            if count_slot and self.acquired_at is not None:
                self._adm.observe_slot(time.monotonic() - self.acquired_at)
        self.state = "released"
        self._adm._changed()


SLOT_EWMA = 0.2  # weight of the newest slot time in the moving average
REASONS = ("queue_full", "queued_tokens", "deadline", "expired", "draining")


class Admission:
    def __init__(
        self,
        max_running: int,
        max_queue: int,
        retry_after_s: int = 1,
        max_queued_tokens: int = 0,
        queue_budget_s: float | None = None,
    ):
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_running, self.max_queue, self.retry_after_s = max_running, max_queue, retry_after_s
        self.max_queued_tokens, self.queue_budget_s = max_queued_tokens, queue_budget_s  # 0 / None: off
        self._sem = asyncio.Semaphore(max_running)
        self.running = 0
        self.waiting = 0
        self.queued_tokens = 0
        self.slot_seconds: float | None = None  # moving average of how long a request holds a slot
        self.rejections: Counter[str] = Counter()  # by reason
        self.late_starts = 0  # let in under the server's budget, started past it (the estimate was wrong)
        self.waits = 0  # requests that found every slot taken and waited for one
        self.max_running_seen = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def estimated_wait(self) -> float:
        """Seconds a request entering now would wait for a slot (0 while one is free)."""
        ahead = self.running + self.waiting - self.max_running + 1
        if ahead <= 0 or self.slot_seconds is None:
            return 0.0
        return ahead * self.slot_seconds / self.max_running

    def observe_slot(self, seconds: float) -> None:
        old = self.slot_seconds
        self.slot_seconds = seconds if old is None else (1 - SLOT_EWMA) * old + SLOT_EWMA * seconds

    def refuse(
        self, reason: str, message: str, status: int = 429, retry_after_s: float | None = None
    ) -> APIError:
        """The refusal for `reason`, counted (modeldeploy_admission_rejections_total{reason})."""
        self.rejections[reason] += 1
        retry = max(self.retry_after_s, math.ceil(retry_after_s or 0))
        return APIError(status, message, code=reason, headers={"Retry-After": str(retry)})

    def enter(self, prompt_tokens: int = 0, budget_s: float | None = None) -> Ticket:
        """Take a place in the queue or raise the refusal (503 draining; 429 queue full, queued
        tokens over the bound, or an estimated wait over the budget)."""
        if self.draining:
            raise self.refuse("draining", "server is draining and admits no new requests", status=503)
        if self.running + self.waiting >= self.max_running + self.max_queue:
            raise self.refuse(
                "queue_full",
                f"server is at capacity: {self.running} running and {self.waiting} waiting "
                f"(max_num_seqs={self.max_running}, max_queue={self.max_queue}); retry later",
            )
        if (
            self.max_queued_tokens
            and self.waiting
            and self.queued_tokens + prompt_tokens > self.max_queued_tokens
        ):
            raise self.refuse(
                "queued_tokens",
                f"server is at capacity: {self.queued_tokens} prompt tokens already waiting, this request "
                f"adds {prompt_tokens} (max_queued_tokens={self.max_queued_tokens}); retry later",
            )
        budget = budget_s if budget_s is not None else self.queue_budget_s
        wait = self.estimated_wait()
        if budget is not None and wait > budget:
            raise self.refuse(
                "deadline",
                f"estimated wait for a running slot {wait:.2f}s exceeds the budget {budget:.2f}s; "
                "retry later",
                retry_after_s=wait - budget,
            )
        self.waiting += 1
        self.queued_tokens += prompt_tokens
        self._idle.clear()
        deadline = time.monotonic() + budget if budget is not None else None
        return Ticket(self, prompt_tokens, deadline, strict=budget_s is not None)

    def _changed(self) -> None:
        if self.running == 0 and self.waiting == 0:
            self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for the admitted ones; True when all finished in time."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
