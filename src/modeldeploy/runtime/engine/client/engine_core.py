"""The engine core process: `LLMEngine.step` in a process of its own, driven over one local pipe.

Why a process: in one process the HTTP server's SSE and JSON work and the step loop share a GIL,
and the server falls well short of the engine's tokens/s at many streams (bench/results/server_cpu.md).
vLLM splits the same way for the same reason. The API server process keeps HTTP, validation,
tokenization of prompts and admission; this process keeps the scheduler, block manager, model,
sampler and the detokenizer (stop strings end a sequence in the step that completes them, so no
extra token is computed for a sequence that has already stopped). It is tensor-parallel rank 0:
its engine starts the worker ranks (`parallel/`), so they hang off this process, not the server.

Channel: a `multiprocessing` pipe (a Unix socketpair) carrying pickled NamedTuples (`messages.py`).
Chosen over ZeroMQ + msgpack because it adds no dependency to the runtime image, it is the channel
the tensor-parallel ranks already use, and both ends are our own code in one pod (pickle's trust
boundary is the pod). Per step the core sends one `Step`: the step's outputs as deltas (new tokens,
new text, new logprobs; the client rebuilds the cumulative fields), the abort release times and the
stats. Timestamps are `time.monotonic()`, so the server's phase histograms and abort release times
mix the two sides correctly.
"""

from __future__ import annotations

import logging
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.client import messages as m
from modeldeploy.runtime.engine.heap import freeze_after_load
from modeldeploy.runtime.engine.output import RequestOutput
from modeldeploy.runtime.engine.sampling_params import Structured
from modeldeploy.runtime.engine.structured_output.compile_pool import compile_pool

if TYPE_CHECKING:
    from modeldeploy.runtime.engine.llm_engine import LLMEngine

IDLE_POLL_S = 0.5


class DeltaEncoder:
    """The core's half of the delta protocol: remembers how much text each choice has been sent."""

    def __init__(self) -> None:
        self._sent: dict[tuple[str, int], int] = {}

    def encode(self, out: RequestOutput) -> m.Delta:
        key = (out.request_id, out.index)
        first = key not in self._sent
        prev = self._sent.get(key, 0)
        keep = min(prev, len(out.text))
        if out.finished:
            self._sent.pop(key, None)
        else:
            self._sent[key] = len(out.text)
        mt = out.metrics
        return m.Delta(
            out.request_id,
            out.index,
            out.new_token_ids,
            keep,
            out.text[keep:],
            out.delta_text,
            out.finished,
            out.finish_reason,
            (
                mt.arrival_time,
                mt.first_scheduled_time,
                mt.first_token_time,
                mt.last_token_time,
                mt.finished_time,
                mt.prefill_chunks,
            ),
            out.num_preemptions,
            out.new_logprobs,
            out.prompt_logprobs if first else None,
        )


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def main(
    conn: mpc.Connection, config: EngineConfig, step_delay_s: float = 0.0, log_level: int = logging.INFO
) -> None:
    """Process entry (spawned): load, report, then serve the pipe until Stop or the server is gone.
    Logs go to stderr like the server's (a spawned process starts with no logging configured)."""
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    # The API server owns the signals: it drains first, then sends Stop (a Ctrl-C in a terminal
    # reaches the whole process group, and must not kill the core under a draining server).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    EngineCore(conn, config, step_delay_s).run()


