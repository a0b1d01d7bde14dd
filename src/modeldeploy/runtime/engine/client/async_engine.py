"""AsyncEngine: the engine's step loop on a worker thread of this process, fed and drained from asyncio.

The in-process layout of `EngineClient` (`--engine-core thread`, and tests that look inside the
engine); `modeldeploy serve` runs the step loop in a process of its own by default
(`core_client.EngineCoreClient`).

Requests and aborts cross into the engine thread through a locked inbox processed at the start of
each step, so an abort frees its KV blocks within one step. Outputs cross back with
`loop.call_soon_threadsafe` onto the request's OutputStream.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.client.base import EngineClient, Progress, no_progress
from modeldeploy.runtime.engine.client.messages import Abort, Add
from modeldeploy.runtime.engine.llm_engine import LLMEngine
from modeldeploy.runtime.engine.output import CompileResult, EngineDead, EngineStats, RequestOutput
from modeldeploy.runtime.engine.sampling_params import SamplingParams
from modeldeploy.runtime.engine.structured_output.compile_pool import compile_pool


class AsyncEngine(EngineClient):
    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self._engine: LLMEngine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: list[Add | Abort] = []
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._compile_pool = compile_pool()
        self._fatal_once = threading.Lock()

    @property
    def engine(self) -> LLMEngine:
        """The engine itself (tests look inside it); RuntimeError before start."""
        if self._engine is None:
            raise RuntimeError("engine not started")
        return self._engine

    async def start(self, progress: Progress = no_progress) -> None:
        """Load in a worker thread (the event loop keeps serving health checks), then start stepping."""
        self._loop = asyncio.get_running_loop()
        engine = self._engine = await asyncio.to_thread(LLMEngine, self.config, progress)
        self.config = engine.config
        self.tokenizer = engine.tokenizer
        if engine.tp is not None:
            engine.tp.set_on_failure(lambda msg: self._fail(RuntimeError(msg)))
        self._thread = threading.Thread(target=self._run, name="engine-step", daemon=True)
        self._thread.start()

    def info(self) -> dict[str, Any]:
        import torch

        core = {"layout": "thread", "pid": os.getpid(), "torch_threads": torch.get_num_threads()}
        return {**self.engine.info(), "engine_core": core}

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def compile(self, params: SamplingParams) -> CompileResult:
        """On the compile thread; fills params.structured.compiled for the request that follows."""
        if params.structured is None:
            raise ValueError("structured: the request has no grammar to compile")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._compile_pool, self.engine.grammars.compile, params.structured)

    def abort(self, request_id: str) -> None:
        self._post(Abort(request_id, time.monotonic()))

    def _submit(self, request_id: str, ids: list[int], params: SamplingParams, adapter: str | None) -> None:
        self._post(Add(request_id, ids, params, adapter))  # validated again in the engine thread

    async def shutdown(self) -> None:
        """Stop stepping, then stop the tensor-parallel ranks (after a failure `_fail` has killed them
        already, which also releases a step blocked in a collective)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5 if self.error is not None else 30)
        if self._engine is not None:
            await asyncio.to_thread(self._engine.close)
        self._compile_pool.shutdown(wait=False, cancel_futures=True)

    # --- engine thread -------------------------------------------------------------
    def _post(self, msg: Add | Abort) -> None:
        with self._lock:
            self._inbox.append(msg)
        self._wake.set()

    def _deliver(self, out: RequestOutput | BaseException, request_id: str) -> None:
        stream = self._stream(request_id)
        if stream is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(stream.put, out)

    def _drain_inbox(self, engine: LLMEngine) -> None:
        with self._lock:
            items, self._inbox = self._inbox, []
        for msg in items:
            if isinstance(msg, Add):
                try:
                    engine.add_request(msg.request_id, msg.prompt_token_ids, msg.params, adapter=msg.adapter)
                except ValueError as e:
                    self._deliver(e, msg.request_id)
                continue
            for out in engine.abort(msg.request_id):  # n > 1: every choice of the request
                released = out.metrics.finished_time
                if self.on_abort_release is not None and released is not None:
                    self.on_abort_release(released - msg.requested_at)
                self._deliver(out, out.request_id)

    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stop:
                self._wake.clear()
                self._drain_inbox(engine)
                if not engine.has_work():
                    self._wake.wait(0.05)
                    continue
                for out in engine.step():
                    self._deliver(out, out.request_id)
                if self.step_delay_s:
                    time.sleep(self.step_delay_s)
        except BaseException as e:  # noqa: BLE001 - surfaced to every waiting request and to health
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        """The engine is dead: the server is told first (health turns 503), then every waiting request
        gets the error."""
        if not self._fatal_once.acquire(blocking=False):
            return
        self.error = e
        self._stop = True
        if self.on_fatal is not None:
            self.on_fatal(f"{type(e).__name__}: {e}")
        with self._lock:
            rids = list(self._streams)
        for rid in rids:
            self._deliver(EngineDead(f"engine failed: {e}"), rid)
        if self._engine is not None and self._engine.tp is not None:
            self._engine.tp.kill()  # no rank outlives a dead engine, a hung one included
