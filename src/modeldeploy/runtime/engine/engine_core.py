"""The engine core process: `Engine.step` in a process of its own, driven over one local pipe.

Why a process: in one process the HTTP server's SSE and JSON work and the step loop share a GIL, and
the server reached only 0.53-0.65 of the engine's tokens/s at 32 streams (bench/results/server_cpu.md).
vLLM split the same way for the same reason. The API server process keeps HTTP, validation,
tokenization of prompts and admission; this process keeps the scheduler, block manager, model,
sampler and the detokenizer (stop strings end a sequence in the step that completes them, so no
extra token is computed for a sequence that has already stopped). It is tensor-parallel rank 0: its
`Engine` starts the worker ranks (`parallel.py`), so they hang off this process, not off the server.

Channel: a `multiprocessing` pipe (a Unix socketpair) carrying pickled tuples. Chosen over ZeroMQ +
msgpack because it adds no dependency to the runtime image, it is the channel the tensor-parallel
ranks already use, and both ends are our own code in one pod (pickle's trust boundary is the pod).
Per step the core sends one message: the step's outputs as deltas (new tokens, new text, new
logprobs; the client rebuilds the cumulative fields), the abort release times, and the stats.

Messages, client -> core: ("add", rid, ids, params, adapter), ("abort", rid, requested_monotonic),
("compile", token, structured), ("stop",).
Core -> client: ("progress", phase, frac), ("ready", config, info, stats), ("load_failed", exc),
("step", deltas, releases, stats), ("stats", stats), ("compiled", token, seconds, cached, error),
("error", rid, exc), ("fatal", message).
Timestamps are `time.monotonic()`, one clock for every process of the machine on Linux, so the
server's phase histograms and abort release times mix the two sides correctly.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.output import RequestOutput

IDLE_POLL_S = 0.5

# One output on the wire: (request_id, index, new_token_ids, text_keep, text_add, delta_text, finished,
# finish_reason, metrics tuple, num_preemptions, new_logprobs). text = previous text[:text_keep] + text_add
# (a stop string can shorten the text, so it is not always an extension).
Delta = tuple


class DeltaEncoder:
    """The core's half of the delta protocol: remembers how much text each choice has been sent."""

    def __init__(self) -> None:
        self._sent: dict[tuple[str, int], int] = {}

    def encode(self, out: RequestOutput) -> Delta:
        key = (out.request_id, out.index)
        prev = self._sent.get(key, 0)
        keep = min(prev, len(out.text))
        if out.finished:
            self._sent.pop(key, None)
        else:
            self._sent[key] = len(out.text)
        return (
            out.request_id,
            out.index,
            out.new_token_ids,
            keep,
            out.text[keep:],
            out.delta_text,
            out.finished,
            out.finish_reason,
            dataclasses.astuple(out.metrics),
            out.num_preemptions,
            out.new_logprobs,
        )


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def main(
    conn: mpc.Connection, config: EngineConfig, step_delay_s: float = 0.0, log_level: int = logging.INFO
) -> None:
    """Process entry (spawned): load, report, then serve the pipe until "stop" or the server is gone.
    Logs go to stderr like the server's (a spawned process starts with no logging configured)."""
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    # The API server owns the signals: it drains first, then sends "stop" (a Ctrl-C in a terminal
    # reaches the whole process group, and must not kill the core under a draining server).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Core(conn, config, step_delay_s).run()


