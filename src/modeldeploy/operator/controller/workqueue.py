"""Per-object coalescing of reconcile requests, the workers that serve them, and the delayed re-run
while a rollout moves.

Bursts of watch events (a child created, its status updated, ...) collapse into at most one
extra pass instead of one full reconcile each, as controller-runtime's work queue does.

Watch handlers only `add` a key and return: the Controller's own worker threads run the passes.
A handler that ran the pass itself held kopf's thread for the whole reconcile (seconds of API round
trips), so at scale kopf's queue of waiting handler calls kept every watch event body decoded in
memory until a thread came free; a waiting key costs a few bytes.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from modeldeploy.operator.controller import metrics

RETRY_S = 5.0  # a pass that raised is asked for again this soon (the next event or resync may come first)
log = logging.getLogger("modeldeploy.operator")


class WorkQueue:
    """Runs `work(key)` for a key now or, when it is already running, once more right after it.

    With `workers` > 0, `add` queues a key (once: a key already waiting folds in) for one of that
    many daemon threads. A rollout tick's timer thread runs its pass itself, so the in-flight
    rollouts do not wait behind a burst of watch events.
    """

    def __init__(self, work: Callable[[Any], Any], tick_s: float, workers: int = 0) -> None:
        self.work, self.tick_s = work, tick_s
        self._guard = threading.Lock()
        # key being worked on -> the asks made meanwhile (their news checks; None: news for sure)
        self._running: dict[Hashable, list[Callable[[], bool] | None]] = {}
        self._timers: dict[Hashable, threading.Timer] = {}
        # added, not yet taken by a worker -> (what asked first, the news checks; None: news for sure)
        self._waiting: dict[Hashable, tuple[str, list[Callable[[], bool]] | None]] = {}
        self._order: deque[Hashable] = deque()  # the same keys, first added first
        self._wake = threading.Condition(self._guard)
        self.workers = [
            threading.Thread(target=self._serve, name=f"reconcile-{i}", daemon=True) for i in range(workers)
        ]
        for t in self.workers:
            t.start()

    def request(self, key: Hashable, source: str = "request", news: Callable[[], bool] | None = None) -> None:
        """`source` (what asked) labels modeldeploy_operator_reconcile_requests_total.

        An ask made while a pass of `key` runs calls for one more pass after it, unless its `news`
        check, made once that pass ends, says it is no news (the echo of a write the pass made). An ask
        that is already no news when it comes runs nothing (outcome "echo")."""
        if news is not None and not news():
            metrics.REQUESTS.labels(source, "echo").inc()
            return
        with self._guard:
            coalesced = key in self._running
            if coalesced:
                self._running[key].append(news)
            else:
                self._running[key] = []
        metrics.REQUESTS.labels(source, "coalesced" if coalesced else "run").inc()
        if coalesced:
            return
        try:
            while True:
                self.work(key)
                if not self._again(key):  # it dropped the key: a later ask runs a pass of its own
                    return
        except BaseException:
            with self._guard:
                self._running.pop(key, None)
            raise

    def _again(self, key: Hashable) -> bool:
        """Whether the asks made during the pass call for another; drops the key when none does."""
        while True:
            with self._guard:
                asks = self._running[key]
                if not asks:
                    del self._running[key]
                    return False
                self._running[key] = []
            if any(news is None or news() for news in asks):  # outside the guard: news takes its own locks
                return True

    def add(self, key: Hashable, source: str = "request", news: Callable[[], bool] | None = None) -> None:
        """Ask for a pass without waiting for it; a key already waiting for a worker folds into that ask.
        `news`: as for `request`, once a worker takes the ask."""
        with self._guard:
            waiting = key in self._waiting
            if not waiting:
                self._waiting[key] = (source, None if news is None else [news])
                self._order.append(key)
                self._wake.notify()
            elif (checks := self._waiting[key][1]) is not None:  # folded asks are news if any of them is
                if news is None:
                    self._waiting[key] = (self._waiting[key][0], None)
                else:
                    checks.append(news)
        if waiting:
            metrics.REQUESTS.labels(source, "coalesced").inc()

    def _serve(self) -> None:
        while True:
            with self._guard:
                while not self._order:
                    self._wake.wait()
                key = self._order.popleft()
                ask = self._waiting.pop(key, None)
            if ask is None:
                continue  # forgotten while it waited
            source, checks = ask
            news = None if checks is None else (lambda checks=checks: any(check() for check in checks))
            try:
                self.request(key, source, news)
            except Exception as e:  # noqa: BLE001 - one object's failure must not stop a worker
                metrics.ERRORS.labels(type(e).__name__).inc()
                log.warning("reconcile %s: %s: %s (again in %.0f s)", key, type(e).__name__, e, RETRY_S)
                retry = threading.Timer(RETRY_S, self.add, (key, "retry"))
                retry.daemon = True
                retry.start()

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
        """Cancel a pending tick and a waiting ask (the object is gone); a running pass ends by itself."""
        with self._guard:
            timer = self._timers.pop(key, None)
            self._waiting.pop(key, None)  # its entry in _order is skipped when a worker reaches it
        if timer is not None:
            timer.cancel()

    def holds(self, key: Hashable) -> bool:
        """Whether any entry for `key` is kept (a pending tick, a waiting ask or a running pass)."""
        with self._guard:
            return key in self._timers or key in self._running or key in self._waiting
