"""EngineCoreClient: the API server's handle on the engine core process (`engine_core.py`).

The process layout of `EngineClient`. Prompts are tokenized here (this process's own tokenizer,
read from the same pinned directory) and requests are checked against the effective config
before they are queued; a reader thread turns each step's message into outputs on the requests'
streams (one `call_soon_threadsafe` per step).

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
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.client import messages as m
from modeldeploy.runtime.engine.client.base import EngineClient, Progress, no_progress
from modeldeploy.runtime.engine.output import (
    CompileResult,
    EngineDead,
    EngineStats,
    RequestMetrics,
    RequestOutput,
)
from modeldeploy.runtime.engine.sampling_params import SamplingParams

STOP_TIMEOUT_S = 30.0


@dataclasses.dataclass
class _Choice:
    """What the client rebuilds per choice from the deltas: the cumulative fields of RequestOutput."""

    prompt_token_ids: list[int]
    token_ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    logprobs: list = dataclasses.field(default_factory=list)
    prompt_logprobs: list | None = None  # from the first delta (prompt_logprobs asked)


class EngineCoreClient(EngineClient):
    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.pid: int | None = None
        self._info: dict[str, Any] = {}
        self._stats: EngineStats | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._choices: dict[tuple[str, int], _Choice] = {}
        self._compiles: dict[int, asyncio.Future[tuple[float, bool]]] = {}
        self._tokens = itertools.count()
        self._send_lock = threading.Lock()
        self._fatal_once = threading.Lock()
        self._stopping = False
        self._proc: BaseProcess | None = None
        self._conn: mpc.Connection | None = None
        self._on_message: dict[m.MessageKind, Callable[[Any], None]] = {
            m.MessageKind.STEP: self._on_step,
            m.MessageKind.ERROR: self._on_error,
            m.MessageKind.COMPILE_DONE: self._on_compile_done,
        }

    # --- lifecycle ------------------------------------------------------------------
    async def start(self, progress: Progress = no_progress) -> None:
        """Spawn the core (it loads while this process keeps answering health checks), read this
        process's tokenizer meanwhile, and return once the core has loaded and warmed up."""
        self._loop = asyncio.get_running_loop()
        ctx = mp.get_context("spawn")  # CUDA cannot be forked; the core is a fresh interpreter
        parent, child = ctx.Pipe(duplex=True)
        from modeldeploy.runtime.engine.client import engine_core

        proc = self._proc = ctx.Process(
            target=engine_core.main,
            args=(
                child,
                self.config,
                self.step_delay_s,
                logging.getLogger("modeldeploy").getEffectiveLevel(),
            ),
            name="engine-core",
        )
        proc.start()
        child.close()
        self._conn, self.pid = parent, proc.pid
        tokenizer = asyncio.create_task(asyncio.to_thread(self._read_tokenizer))
        try:
            ready = await asyncio.to_thread(self._await_ready, parent, proc, progress)
        except BaseException:
            tokenizer.cancel()
            await asyncio.to_thread(self._reap, 5.0)
            raise
        self.config, self._info, self._stats = ready.config, ready.info, ready.stats
        self.tokenizer = await tokenizer
        threading.Thread(target=self._read, args=(parent,), name="engine-core-reader", daemon=True).start()
        threading.Thread(target=self._monitor, args=(proc,), name="engine-core-monitor", daemon=True).start()

    def _read_tokenizer(self) -> Any:
        from modeldeploy.runtime.loader import load_tokenizer  # a GGUF model directory's too

        return load_tokenizer(Path(self.config.tokenizer or self.config.model))

    @staticmethod
    def _await_ready(conn: mpc.Connection, proc: BaseProcess, progress: Progress) -> m.Ready:
        """Relay load progress until Ready; a load error is raised here with its own type."""
        while True:
            ready = mpc.wait([conn, proc.sentinel])
            if conn in ready:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    msg = None
                if isinstance(msg, m.Progress):
                    progress(msg.phase, msg.fraction)
                    continue
                if isinstance(msg, m.Ready):
                    return msg
                if isinstance(msg, m.LoadFailed):
                    raise msg.error
            proc.join(5)
            raise RuntimeError(f"engine core process exited while loading (exit code {proc.exitcode})")

    async def shutdown(self) -> None:
        """Stop the core (it stops its tensor-parallel ranks), waiting up to STOP_TIMEOUT_S."""
        self._stopping = True
        if self._proc is None:
            return
        if self.error is None:
            self._send(m.Stop())
        await asyncio.to_thread(self._reap, STOP_TIMEOUT_S if self.error is None else 5.0)

    def _reap(self, timeout_s: float) -> None:
        if self._proc is None:
            return
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    # --- the engine interface -------------------------------------------------------
    def info(self) -> dict[str, Any]:
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

    def _submit(self, request_id: str, ids: list[int], params: SamplingParams, adapter: str | None) -> None:
        if params.structured is not None and params.structured.compiled is not None:
            # the compiled grammar is this process's object; the core uses its own cached one
            params = dataclasses.replace(
                params, structured=dataclasses.replace(params.structured, compiled=None)
            )
        self._send(m.Add(request_id, ids, params, adapter))

    async def compile(self, params: SamplingParams) -> CompileResult:
        """On the core's compile thread (never on its step loop); the compiled grammar stays in the
        core's cache for the request, so `compiled` is None here."""
        if self.error is not None:
            raise EngineDead(f"engine failed: {self.error}")
        if params.structured is None:
            raise ValueError("structured: the request has no grammar to compile")
        token = next(self._tokens)
        fut = asyncio.get_running_loop().create_future()
        self._compiles[token] = fut
        self._send(m.Compile(token, dataclasses.replace(params.structured, compiled=None)))
        try:
            seconds, cached = await fut
        finally:
            self._compiles.pop(token, None)
        return CompileResult(None, seconds, cached)

    def abort(self, request_id: str) -> None:
        """Ask the core to abort (it frees the blocks within one step); a no-op once the core is dead."""
        if self.error is None:
            try:
                self._send(m.Abort(request_id, time.monotonic()))
            except EngineDead:
                pass

    # --- the channel ----------------------------------------------------------------
    def _send(self, msg: m.Message) -> None:
        try:
            if self._conn is None:
                raise OSError("engine core not started")
            with self._send_lock:
                self._conn.send(msg)
        except (OSError, EOFError, BrokenPipeError) as e:
            if not self._stopping:
                self._fail(RuntimeError(f"engine core channel closed: {e}"))
            raise EngineDead(f"engine failed: {self.error or e}") from None

    def _read(self, conn: mpc.Connection) -> None:
        """Reader thread: every message from the core, until the channel closes or the core is fatal."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return  # the monitor reports an unexpected exit
            handle = self._on_message.get(msg.kind)
            if handle is None:  # Fatal, or a message that has no place after Ready
                text = msg.message if isinstance(msg, m.Fatal) else f"unexpected message {msg.kind}"
                self._fail(RuntimeError(text))
                return
            handle(msg)

    def _on_step(self, msg: m.Step) -> None:
        self._stats = msg.stats
        if msg.abort_releases and self.on_abort_release is not None:
            for s in msg.abort_releases:
                self.on_abort_release(s)
        if msg.deltas:
            self._call_soon(self._deliver, [self._rebuild(d) for d in msg.deltas])

    def _on_error(self, msg: m.Error) -> None:
        self._call_soon(self._deliver, [msg.error], msg.request_id)

    def _on_compile_done(self, msg: m.CompileDone) -> None:
        self._call_soon(self._resolve, msg)

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(fn, *args)

    def _rebuild(self, d: m.Delta) -> RequestOutput:
        key = (d.request_id, d.index)
        ch = self._choices.get(key)
        if ch is None:
            stream = self._stream(d.request_id)
            ch = self._choices[key] = _Choice(stream.prompt_token_ids if stream is not None else [])
        ch.token_ids += d.new_token_ids
        ch.text = ch.text[: d.text_keep] + d.text_add
        ch.logprobs += d.new_logprobs
        if d.prompt_logprobs is not None:
            ch.prompt_logprobs = d.prompt_logprobs
        if d.finished:
            self._choices.pop(key, None)
        return RequestOutput(
            request_id=d.request_id,
            prompt_token_ids=ch.prompt_token_ids,
            token_ids=list(ch.token_ids),
            new_token_ids=d.new_token_ids,
            text=ch.text,
            delta_text=d.delta_text,
            finished=d.finished,
            finish_reason=d.finish_reason,
            metrics=RequestMetrics(*d.metrics),
            num_preemptions=d.num_preemptions,
            index=d.index,
            logprobs=list(ch.logprobs),
            new_logprobs=d.new_logprobs,
            prompt_logprobs=ch.prompt_logprobs,
        )

    def _deliver(self, outs: list[Any], request_id: str | None = None) -> None:
        """On the event loop: each output (or error) onto its request's stream."""
        for out in outs:
            stream = self._stream(request_id if request_id is not None else out.request_id)
            if stream is not None:
                stream.put(out)

    def _resolve(self, msg: m.CompileDone) -> None:
        fut = self._compiles.get(msg.token)
        if fut is not None and not fut.done():
            if msg.error is not None:
                fut.set_exception(msg.error)
            else:
                fut.set_result((msg.seconds, msg.cached))

    def _monitor(self, proc: BaseProcess) -> None:
        """Wait on the core's sentinel: an exit we did not ask for is fatal."""
        proc.join()
        if not self._stopping:
            self._fail(RuntimeError(f"engine core process exited (exit code {proc.exitcode})"))

    def _fail(self, e: BaseException) -> None:
        """The core is dead: the server is told first, then every waiting request and compile gets
        EngineDead (a caller that sees EngineDead can count on the server knowing already)."""
        if not self._fatal_once.acquire(blocking=False):
            return
        self.error = e
        if self.on_fatal is not None:
            self.on_fatal(f"{type(e).__name__}: {e}")
        dead = EngineDead(f"engine failed: {e}")

        def fail_all() -> None:
            for stream in self._streams_now():
                stream.put(dead)
            for fut in list(self._compiles.values()):
                if not fut.done():
                    fut.set_exception(dead)

        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fail_all)
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()  # a core that said it is dead but hangs must still go
