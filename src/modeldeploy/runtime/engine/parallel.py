"""Tensor-parallel ranks inside one pod: rank 0 drives N-1 worker processes that only run the model.

Process layout (nano-vllm's, and the one the engine-core split builds on): the process that runs
`LLMEngine` is rank 0 and keeps the scheduler, block manager, sampler and detokenizer. Each step it
sends the flat batch (`StepPlan`: token ids, positions, slot mapping, block tables) to every worker
over a pipe, then every rank runs the forward on its own shard (`models/shard.py`), meeting in the
two all-reduces of each layer. Workers are started with `spawn` (CUDA cannot be forked), one GPU
each on cuda, and hold no tokenizer, scheduler or sampler.

Collectives run on a process group of our own built on a loopback TCPStore (gloo on cpu, NCCL on
cuda), never torch's global default group: several engines can live in one process (tests), and
nothing else in the process is touched.

Failure, which must never be a hang:
- a monitor thread waits on the workers' process sentinels; a worker that exits for any reason
  calls `on_failure` at once (the server turns that into 503 and a non-zero exit);
- every collective carries `tp_timeout_s`, so a rank that hangs fails the step instead of stalling it;
- a worker exits when rank 0 goes away: its pipe reaches EOF, and a watchdog sees its parent change;
- SIGTERM/SIGINT are ignored by workers: rank 0 drains first, then stops them (exit 0).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from modeldeploy.kernels import quant
from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.heap import freeze_after_load
from modeldeploy.runtime.models.shard import Shard

log = logging.getLogger("modeldeploy.engine")
STOP_TIMEOUT_S = 10.0


class Collective:
    """All-reduce over this pod's ranks; counts what it moves (the per-step figure in the bench)."""

    def __init__(
        self,
        store: dist.Store,  # pyright: ignore[reportPrivateImportUsage]  # public API, missing from __all__
        rank: int,
        size: int,
        device: torch.device,
        timeout_s: float,
    ):
        timeout = timedelta(seconds=timeout_s)
        if device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.group = dist.ProcessGroupNCCL(store, rank, size, opts)
            self.backend = "nccl"
        else:
            self.group = dist.ProcessGroupGloo(store, rank, size, timeout)
            self.backend = "gloo"
        self.bytes_total = 0
        self.calls_total = 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` across ranks in place (every rank gets the same bits) and return it."""
        self.group.allreduce([x]).wait()  # pyright: ignore[reportAttributeAccessIssue]  # stubs omit it
        self.bytes_total += x.numel() * x.element_size()
        self.calls_total += 1
        return x


class TensorParallel:
    """Rank 0's handle on the worker ranks: start, send each step, watch, stop."""

    def __init__(self, config: EngineConfig, device: torch.device):
        self.size = config.tensor_parallel_size
        self.failure: str | None = None
        self._on_failure: Callable[[str], None] | None = None
        self._stopping = threading.Event()
        self._store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]  # missing from __all__
            "127.0.0.1",
            0,
            self.size,
            True,
            timedelta(seconds=config.tp_timeout_s + 60),
            wait_for_workers=False,
        )
        ctx = mp.get_context("spawn")
        self.workers: list[Any] = []
        self.pipes: list[mpc.Connection] = []
        for rank in range(1, self.size):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(
                target=worker_main,
                args=(config, rank, self._store.port, theirs, os.getpid()),
                name=f"modeldeploy-tp-rank{rank}",
                daemon=True,
            )
            p.start()
            theirs.close()
            self.workers.append(p)
            self.pipes.append(ours)
        threading.Thread(target=self._watch, name="tp-monitor", daemon=True).start()
        try:
            self._receive("hello", config.tp_timeout_s + 120)  # a worker that cannot start fails here, fast
            self.collective = Collective(self._store, 0, self.size, device, config.tp_timeout_s)
        except BaseException:
            self.kill()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.workers]

    def set_on_failure(self, fn: Callable[[str], None]) -> None:
        """Who to tell when a rank dies; told at once if one already has."""
        self._on_failure = fn
        if self.failure is not None:
            fn(self.failure)

    def _watch(self) -> None:
        by_sentinel = {p.sentinel: (rank, p) for rank, p in enumerate(self.workers, start=1)}
        ready = mpc.wait(list(by_sentinel))
        if self._stopping.is_set():
            return
        rank, p = by_sentinel[ready[0]]
        p.join(0.1)
        self.failure = f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.exitcode}"
        log.error("%s", self.failure)
        if self._on_failure is not None:
            self._on_failure(self.failure)

    def send(self, message: tuple) -> None:
        """The same message to every worker (pickled once); a dead worker raises here, not later."""
        if self.failure is not None:
            raise RuntimeError(self.failure)
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        for conn in self.pipes:
            conn.send_bytes(data)

    def wait_ready(self, timeout_s: float) -> list[dict]:
        """Each worker's load report; ValueError carrying the worker's own error when one failed."""
        return self._receive("ready", timeout_s)

    def _receive(self, kind: str, timeout_s: float) -> list[Any]:
        """One `kind` message from every worker, in rank order; a worker's error or death raises."""
        bodies = []
        deadline = time.monotonic() + timeout_s
        for rank, (conn, p) in enumerate(zip(self.pipes, self.workers, strict=True), start=1):
            while not conn.poll(0.1):
                if not p.is_alive():
                    raise RuntimeError(
                        f"tensor-parallel rank {rank} exited with code {p.exitcode} while starting"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tensor-parallel rank {rank}: no {kind!r} within {timeout_s:.0f}s")
            got, body = pickle.loads(conn.recv_bytes())
            if got == "error":
                raise ValueError(body)
            bodies.append(body)
        return bodies

    def kill(self) -> None:
        """The engine is dead: end every worker now (SIGKILL also ends a stopped or hung one)."""
        self._stopping.set()
        for p in self.workers:
            if p.is_alive():
                p.kill()
        for p in self.workers:
            p.join(2.0)

    def stop(self) -> list[int | None]:
        """Stop every worker (gracefully, then by force); their exit codes."""
        if self._stopping.is_set() and not any(p.is_alive() for p in self.workers):
            return [p.exitcode for p in self.workers]
        self._stopping.set()
        for conn in self.pipes:
            try:
                conn.send_bytes(pickle.dumps(("stop",)))
            except OSError:  # already gone
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.workers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for conn in self.pipes:
            conn.close()
        codes = [p.exitcode for p in self.workers]
        log.info("tensor-parallel ranks stopped: exit codes %s", codes)
        return codes


# --- worker side ---------------------------------------------------------------------------


def worker_main(config: EngineConfig, rank: int, store_port: int, conn: mpc.Connection, parent: int) -> None:
    """A worker rank: join the group, load its shard, report, then run every plan rank 0 sends."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 0 drains first, then stops us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_orphan_watchdog, args=(parent,), daemon=True).start()
    if config.device != "cuda" and not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
    _send(conn, ("hello", os.getpid()))
    try:
        runner, collective = _worker_setup(config, rank, store_port, conn)
    except Exception as e:  # noqa: BLE001 - reported to rank 0, which names it in its load error
        _send(conn, ("error", f"tensor-parallel rank {rank}: {e}"))
        sys.exit(1)
    code = _worker_loop(runner, conn)
    sys.exit(code)


def _worker_setup(config: EngineConfig, rank: int, store_port: int, conn: mpc.Connection):
    from modeldeploy.runtime.engine.model_runner import ModelRunner
    from modeldeploy.runtime.loader import load_shard, resolve_device

    shard = Shard(rank, config.tensor_parallel_size)
    device = resolve_device(config.device, shard)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]  # missing from __all__
        "127.0.0.1", store_port, shard.size, False, timedelta(seconds=config.tp_timeout_s + 60)
    )
    collective = Collective(store, rank, shard.size, device, config.tp_timeout_s)
    loaded = load_shard(config, shard)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    held = sum(quant.nbytes(t) for t in loaded.weights.values())
    freeze_after_load()  # a rank's step loop never pays a full collection over its shard
    _send(conn, ("ready", {"rank": rank, "pid": os.getpid(), "free_bytes": free, "weight_bytes": held}))
    message = pickle.loads(conn.recv_bytes())
    if message[0] != "alloc":  # rank 0 gave up before allocating (its own load failed): stop
        sys.exit(0)
    _, num_blocks, block_size, max_model_len = message
    runner = ModelRunner(loaded, num_blocks, block_size, max_model_len, reduce=collective.all_reduce)
    loaded.weights.clear()
    return runner, collective


def _worker_loop(runner: Any, conn: mpc.Connection) -> int:
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return 1  # rank 0 is gone
        kind = message[0]
        if kind == "run":
            runner.execute(message[1])
        elif kind == "copy":
            runner.copy_blocks(message[1])
        elif kind == "stop":
            return 0


def _send(conn: mpc.Connection, message: tuple) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _orphan_watchdog(parent: int) -> None:
    """No rank outlives the server: exit as soon as rank 0's process is gone."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(0.2)
