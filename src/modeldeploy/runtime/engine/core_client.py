"""EngineCoreClient: the API server's handle on the engine core process (`engine_core.py`).

The same interface as AsyncEngine (start, generate, abort, compile, stats, info, tokenizer, config,
shutdown, error, on_fatal, on_abort_release), so the server does not know which layout runs. Here:
prompts are tokenized (this process's own tokenizer, read from the same pinned directory), requests
are checked against the effective config before they are queued, and a reader thread turns each
step's message into outputs on the requests' asyncio queues (one `call_soon_threadsafe` per step).

Failure is never a hang: a monitor thread waits on the core's process sentinel, so a core that exits
for any reason (its step raised, a rank died, it was killed) fails every waiting request with
EngineDead and calls `on_fatal` at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.output import EngineDead, EngineStats, RequestMetrics, RequestOutput
from modeldeploy.runtime.engine.request_check import check_request
from modeldeploy.runtime.engine.sampling_params import SamplingParams
from modeldeploy.runtime.engine.stream import OutputStream

STOP_TIMEOUT_S = 30.0


@dataclasses.dataclass
class _Choice:
    """What the client rebuilds per choice from the deltas: the cumulative fields of RequestOutput."""

    prompt_token_ids: list[int]
    token_ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    logprobs: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Compiled:
    """The client's view of a grammar compile: the compiled object stays in the core's cache."""

    compiled: Any
    seconds: float
    cached: bool


class EngineCoreClient:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.tokenizer: Any = None
        self.error: BaseException | None = None
        self.on_abort_release: Callable[[float], None] | None = None
        self.on_fatal: Callable[[str], None] | None = None
        self.step_delay_s = 0.0  # test hook, passed to the core at start
        self.pid: int | None = None
        self._info: dict = {}
        self._stats: EngineStats | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, OutputStream] = {}
        self._prompts: dict[str, list[int]] = {}
        self._choices: dict[tuple[str, int], _Choice] = {}
        self._compiles: dict[int, asyncio.Future] = {}
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._fatal_once = threading.Lock()
        self._stopping = False
        self._proc: Any = None
        self._conn: mpc.Connection | None = None

    # --- lifecycle ------------------------------------------------------------------
    async def start(self, progress: Callable[[str, float], None] = lambda p, f: None) -> None:
        """Spawn the core (it loads while this process keeps answering health checks), read this
        process's tokenizer meanwhile, and return once the core has loaded and warmed up."""
        self._loop = asyncio.get_running_loop()
        ctx = mp.get_context("spawn")  # CUDA cannot be forked; the core is a fresh interpreter
        parent, child = ctx.Pipe(duplex=True)
        from modeldeploy.runtime.engine import engine_core

        self._proc = ctx.Process(
            target=engine_core.main,
            args=(
                child,
                self.config,
                self.step_delay_s,
                logging.getLogger("modeldeploy").getEffectiveLevel(),
            ),
            name="engine-core",
        )
        self._proc.start()
        child.close()
        self._conn, self.pid = parent, self._proc.pid
        tokenizer = asyncio.create_task(asyncio.to_thread(self._read_tokenizer))
        try:
            msg = await asyncio.to_thread(self._await_ready, progress)
        except BaseException:
            tokenizer.cancel()
            await asyncio.to_thread(self._reap, 5.0)
            raise
        _, self.config, self._info, self._stats = msg
        self.tokenizer = await tokenizer
        threading.Thread(target=self._read, name="engine-core-reader", daemon=True).start()
        threading.Thread(target=self._monitor, name="engine-core-monitor", daemon=True).start()

    def _read_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(Path(self.config.tokenizer or self.config.model))

    def _await_ready(self, progress: Callable[[str, float], None]) -> tuple:
        """Relay load progress until "ready"; a load error is raised here with its own type."""
        while True:
            ready = mpc.wait([self._conn, self._proc.sentinel])
            if self._conn in ready:
                try:
                    msg = self._conn.recv()
                except (EOFError, OSError):
                    msg = None
                if msg is not None and msg[0] == "progress":
                    progress(msg[1], msg[2])
                    continue
                if msg is not None and msg[0] == "ready":
                    return msg
                if msg is not None and msg[0] == "load_failed":
                    raise msg[1]
            self._proc.join(5)
            raise RuntimeError(f"engine core process exited while loading (exit code {self._proc.exitcode})")

    async def shutdown(self) -> None:
        """Stop the core (it stops its tensor-parallel ranks), waiting up to STOP_TIMEOUT_S."""
        self._stopping = True
        if self._proc is None:
            return
        if self.error is None:
            self._send(("stop",))
        await asyncio.to_thread(self._reap, STOP_TIMEOUT_S if self.error is None else 5.0)

    def _reap(self, timeout_s: float) -> None:
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    # --- the engine interface -------------------------------------------------------
    def info(self) -> dict:
        info = dict(self._info)
        if info.get("lora") and self._stats is not None:  # what changes after load: the resident set
            resident = list(self._stats.lora_resident)
            info["lora"] = {**info["lora"], "resident": resident}
            info["adapters"] = [{**a, "resident": a["name"] in resident} for a in info["adapters"]]
        return info

    def stats(self) -> EngineStats:
        if self._stats is None:
            raise RuntimeError("engine not started")
        return self._stats

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        return list(prompt)

    async def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, adapter: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs (with n > 1, every choice's, tagged by `index`) until all choices finish;
        leaving the loop early (break, cancel, disconnect) aborts the request."""
        if self._conn is None:
            raise RuntimeError("engine not started")
        if self.error is not None:
            raise EngineDead(f"engine failed: {self.error}")
        params.validate()
        ids = self.encode(prompt)
        check_request(len(ids), params.max_tokens, self.config.max_model_len)
        self._check_adapter(adapter)
        stream = OutputStream(params.n)
        with self._lock:
            if request_id in self._queues:
                raise ValueError(f"request_id: {request_id!r} is already running")
            self._queues[request_id] = stream
            self._prompts[request_id] = ids
        if params.structured is not None:
            await self.compile(params)  # a no-op cache hit when the server compiled it already
            params = dataclasses.replace(
                params, structured=dataclasses.replace(params.structured, compiled=None)
            )
        try:
            self._send(("add", request_id, ids, params, adapter))
            async for out in stream:
                yield out
        finally:
            if not stream.finished:
                self.abort(request_id)
            with self._lock:
                self._queues.pop(request_id, None)
                self._prompts.pop(request_id, None)

    def _check_adapter(self, adapter: str | None) -> None:
        """The engine's own adapter check (engine.adapter_id), before anything is queued."""
        if not adapter:
            return
        names = [a["name"] for a in self.config.adapters]
        if not names:
            raise ValueError(f"model: unknown adapter {adapter!r}; no adapters are configured")
        if adapter not in names:
            raise ValueError(f"model: unknown adapter {adapter!r}; adapters: {', '.join(names)}")

    async def compile(self, params: SamplingParams) -> Compiled:
        """Compile the request's grammar on the core's compile thread (never on its step loop); the
        compiled grammar stays in the core's cache for the request. ValueError: a bad schema."""
        if self.error is not None:
            raise EngineDead(f"engine failed: {self.error}")
        token = next(self._tokens)
        fut = self._loop.create_future()
        self._compiles[token] = fut
        self._send(("compile", token, dataclasses.replace(params.structured, compiled=None)))
        try:
            seconds, cached = await fut
        finally:
            self._compiles.pop(token, None)
        return Compiled(None, seconds, cached)

    def abort(self, request_id: str) -> None:
        """Ask the core to abort (it frees the blocks within one step); a no-op once the core is dead."""
        if self.error is None:
            try:
                self._send(("abort", request_id, time.monotonic()))
            except EngineDead:
                pass

    # --- the channel ----------------------------------------------------------------
    def _send(self, msg: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(msg)
        except (OSError, EOFError, BrokenPipeError) as e:
            if not self._stopping:
                self._fail(RuntimeError(f"engine core channel closed: {e}"))
            raise EngineDead(f"engine failed: {self.error or e}") from None

    def _read(self) -> None:
        """Reader thread: every message from the core, until the channel closes."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                return  # the monitor reports an unexpected exit
            kind = msg[0]
            if kind == "step":
                _, deltas, releases, stats = msg
                self._stats = stats
                if releases and self.on_abort_release is not None:
                    for s in releases:
                        self.on_abort_release(s)
                if deltas:
                    self._loop.call_soon_threadsafe(self._deliver, [self._rebuild(d) for d in deltas])
            elif kind == "error":
                self._loop.call_soon_threadsafe(self._deliver, [msg[2]], msg[1])
            elif kind == "compiled":
                _, token, seconds, cached, error = msg
                self._loop.call_soon_threadsafe(self._resolve, token, (seconds, cached), error)
            elif kind == "fatal":
                self._fail(RuntimeError(msg[1]))
                return

    def _rebuild(self, d: tuple) -> RequestOutput:
        rid, index, new_ids, keep, add, delta_text, finished, reason, metrics, preempt, new_lps = d
        key = (rid, index)
        ch = self._choices.get(key)
        if ch is None:
            with self._lock:
                prompt = self._prompts.get(rid, [])
            ch = self._choices[key] = _Choice(prompt)
        ch.token_ids += new_ids
        ch.text = ch.text[:keep] + add
        ch.logprobs += new_lps
        if finished:
            self._choices.pop(key, None)
        return RequestOutput(
            request_id=rid,
            prompt_token_ids=ch.prompt_token_ids,
            token_ids=list(ch.token_ids),
            new_token_ids=new_ids,
            text=ch.text,
            delta_text=delta_text,
            finished=finished,
            finish_reason=reason,
            metrics=RequestMetrics(*metrics),
            num_preemptions=preempt,
            index=index,
            logprobs=list(ch.logprobs),
            new_logprobs=new_lps,
        )

    def _deliver(self, outs: list[Any], request_id: str | None = None) -> None:
        """On the event loop: each output (or error) onto its request's queue."""
        for out in outs:
            q = self._queues.get(request_id if request_id is not None else out.request_id)
            if q is not None:
                q.put(out)

    def _resolve(self, token: int, result: tuple, error: BaseException | None) -> None:
        fut = self._compiles.get(token)
        if fut is not None and not fut.done():
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

    def _monitor(self) -> None:
        """Wait on the core's sentinel: an exit we did not ask for is fatal."""
        self._proc.join()
        if not self._stopping:
            self._fail(RuntimeError(f"engine core process exited (exit code {self._proc.exitcode})"))

    def _fail(self, e: BaseException) -> None:
        """The core is dead: every waiting request and compile gets EngineDead, the server is told."""
        if not self._fatal_once.acquire(blocking=False):
            return
        self.error = e
        dead = EngineDead(f"engine failed: {e}")

        def fail_all() -> None:
            for q in list(self._queues.values()):
                q.put(dead)
            for fut in list(self._compiles.values()):
                if not fut.done():
                    fut.set_exception(dead)

        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fail_all)
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()  # a core that said it is dead but hangs must still go
        if self.on_fatal is not None:
            self.on_fatal(f"{type(e).__name__}: {e}")
