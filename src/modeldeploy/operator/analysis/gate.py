"""The conformance gate: the serving-contract suite against one canary pod, off the reconcile thread.

The Verifying phase asks `ensure()` once per reconcile; the suite runs in a daemon thread
(bounded in time and in parallel runs) and the answer is a (passed, summary) pair for the
rollout machine. Reached from the operator: the conformance client only, never the runtime.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from modeldeploy.conformance.suite import ConformanceConfig, Report, run_conformance


def summarize(report: Report, limit: int = 1000) -> tuple[bool, str]:
    """(passed, summary) for status and Events: the failed required checks by name, with the first reason."""
    failed = [c for c in report.checks if not c.ok]
    if report.passed:
        text = f"conformance passed: {len(report.checks)} checks in {report.seconds:.1f}s"
    elif not failed:
        text = "conformance failed: no checks ran"
    else:
        names = ", ".join(c.name for c in failed)
        first = "; ".join(f"{c.name}: {c.failures[0]}" for c in failed if c.failures)
        text = f"conformance failed checks: {names} ({first})"
    return report.passed, text if len(text) <= limit else text[: limit - 1] + "…"


CanaryKey = tuple[str, str]  # (md uid, bundle id)
Runner = Callable[[ConformanceConfig], Report]


@dataclass
class _Run:
    url: str
    started: float
    thread: threading.Thread
    result: tuple[bool, str] | None = None


class ConformanceRunner:
    """Runs the conformance suite on a canary pod in a daemon thread; the reconcile loop only polls.

    At most one run per key at a time and `max_parallel` runs overall; a run still going after
    `deadline_s` reads as failed (the thread cannot be killed, so its key stays busy until it
    ends and its late result is dropped). Per-request time is bounded by `request_timeout_s`.
    """

    def __init__(
        self,
        deadline_s: float = 300.0,
        request_timeout_s: float = 30.0,
        max_parallel: int = 4,
        run: Runner = run_conformance,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline_s, self.request_timeout_s = deadline_s, request_timeout_s
        self._run, self._clock = run, clock
        self._slots = threading.BoundedSemaphore(max_parallel)
        self._lock = threading.Lock()
        self._runs: dict[CanaryKey, _Run] = {}

    def start(
        self,
        key: CanaryKey,
        url: str,
        api_key: str | None = None,
        model: str | None = None,
        structured_output: bool = False,
    ) -> bool:
        """Start a run unless one exists for this key (running or finished); True if started."""
        with self._lock:
            if key in self._runs:
                return False
            cfg = ConformanceConfig(
                url=url,
                api_key=api_key,
                model=model,
                timeout_s=self.request_timeout_s,
                structured_output=structured_output,  # the bundle declares it: check response_format too
            )
            t = threading.Thread(
                target=self._work, args=(key, cfg), name=f"conformance-{key[1]}", daemon=True
            )
            self._runs[key] = _Run(url, self._clock(), t)
        t.start()
        return True

    def ensure(self, key: CanaryKey, url: str, **kw: Any) -> tuple[bool, str] | None:
        """Start if needed, then `result()`: the one call the Verifying phase makes per reconcile."""
        self.start(key, url, **kw)
        return self.result(key)

    def result(self, key: CanaryKey) -> tuple[bool, str] | None:
        """(passed, summary) once finished or past the deadline; None while running or never started."""
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                return None
            if run.result is None and self._clock() - run.started > self.deadline_s:
                run.result = (
                    False,
                    f"conformance against {run.url} did not finish within {self.deadline_s:.0f}s",
                )
            return run.result

    def running(self, key: CanaryKey) -> bool:
        with self._lock:
            run = self._runs.get(key)
            return run is not None and run.thread.is_alive()

    def forget(self, key: CanaryKey) -> None:
        """Drop a finished result (new canary, rollback); a thread still running keeps the key busy."""
        with self._lock:
            run = self._runs.get(key)
            if run is not None and not run.thread.is_alive():
                del self._runs[key]

    def forget_md(self, md_uid: str) -> None:
        """Drop every finished result of a deleted ModelDeployment."""
        with self._lock:
            keys = [k for k in self._runs if k[0] == md_uid]
        for key in keys:
            self.forget(key)

    def holds(self, md_uid: str) -> bool:
        """Whether a run (finished or not) of this ModelDeployment is kept."""
        with self._lock:
            return any(k[0] == md_uid for k in self._runs)

    def wait(self, key: CanaryKey, timeout: float) -> tuple[bool, str] | None:
        """Block up to `timeout` for a result: for tests and the CLI, never for the reconcile loop."""
        with self._lock:
            run = self._runs.get(key)
        if run is not None:
            run.thread.join(timeout)
        return self.result(key)

    def _work(self, key: CanaryKey, cfg: ConformanceConfig) -> None:
        with self._slots:
            try:
                outcome = summarize(self._run(cfg))
            except (httpx.HTTPError, ValueError, OSError) as e:
                outcome = (False, f"conformance could not run against {cfg.url}: {type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - a bug in the suite must read as a failed gate, not hang Verifying
                outcome = (False, f"conformance crashed against {cfg.url}: {type(e).__name__}: {e}")
        with self._lock:
            run = self._runs.get(key)
            if run is not None and run.result is None:
                run.result = outcome
