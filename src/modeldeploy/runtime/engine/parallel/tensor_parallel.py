"""Tensor-parallel ranks inside one pod: rank 0 drives N-1 worker processes that only run the model.

Process layout (nano-vllm's, and the one the engine-core split builds on): the process that runs
`LLMEngine` is rank 0 and keeps the scheduler, block manager, sampler and detokenizer. Each step it
sends the flat batch (`StepPlan`: token ids, positions, slot mapping, block tables) to every worker
over a pipe as typed messages (`messages.py`), then every rank runs the forward on its own shard
(`models/shard.py`), meeting in the two all-reduces of each layer (`collective.py`). Workers
(`rank_worker.py`) are started with `spawn` (CUDA cannot be forked), one GPU each on cuda, and hold
no tokenizer, scheduler or sampler.

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
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.parallel import messages as tpm
from modeldeploy.runtime.engine.parallel.collective import Collective
from modeldeploy.runtime.engine.parallel.rank_worker import worker_main
from modeldeploy.runtime.engine.worker.model_runner import StepPlan

log = logging.getLogger("modeldeploy.engine")
STOP_TIMEOUT_S = 10.0


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
            self._receive(tpm.Hello, config.tp_timeout_s + 120)  # a worker that cannot start fails here, fast
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

    def send(self, message: tpm.ToWorker) -> None:
        """The same message to every worker (pickled once); a dead worker raises here, not later."""
        if self.failure is not None:
            raise RuntimeError(self.failure)
        data = tpm.encode(message)
        for conn in self.pipes:
            conn.send_bytes(data)

    def alloc(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        """Every worker allocates its share of the KV cache, as rank 0 sized it."""
        self.send(tpm.Alloc(num_blocks, block_size, max_model_len))

    def run(self, plan: StepPlan) -> None:
        """The other ranks run rank 0's plan for this step on their shards."""
        self.send(tpm.Run(plan))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.send(tpm.CopyBlocks(pairs))

    def wait_ready(self, timeout_s: float) -> list[tpm.Ready]:
        """Each worker's load report; ValueError carrying the worker's own error when one failed."""
        return self._receive(tpm.Ready, timeout_s)

    def _receive(self, want: type[tpm.M], timeout_s: float) -> list[tpm.M]:
        """One `want` message from every worker, in rank order; a worker's error or death raises, and
        so does any other message (UnexpectedMessage)."""
        bodies: list[tpm.M] = []
        deadline = time.monotonic() + timeout_s
        for rank, (conn, p) in enumerate(zip(self.pipes, self.workers, strict=True), start=1):
            while not conn.poll(0.1):
                if not p.is_alive():
                    raise RuntimeError(
                        f"tensor-parallel rank {rank} exited with code {p.exitcode} while starting"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"tensor-parallel rank {rank}: no {want.__name__} within {timeout_s:.0f}s"
                    )
            bodies.append(tpm.expect(tpm.recv(conn), want, f"tensor-parallel rank {rank}"))
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
                tpm.send(conn, tpm.Stop())
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
