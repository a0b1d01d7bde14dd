"""A tensor-parallel worker rank: a spawned process that loads its shard and runs every plan rank 0
sends (tensor_parallel.py has the layout and the failure rules). It holds no tokenizer, scheduler or
sampler: only a `ModelRunner` over its shard, meeting the other ranks in each layer's all-reduces."""

from __future__ import annotations

import multiprocessing.connection as mpc
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from modeldeploy.kernels import quant
from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.heap import freeze_after_load
from modeldeploy.runtime.engine.parallel import messages as tpm
from modeldeploy.runtime.engine.parallel.collective import Collective
from modeldeploy.runtime.engine.worker.model_runner import ModelRunner
from modeldeploy.runtime.loader import load_shard, resolve_device
from modeldeploy.runtime.models.shard import Shard


def worker_main(config: EngineConfig, rank: int, store_port: int, conn: mpc.Connection, parent: int) -> None:
    """A worker rank: join the group, load its shard, report, then run every plan rank 0 sends."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 0 drains first, then stops us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_orphan_watchdog, args=(parent,), daemon=True).start()
    if config.device != "cuda" and not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
    tpm.send(conn, tpm.Hello(os.getpid()))
    try:
        runner = _worker_setup(config, rank, store_port, conn)
    except Exception as e:  # noqa: BLE001 - reported to rank 0, which names it in its load error
        tpm.send(conn, tpm.Failed(f"tensor-parallel rank {rank}: {e}"))
        sys.exit(1)
    if runner is None:  # rank 0 gave up before allocating (its own load failed): stop
        sys.exit(0)
    sys.exit(_worker_loop(runner, conn))


def _worker_setup(
    config: EngineConfig, rank: int, store_port: int, conn: mpc.Connection
) -> ModelRunner | None:
    """Join the group, load this rank's shard, report Ready, then allocate what Alloc says (None:
    rank 0 sent Stop instead)."""
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
    tpm.send(conn, tpm.Ready(rank, os.getpid(), free, held))
    msg = tpm.recv(conn)
    if isinstance(msg, tpm.Stop):
        return None
    alloc = tpm.expect(msg, tpm.Alloc, f"tensor-parallel rank {rank}")
    runner = ModelRunner(
        loaded, alloc.num_blocks, alloc.block_size, alloc.max_model_len, reduce=collective.all_reduce
    )
    loaded.weights.clear()
    return runner


def _worker_loop(runner: ModelRunner, conn: mpc.Connection) -> int:
    """Run each step rank 0 sends until Stop (exit code 0) or rank 0 is gone (1); any other message
    raises UnexpectedMessage, which ends this rank (rank 0's monitor then fails the engine)."""
    while True:
        try:
            msg = tpm.recv(conn)
        except (EOFError, OSError):
            return 1  # rank 0 is gone
        if isinstance(msg, tpm.Run):
            runner.execute(msg.plan)
        elif isinstance(msg, tpm.CopyBlocks):
            runner.copy_blocks(msg.pairs)
        elif isinstance(msg, tpm.Stop):
            return 0
        else:
            raise tpm.UnexpectedMessage("tensor-parallel worker", msg)


def _orphan_watchdog(parent: int) -> None:
    """No rank outlives the server: exit as soon as rank 0's process is gone."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(0.2)
