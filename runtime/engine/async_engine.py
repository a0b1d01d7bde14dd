"""AsyncEngine: the engine's step loop on a worker thread, fed and drained from asyncio.

Requests and aborts cross into the engine thread through a locked inbox processed at
the start of each step, so an abort frees its KV blocks within one step. Outputs cross
back with `loop.call_soon_threadsafe` into one asyncio.Queue per request.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.llm_engine import Engine
from modeldeploy.runtime.engine.output import EngineStats, RequestOutput
from modeldeploy.runtime.engine.request_check import check_request
from modeldeploy.runtime.engine.sampling_params import SamplingParams


class AsyncEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._inbox: list[tuple[str, tuple]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    async def start(self, progress: Callable[[str, float], None] = lambda p, f: None) -> None:
        """Load in a worker thread (the event loop keeps serving health checks), then start stepping."""
        self._loop = asyncio.get_running_loop()
        self.engine = await asyncio.to_thread(Engine, self.config, progress)
        self.config = self.engine.config
        self._thread = threading.Thread(target=self._run, name="engine-step", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def info(self) -> dict:
        return self.engine.info()

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, adapter: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs; leaving the loop early (break, cancel, disconnect) aborts the request."""
        if self.engine is None:
            raise RuntimeError("engine not started")
        if self.error is not None:
            raise RuntimeError(f"engine failed: {self.error}")
        params.validate()
        ids = self.engine.encode(prompt)  # validated again in the engine thread
        # the engine's own length check, on the caller's side so errors come before queueing
        check_request(len(ids), params.max_tokens, self.engine.config.max_model_len)
        self.engine.adapter_id(adapter)  # unknown names fail here, before queueing
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if request_id in self._queues:
                raise ValueError(f"request_id: {request_id!r} is already running")
            self._queues[request_id] = queue
        self._post("add", (request_id, ids, params, adapter))
        finished = False
        try:
            while True:
                out = await queue.get()
                if isinstance(out, BaseException):
                    raise out
                yield out
                if out.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(request_id)
            with self._lock:
                self._queues.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        self._post("abort", (request_id,))

    async def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)

    # --- engine thread -------------------------------------------------------------
    def _post(self, kind: str, payload: tuple) -> None:
        with self._lock:
            self._inbox.append((kind, payload))
        self._wake.set()

    def _deliver(self, out: RequestOutput | BaseException, request_id: str) -> None:
        with self._lock:
            q = self._queues.get(request_id)
        if q is not None:
            self._loop.call_soon_threadsafe(q.put_nowait, out)

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
                out = self.engine.abort(payload[0])
                if out is not None:
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
        except BaseException as e:  # noqa: BLE001 - surfaced to every waiting request and to health
            self.error = e
            with self._lock:
                rids = list(self._queues)
            for rid in rids:
                self._deliver(RuntimeError(f"engine failed: {e}"), rid)
