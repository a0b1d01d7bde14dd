"""AsyncEngine: the engine's step loop on a worker thread, fed and drained from asyncio.

The in-process layout (`--engine-core thread`, and tests that look inside the engine); `modeldeploy
serve` runs the step loop in a process of its own by default (`core_client.EngineCoreClient`, the
same interface).

Requests and aborts cross into the engine thread through a locked inbox processed at
the start of each step, so an abort frees its KV blocks within one step. Outputs cross
back with `loop.call_soon_threadsafe` into one asyncio.Queue per request.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.grammar import CompileResult
from modeldeploy.runtime.engine.llm_engine import Engine
from modeldeploy.runtime.engine.output import EngineDead, EngineStats, RequestOutput
from modeldeploy.runtime.engine.request_check import check_request
from modeldeploy.runtime.engine.sampling_params import SamplingParams
from modeldeploy.runtime.engine.stream import OutputStream


class AsyncEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, OutputStream] = {}
        self._inbox: list[tuple[str, tuple]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._compile_pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="grammar-compile", initializer=_background_priority
        )
        # Called on the engine thread with the seconds from an abort being requested (client gone,
        # drain timeout) to the sequence's KV blocks being freed; the server turns it into a metric.
        self.on_abort_release: Callable[[float], None] | None = None
        # Called once, from any thread, when the engine can no longer serve (its step loop raised, or a
        # tensor-parallel rank died): the server then fails fast (503, non-zero exit) instead of hanging.
        self.on_fatal: Callable[[str], None] | None = None
        self._fatal_once = threading.Lock()
        self.step_delay_s = 0.0  # test hook (server env MODELDEPLOY_STEP_DELAY_S): sleep after each step

    async def start(self, progress: Callable[[str, float], None] = lambda p, f: None) -> None:
        """Load in a worker thread (the event loop keeps serving health checks), then start stepping."""
        self._loop = asyncio.get_running_loop()
        self.engine = await asyncio.to_thread(Engine, self.config, progress)
        self.config = self.engine.config
        if self.engine.tp is not None:
            self.engine.tp.set_on_failure(lambda msg: self._fail(RuntimeError(msg)))
        self._thread = threading.Thread(target=self._run, name="engine-step", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def info(self) -> dict:
        import torch

        core = {"layout": "thread", "pid": os.getpid(), "torch_threads": torch.get_num_threads()}
        return {**self.engine.info(), "engine_core": core}

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, adapter: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs (with n > 1, every choice's, tagged by `index`) until all choices finish;
        leaving the loop early (break, cancel, disconnect) aborts the request."""
        if self.engine is None:
            raise RuntimeError("engine not started")
        if self.error is not None:
            raise EngineDead(f"engine failed: {self.error}")
        params.validate()
        ids = self.engine.encode(prompt)  # validated again in the engine thread
        # the engine's own length check, on the caller's side so errors come before queueing
        check_request(len(ids), params.max_tokens, self.engine.config.max_model_len)
        self.engine.adapter_id(adapter)  # unknown names fail here, before queueing
        stream = OutputStream(params.n)
        with self._lock:
            if request_id in self._queues:
                raise ValueError(f"request_id: {request_id!r} is already running")
            self._queues[request_id] = stream
        if params.structured is not None and params.structured.compiled is None:
            await self.compile(params)
        self._post("add", (request_id, ids, params, adapter))
        try:
            async for out in stream:
                yield out
        finally:
            if not stream.finished:
                self.abort(request_id)
            with self._lock:
                self._queues.pop(request_id, None)

    async def compile(self, params: SamplingParams) -> CompileResult:
        """Compile the request's grammar on the compile thread, never on the step loop (a large schema
        must not stall other requests); fills params.structured.compiled. ValueError: a bad schema."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._compile_pool, self.engine.grammars.compile, params.structured)

    def abort(self, request_id: str) -> None:
        self._post("abort", (request_id, time.monotonic()))

    async def shutdown(self) -> None:
        """Stop stepping, then stop the tensor-parallel ranks (after a failure `_fail` has killed them
        already, which also releases a step blocked in a collective)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5 if self.error is not None else 30)
        if self.engine is not None:
            await asyncio.to_thread(self.engine.close)
        self._compile_pool.shutdown(wait=False, cancel_futures=True)

    # --- engine thread -------------------------------------------------------------
    def _post(self, kind: str, payload: tuple) -> None:
        with self._lock:
            self._inbox.append((kind, payload))
        self._wake.set()

    def _deliver(self, out: RequestOutput | BaseException, request_id: str) -> None:
        with self._lock:
            q = self._queues.get(request_id)
        if q is not None:
            self._loop.call_soon_threadsafe(q.put, out)

    def _drain_inbox(self) -> None:
        with self._lock:
            items, self._inbox = self._inbox, []
        for kind, payload in items:
            if kind == "add":
                rid, ids, params, adapter = payload
                try:
                    self.engine.add_request(rid, ids, params, adapter=adapter)
                except ValueError as e:
                    self._deliver(e, rid)
            else:
                rid, requested = payload
                for out in self.engine.abort(rid):  # n > 1: every choice of the request
                    released = out.metrics.finished_time
                    if self.on_abort_release is not None and released is not None:
                        self.on_abort_release(released - requested)
                    self._deliver(out, out.request_id)

    def _run(self) -> None:
        try:
            while not self._stop:
                self._wake.clear()
                self._drain_inbox()
                if not self.engine.has_work():
                    self._wake.wait(0.05)
                    continue
                for out in self.engine.step():
                    self._deliver(out, out.request_id)
                if self.step_delay_s:
                    time.sleep(self.step_delay_s)
        except BaseException as e:  # noqa: BLE001 - surfaced to every waiting request and to health
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        """The engine is dead: every waiting request gets the error, health turns 503, the server is told."""
        if not self._fatal_once.acquire(blocking=False):
            return
        self.error = e
        self._stop = True
        with self._lock:
            rids = list(self._queues)
        for rid in rids:
            self._deliver(EngineDead(f"engine failed: {e}"), rid)
        if self.engine is not None and self.engine.tp is not None:
            self.engine.tp.kill()  # no rank outlives a dead engine, a hung one included
        if self.on_fatal is not None:
            self.on_fatal(f"{type(e).__name__}: {e}")


def _background_priority() -> None:
    """Run grammar compiles at a lower CPU priority than the step loop (Linux threads carry their own
    nice value), so a large schema takes spare CPU instead of stretching other requests' steps."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):  # not Linux, or not permitted: plain priority
        pass
