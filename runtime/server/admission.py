"""Admission: a bounded queue in front of the engine.

At most `max_running` requests are inside the engine; up to `max_queue` more wait for a
slot; anything beyond is refused at once (429 with Retry-After) instead of piling up
latency. While draining, nothing new is admitted (503). The counters feed the
`modeldeploy_requests_running` / `_waiting` gauges.
"""

from __future__ import annotations

import asyncio
import time

from modeldeploy.runtime.server.errors import APIError


class Ticket:
    """One request's place: waiting, then running, then released (idempotent)."""

    def __init__(self, admission: Admission):
        self._adm = admission
        self.state = "waiting"
        self.acquired_at: float | None = None  # monotonic; the request's trace shows the admission wait

    async def acquire(self) -> None:
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
        self._adm.running += 1
        self._adm.max_running_seen = max(self._adm.max_running_seen, self._adm.running)

    def release(self) -> None:
        if self.state == "waiting":
            self._adm.waiting -= 1
        elif self.state == "running":
            self._adm.running -= 1
            self._adm._sem.release()
        self.state = "released"
        self._adm._changed()


class Admission:
    def __init__(self, max_running: int, max_queue: int, retry_after_s: int = 1):
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_running, self.max_queue, self.retry_after_s = max_running, max_queue, retry_after_s
        self._sem = asyncio.Semaphore(max_running)
        self.running = 0
        self.waiting = 0
        self.max_running_seen = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> Ticket:
        """Take a place in the queue or raise the refusal (503 draining, 429 full)."""
        if self.draining:
            raise APIError(
                503,
                "server is draining and admits no new requests",
                code="draining",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        if self.running + self.waiting >= self.max_running + self.max_queue:
            raise APIError(
                429,
                f"server is at capacity: {self.running} running and {self.waiting} waiting "
                f"(max_num_seqs={self.max_running}, max_queue={self.max_queue}); retry later",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.waiting += 1
        self._idle.clear()
        return Ticket(self)

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
