"""The engine core's wire messages: what crosses the pipe between `EngineCoreClient` and `EngineCore`.

Each message is a NamedTuple (pickled as its class reference plus its fields: as cheap as a plain
tuple, and the decode loop sends one `Step` per engine step) whose `kind` names it. Both ends
dispatch on `kind` through a table, so a message the other side does not know fails loudly.

Client -> core: Add, Abort, Compile, Stop.
Core -> client: Progress, Ready, LoadFailed (while loading), then Step, Error, CompileDone, Fatal.
Timestamps are `time.monotonic()`: one clock for every process of the machine on Linux.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.output import EngineStats
from modeldeploy.runtime.engine.sampling_params import SamplingParams, Structured


class MessageKind(enum.Enum):
    ADD = "add"
    ABORT = "abort"
    COMPILE = "compile"
    STOP = "stop"
    PROGRESS = "progress"
    READY = "ready"
    LOAD_FAILED = "load_failed"
    STEP = "step"
    ERROR = "error"
    COMPILE_DONE = "compile_done"
    FATAL = "fatal"


# --- client -> core ----------------------------------------------------------------------
class Add(NamedTuple):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # its grammar uncompiled: the core compiles (or finds it in its cache)
    adapter: str | None
    kind = MessageKind.ADD


class Abort(NamedTuple):
    request_id: str
    requested_at: float  # monotonic; the core reports how long the blocks took to be freed
    kind = MessageKind.ABORT


class Compile(NamedTuple):
    token: int  # matches the CompileDone
    spec: Structured
    kind = MessageKind.COMPILE


class Stop(NamedTuple):
    kind = MessageKind.STOP


# --- core -> client ----------------------------------------------------------------------
class Progress(NamedTuple):
    phase: str
    fraction: float
    kind = MessageKind.PROGRESS


class Ready(NamedTuple):
    config: EngineConfig  # the effective configuration, every 'auto' resolved
    info: dict[str, Any]
    stats: EngineStats
    kind = MessageKind.READY


class LoadFailed(NamedTuple):
    error: BaseException
    kind = MessageKind.LOAD_FAILED


class Delta(NamedTuple):
    """One output, as what changed since the previous one of the same choice. The client rebuilds the
    cumulative fields: text = previous text[:text_keep] + text_add (a stop string can shorten it)."""

    request_id: str
    index: int
    new_token_ids: list[int]
    text_keep: int
    text_add: str
    delta_text: str
    finished: bool
    finish_reason: str | None
    metrics: tuple  # RequestMetrics' fields, in order
    num_preemptions: int
    new_logprobs: list
    prompt_logprobs: list | None = None  # sent once, with the choice's first delta; the client keeps it


class Step(NamedTuple):
    """One engine step's outputs, the seconds each abort took to free its blocks, and the stats."""

    deltas: list[Delta]
    abort_releases: list[float]
    stats: EngineStats
    kind = MessageKind.STEP


class Error(NamedTuple):
    """A request the core refused when it was added (its own validation): the request's error."""

    request_id: str
    error: BaseException
    kind = MessageKind.ERROR


class CompileDone(NamedTuple):
    token: int
    seconds: float
    cached: bool
    error: BaseException | None
    kind = MessageKind.COMPILE_DONE


class Fatal(NamedTuple):
    message: str
    kind = MessageKind.FATAL


Message = Add | Abort | Compile | Stop | Progress | Ready | LoadFailed | Step | Error | CompileDone | Fatal
