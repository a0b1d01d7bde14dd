"""Readiness during load: the port opens at once, weights load in the background.

`/health/ready` answers 503 with the load phase and progress until the engine has loaded
its weights and run a warm-up forward, then 200; draining turns it back to 503. A load
failure is kept (not retried) and also fails `/health/live`, so Kubernetes restarts the pod
while the operator can still read the error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modeldeploy.runtime.engine.heap import freeze_after_load

log = logging.getLogger("modeldeploy.server")


@dataclass
class LoadState:
    status: str = "loading"  # loading | ready | draining | failed
    phase: str = "starting"
    progress: float = 0.0
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    load_seconds: float = 0.0

    @property
    def live(self) -> bool:
        return self.status != "failed"

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status,
            "phase": self.phase,
            "progress": round(self.progress, 4),
        }
        if self.error:
            out["error"] = self.error
        if self.load_seconds:
            out["load_seconds"] = round(self.load_seconds, 3)
        return out


async def load(
    make_engine: Callable[[], Any],
    on_engine: Callable[[Any], None],
    state: LoadState,
    delay_s: float = 0.0,
    freeze_heap: bool = False,
) -> None:
    """Build and start the engine, keeping `state` current; never raises (the state carries the error).

    The engine is built in a worker thread too (importing torch takes seconds), so the port
    answers health checks from the first moment.
    """

    def progress(phase: str, frac: float) -> None:  # called from the engine's loader thread
        state.phase, state.progress = phase, min(1.0, max(0.0, float(frac)))

    try:
        if delay_s > 0:
            state.phase = "delay"
            await asyncio.sleep(delay_s)
        state.phase = "initializing"
        engine = await asyncio.to_thread(make_engine)
        on_engine(engine)
        await engine.start(progress=progress)
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # noqa: BLE001 - any load error must be reported, not crash the loop
        state.status, state.error = "failed", f"{type(e).__name__}: {e}"
        log.error("model load failed: %s", state.error)
        return
    state.load_seconds = time.monotonic() - state.started
    if freeze_heap:  # a serving process (not an in-process test server): see runtime/engine/heap.py
        log.info("gc: %d objects frozen after load", freeze_after_load())
    state.phase, state.progress = "ready", 1.0
    if state.status == "loading":
        state.status = "ready"
    log.info("model loaded in %.2fs", state.load_seconds)