class EngineCore:
    def __init__(self, conn: mpc.Connection, config: EngineConfig, step_delay_s: float):
        self.conn, self.config, self.step_delay_s = conn, config, step_delay_s
        self._send_lock = threading.Lock()
        self._stop = False
        self._fatal_once = threading.Lock()
        self.engine: LLMEngine | None = None
        self.encoder = DeltaEncoder()
        self._compile_pool: ThreadPoolExecutor | None = None
        # what the messages handled before a step add to that step's Step message
        self._releases: list[float] = []
        self._aborted: list[RequestOutput] = []
        self._on_message: dict[m.MessageKind, Callable[[Any], None]] = {
            m.MessageKind.ADD: self._on_add,
            m.MessageKind.ABORT: self._on_abort,
            m.MessageKind.COMPILE: self._on_compile,
            m.MessageKind.STOP: self._on_stop,
        }

    def send(self, msg: m.Message) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def run(self) -> None:
        from modeldeploy.runtime.engine.llm_engine import LLMEngine  # torch is imported in this process only

        threads = _reserve_a_core(self.config.tensor_parallel_size)
        try:
            engine = self.engine = LLMEngine(
                self.config, lambda phase, frac: self.send(m.Progress(phase, frac))
            )
        except BaseException as e:  # noqa: BLE001 - any load error goes back to the server's readiness
            self.send(m.LoadFailed(_picklable(e)))
            return
        if engine.tp is not None:
            engine.tp.set_on_failure(self._fatal)
        frozen = freeze_after_load()  # the step loop never pays a full collection over the loaded model
        pool = self._compile_pool = compile_pool()
        info = {
            **engine.info(),
            "engine_core": {
                "layout": "process",
                "pid": os.getpid(),
                "torch_threads": threads,
                "gc_frozen_objects": frozen,
            },
        }
        self.send(m.Ready(engine.config, info, engine.stats()))
        try:
            self._loop(engine)
        except (EOFError, OSError):  # the server went away: nothing is left to serve
            pass
        except BaseException as e:  # noqa: BLE001 - the step loop died: tell the server, exit non-zero
            self._fatal(f"{type(e).__name__}: {e}")
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            engine.close()
        if engine.tp is not None and engine.tp.failure:
            os._exit(1)

    def _loop(self, engine: LLMEngine) -> None:
        while not self._stop:
            busy = engine.has_work()
            self._releases, self._aborted = [], []
            handled = False
            if self.conn.poll(0 if busy else IDLE_POLL_S):
                while not self._stop and self.conn.poll(0):
                    self._handle(self.conn.recv())
                    handled = True
            if self._stop:
                return
            outs = engine.step() if engine.has_work() else []
            if outs or self._aborted or handled:  # the stats travel with every change, none when idle
                deltas = [self.encoder.encode(o) for o in self._aborted + outs]
                self.send(m.Step(deltas, self._releases, engine.stats()))
            if outs and self.step_delay_s:
                time.sleep(self.step_delay_s)

    def _handle(self, msg: m.Message) -> None:
        handle = self._on_message.get(msg.kind)
        if handle is None:
            raise ValueError(f"engine core: unexpected message {msg.kind}")
        handle(msg)

    def _on_add(self, msg: m.Add) -> None:
        assert self.engine is not None
        try:
            self.engine.add_request(msg.request_id, msg.prompt_token_ids, msg.params, adapter=msg.adapter)
        except ValueError as e:
            self.send(m.Error(msg.request_id, e))

    def _on_abort(self, msg: m.Abort) -> None:
        assert self.engine is not None
        for out in self.engine.abort(msg.request_id):
            self._aborted.append(out)
            if out.metrics.finished_time is not None:
                self._releases.append(out.metrics.finished_time - msg.requested_at)

    def _on_compile(self, msg: m.Compile) -> None:
        assert self._compile_pool is not None
        self._compile_pool.submit(self._compile, msg.token, msg.spec)

    def _on_stop(self, msg: m.Stop) -> None:
        self._stop = True

    def _compile(self, token: int, spec: Structured) -> None:
        assert self.engine is not None
        try:
            res = self.engine.grammars.compile(spec)  # kept in the compiler's cache for the Add
            self.send(m.CompileDone(token, res.seconds, res.cached, None))
        except ValueError as e:
            self.send(m.CompileDone(token, 0.0, False, e))
        except BaseException as e:  # noqa: BLE001 - a compile bug is that request's error, not the core's
            self.send(m.CompileDone(token, 0.0, False, RuntimeError(f"{type(e).__name__}: {e}")))

    def _fatal(self, message: str) -> None:
        """The core can no longer serve (its step raised, or a rank died): say so once and stop."""
        if not self._fatal_once.acquire(blocking=False):
            return
        self._stop = True
        if self.engine is not None and self.engine.tp is not None:
            self.engine.tp.kill()  # no rank outlives a dead engine, a hung one included
        try:
            self.send(m.Fatal(message))
        except (OSError, EOFError):
            pass
        os._exit(1)  # a step blocked in a dead collective never returns: leave at once


def _reserve_a_core(tp_size: int) -> int:
    """Leave one CPU to the API server process: torch's intra-op threads spin at their barriers, and
    with as many of them as CPUs plus a busy server process, every parallel op waits for a thread the
    kernel has descheduled (bench/results/server_cpu.md measures it on 2 CPUs). OMP_NUM_THREADS, when
    set, decides instead.
    Under tensor parallelism rank 0 takes its share of the rest. Returns the thread count."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, min(torch.get_num_threads(), (usable_cpus() - 1) // tp_size)))
    return torch.get_num_threads()


def usable_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The CPUs this process may use: its affinity, capped by the cgroup's CPU quota (a pod's CPU
    limit is a quota, not a cpuset: a 4-CPU pod on a 64-core node sees 64 CPUs in its affinity)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = open(cpu_max).read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def _picklable(e: BaseException) -> BaseException:
    """The exception itself when it survives pickling (its type names the problem), else a RuntimeError."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")