class Core:
    def __init__(self, conn: mpc.Connection, config: EngineConfig, step_delay_s: float):
        self.conn, self.config, self.step_delay_s = conn, config, step_delay_s
        self._send_lock = threading.Lock()
        self._stop = False
        self._fatal_once = threading.Lock()
        self.engine: Any = None
        self.encoder = DeltaEncoder()
        self._compile_pool: ThreadPoolExecutor | None = None

    def send(self, msg: tuple) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def run(self) -> None:
        from modeldeploy.runtime.engine.llm_engine import Engine  # torch is imported in this process only

        threads = _reserve_a_core(self.config.tensor_parallel_size)
        try:
            self.engine = Engine(self.config, lambda phase, frac: self.send(("progress", phase, frac)))
        except BaseException as e:  # noqa: BLE001 - any load error goes back to the server's readiness
            self.send(("load_failed", _picklable(e)))
            return
        if self.engine.tp is not None:
            self.engine.tp.set_on_failure(self._fatal)
        from modeldeploy.runtime.engine.async_engine import _background_priority

        self._compile_pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="grammar-compile", initializer=_background_priority
        )
        info = {
            **self.engine.info(),
            "engine_core": {"layout": "process", "pid": os.getpid(), "torch_threads": threads},
        }
        self.send(("ready", self.engine.config, info, self.engine.stats()))
        try:
            self._loop()
        except (EOFError, OSError):  # the server went away: nothing is left to serve
            pass
        except BaseException as e:  # noqa: BLE001 - the step loop died: tell the server, exit non-zero
            self._fatal(f"{type(e).__name__}: {e}")
        finally:
            self._compile_pool.shutdown(wait=False, cancel_futures=True)
            self.engine.close()
        if self.engine.tp is not None and self.engine.tp.failure:
            os._exit(1)

    def _loop(self) -> None:
        engine = self.engine
        while not self._stop:
            busy = engine.has_work()
            releases: list[float] = []
            aborted: list[RequestOutput] = []
            handled = False
            if self.conn.poll(0 if busy else IDLE_POLL_S):
                while not self._stop and self.conn.poll(0):
                    self._handle(self.conn.recv(), releases, aborted)
                    handled = True
            if self._stop:
                return
            outs = engine.step() if engine.has_work() else []
            if outs or aborted or handled:  # the stats travel with every change, none when idle
                deltas = [self.encoder.encode(o) for o in aborted + outs]
                self.send(("step", deltas, releases, engine.stats()))
            if outs and self.step_delay_s:
                time.sleep(self.step_delay_s)

    def _handle(self, msg: tuple, releases: list[float], aborted: list[RequestOutput]) -> None:
        kind = msg[0]
        if kind == "add":
            _, rid, ids, params, adapter = msg
            try:
                self.engine.add_request(rid, ids, params, adapter=adapter)
            except ValueError as e:
                self.send(("error", rid, e))
        elif kind == "abort":
            _, rid, requested = msg
            for out in self.engine.abort(rid):
                aborted.append(out)
                if out.metrics.finished_time is not None:
                    releases.append(out.metrics.finished_time - requested)
        elif kind == "compile":
            _, token, spec = msg
            self._compile_pool.submit(self._compile, token, spec)
        elif kind == "stop":
            self._stop = True
        else:
            raise ValueError(f"engine core: unknown message {kind!r}")

    def _compile(self, token: int, spec: Any) -> None:
        try:
            res = self.engine.grammars.compile(spec)  # kept in the compiler's cache for the "add"
            self.send(("compiled", token, res.seconds, res.cached, None))
        except ValueError as e:
            self.send(("compiled", token, 0.0, False, e))
        except BaseException as e:  # noqa: BLE001 - a compile bug is that request's error, not the core's
            self.send(("compiled", token, 0.0, False, RuntimeError(f"{type(e).__name__}: {e}")))

    def _fatal(self, message: str) -> None:
        """The core can no longer serve (its step raised, or a rank died): say so once and stop."""
        if not self._fatal_once.acquire(blocking=False):
            return
        self._stop = True
        if self.engine is not None and self.engine.tp is not None:
            self.engine.tp.kill()  # no rank outlives a dead engine, a hung one included
        try:
            self.send(("fatal", message))
        except (OSError, EOFError):
            pass
        os._exit(1)  # a step blocked in a dead collective never returns: leave at once


def _reserve_a_core(tp_size: int) -> int:
    """Leave one CPU to the API server process: torch's intra-op threads spin at their barriers, and
    with as many of them as CPUs plus a busy server process, every parallel op waits for a thread the
    kernel has descheduled (measured on 2 CPUs at 32 streams: 0.05 of the engine's tokens/s with 2
    threads, 0.54 with 1; bench/results/server_cpu.md). OMP_NUM_THREADS, when set, decides instead.
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
