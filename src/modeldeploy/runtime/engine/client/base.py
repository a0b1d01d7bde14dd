"""EngineClient: the API server's handle on the engine, whichever layout runs the step loop.

Two implementations: `AsyncEngine` (async_engine.py: the step loop on a thread of this process)
and `EngineCoreClient` (core_client.py: the step loop in an engine core process of its own).
`make_client` (factory.py) picks one, so the server never knows which runs. What both need before
a request is queued (validate, tokenize, the length and adapter rules, one output stream per
request, an abort when the caller leaves early) lives here once, in `generate`.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.client.stream import OutputStream
from modeldeploy.runtime.engine.output import CompileResult, EngineDead, EngineStats, RequestOutput
from modeldeploy.runtime.engine.request_check import check_adapter, check_request
from modeldeploy.runtime.engine.sampling_params import SamplingParams

Progress = Callable[[str, float], None]  # (phase, fraction done), called while loading


def no_progress(phase: str, fraction: float) -> None:
    pass


class EngineClient(abc.ABC):
    """start, generate, abort, compile, stats, info, shutdown; `config` is the effective configuration
    once started, `error` the reason the engine can no longer serve (None while it can)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.tokenizer: Any = None  # a Hugging Face tokenizer, once started
        self.error: BaseException | None = None
        # Called with the seconds from an abort being requested (client gone, drain timeout) to the
        # sequence's KV blocks being freed; the server turns it into a metric. Any thread.
        self.on_abort_release: Callable[[float], None] | None = None
        # Called once, from any thread, when the engine can no longer serve (its step loop raised, a
        # process or a tensor-parallel rank died): the server then fails fast instead of hanging.
        self.on_fatal: Callable[[str], None] | None = None
        self.step_delay_s = 0.0  # test hook (server env MODELDEPLOY_STEP_DELAY_S): sleep after each step
        self._streams: dict[str, OutputStream] = {}
        self._lock = threading.Lock()

    # --- lifecycle and introspection ------------------------------------------------------
    @abc.abstractmethod
    async def start(self, progress: Progress = no_progress) -> None:
        """Load (the event loop keeps serving health checks meanwhile), then start stepping."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop stepping and stop the tensor-parallel ranks."""

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    @abc.abstractmethod
    def info(self) -> dict[str, Any]:
        """The engine's description for /v1/bundle; `engine_core` says which layout runs."""

    # --- requests -------------------------------------------------------------------------
    @abc.abstractmethod
    async def compile(self, params: SamplingParams) -> CompileResult:
        """Compile the request's grammar off the step loop (a large schema must not stall other
        requests); ValueError names a bad schema."""

    @abc.abstractmethod
    def abort(self, request_id: str) -> None:
        """Abort every unfinished choice of the request; its KV blocks are freed within one step."""

    @abc.abstractmethod
    def _submit(self, request_id: str, ids: list[int], params: SamplingParams, adapter: str | None) -> None:
        """Queue a checked request for the step loop; its outputs arrive on its stream."""

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        return list(prompt)

    async def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, adapter: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs (with n > 1, every choice's, tagged by `index`) until all choices finish;
        leaving the loop early (break, cancel, disconnect) aborts the request. ValueError names a
        request the engine cannot take, before anything is queued."""
        ids = self._admit(prompt, params, adapter)
        stream = OutputStream(params.n, ids)
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request_id: {request_id!r} is already running")
            self._streams[request_id] = stream
        submitted = False
        try:
            if params.structured is not None and params.structured.compiled is None:
                await self.compile(params)  # a cache hit when the server compiled it already
            self._submit(request_id, ids, params, adapter)
            submitted = True
            async for out in stream:
                yield out
        finally:
            if submitted and not stream.finished:
                self.abort(request_id)
            with self._lock:
                self._streams.pop(request_id, None)

    def _admit(self, prompt: str | list[int], params: SamplingParams, adapter: str | None) -> list[int]:
        """The engine's own checks, on the caller's side so that errors come before queueing."""
        if self.tokenizer is None:
            raise RuntimeError("engine not started")
        if self.error is not None:
            raise EngineDead(f"engine failed: {self.error}")
        params.validate()
        ids = self.encode(prompt)
        check_request(len(ids), params.max_tokens, self.max_model_len)
        check_adapter(adapter, [a["name"] for a in self.config.adapters])
        return ids

    @property
    def max_model_len(self) -> int:
        if self.config.max_model_len is None:  # resolved at load: None only before start
            raise RuntimeError("engine not started")
        return self.config.max_model_len

    def _stream(self, request_id: str) -> OutputStream | None:
        with self._lock:
            return self._streams.get(request_id)

    def _streams_now(self) -> list[OutputStream]:
        with self._lock:
            return list(self._streams.values())
