"""All-reduce over one pod's tensor-parallel ranks, on a process group of our own (tensor_parallel.py)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


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
