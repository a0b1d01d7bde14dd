"""Per-object coalescing of reconcile requests, and the delayed re-run while a rollout moves.

Bursts of watch events (a child created, its status updated, ...) collapse into at most one
extra pass instead of one full reconcile each, as controller-runtime's work queue does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

from modeldeploy.operator import metrics


class WorkQueue:
    """Runs `work(key)` for a key now or, when it is already running, once more right after it."""

    def __init__(self, work: Callable[[Any], Any], tick_s: float) -> None:
        self.work, self.tick_s = work, tick_s
        self._guard = threading.Lock()
        self._running: dict[Hashable, bool] = {}  # keys being worked on -> another pass requested meanwhile
        self._timers: dict[Hashable, threading.Timer] = {}

    def request(self, key: Hashable, source: str = "request") -> None:
        """`source` (what asked) labels modeldeploy_operator_reconcile_requests_total."""
        with self._guard:
            coalesced = key in self._running
            self._running[key] = coalesced  # running: one more pass after it; else this call runs it
        metrics.REQUESTS.labels(source, "coalesced" if coalesced else "run").inc()
        if coalesced:
            return
        try:
            while True:
                self.work(key)
                with self._guard:
                    if not self._running[key]:
                        return
                    self._running[key] = False
        finally:
            with self._guard:
                self._running.pop(key, None)

    def tick(self, key: Hashable) -> None:
        """One delayed `request` per key at a time (a daemon timer; lost on restart, as status is not).

        Gate results, pauses and analysis intervals raise no watch event: this is what notices them.
        """
        with self._guard:
            if key in self._timers:
                return
            timer = self._timers[key] = threading.Timer(self.tick_s, self._fire, (key,))
        timer.daemon = True
        timer.start()

    def _fire(self, key: Hashable) -> None:
        with self._guard:
            self._timers.pop(key, None)
        try:
            self.request(key, "tick")
        except Exception as e:  # noqa: BLE001 - the next watch event or resync retries
            metrics.ERRORS.labels(type(e).__name__).inc()

    def forget(self, key: Hashable) -> None:
        """Cancel a pending tick (the object is gone); a pass already running ends by itself."""
        with self._guard:
            timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def holds(self, key: Hashable) -> bool:
        """Whether any entry for `key` is kept (a pending tick or a running pass)."""
        with self._guard:
            return key in self._timers or key in self._running
