"""The tensor-parallel rank channel's messages: what crosses the pipe between rank 0 (`TensorParallel`)
and each worker rank (`rank_worker.py`).

Each message is a frozen dataclass, pickled whole. Both ends check the type of what they receive
against what they expect at that point, so a message the other side does not know, or one out of
order, fails loudly (`UnexpectedMessage`, naming its type) instead of being skipped.

Worker -> rank 0: Hello (spawned), then Ready (its shard loaded) or Failed (it could not load).
Rank 0 -> worker: Alloc (once: the KV cache's size), then Run and CopyBlocks (each step), Stop.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TypeVar

from modeldeploy.runtime.engine.worker.model_runner import StepPlan


# --- worker -> rank 0 ----------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    pid: int


@dataclass(frozen=True)
class Ready:
    """A worker's load report: what the KV cache budget and /v1/bundle need from each rank."""

    rank: int
    pid: int
    free_bytes: int | None  # free device memory once the shard is loaded (cuda), else None
    weight_bytes: int  # the shard's resident weight bytes


@dataclass(frozen=True)
class Failed:
    message: str  # names the rank and its error; rank 0 raises it as its own load error


# --- rank 0 -> worker ----------------------------------------------------------------------
@dataclass(frozen=True)
class Alloc:
    num_blocks: int
    block_size: int
    max_model_len: int


@dataclass(frozen=True)
class Run:
    plan: StepPlan  # the step's flat batch: every rank runs it on its own shard


@dataclass(frozen=True)
class CopyBlocks:
    pairs: list[tuple[int, int]]  # (src, dst) KV blocks, copy-on-fork


@dataclass(frozen=True)
class Stop:
    pass


ToRank0 = Hello | Ready | Failed
ToWorker = Alloc | Run | CopyBlocks | Stop
Message = ToRank0 | ToWorker

M = TypeVar("M")


class UnexpectedMessage(RuntimeError):
    """A message that has no place where it arrived: an unknown type, or a known one out of order."""

    def __init__(self, where: str, msg: object) -> None:
        super().__init__(f"{where}: unexpected message {type(msg).__module__}.{type(msg).__qualname__}")
        self.message = msg


def expect(msg: object, want: type[M], where: str) -> M:
    """`msg` when it is a `want`; ValueError with a worker's own error for Failed; else UnexpectedMessage."""
    if isinstance(msg, want):
        return msg
    if isinstance(msg, Failed):
        raise ValueError(msg.message)
    raise UnexpectedMessage(where, msg)


def send(conn: Connection, msg: Message) -> None:
    conn.send_bytes(encode(msg))


def encode(msg: Message) -> bytes:
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def recv(conn: Connection) -> object:
    """The next message, of whatever type arrived: the receiver checks it (`expect`, or its dispatch)."""
    return pickle.loads(conn.recv_bytes())
