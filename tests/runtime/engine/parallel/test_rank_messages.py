"""The tensor-parallel rank channel (runtime/engine/parallel/messages.py): typed messages both ways,
and a message a side does not expect fails loudly, naming its type, instead of being skipped."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
from types import SimpleNamespace
from typing import Any

import pytest

from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy.runtime.engine.parallel import messages as tpm
from modeldeploy.runtime.engine.parallel.rank_worker import _worker_loop
from modeldeploy.runtime.engine.worker.model_runner import StepPlan

PLAN = StepPlan([1, 2], [0, 1], [0, 1], [], [], [[0]], [0, 2], [2], [1])


class Unknown:
    """A message type neither side knows."""


def _runner() -> Any:
    calls: list[tuple[str, object]] = []
    return SimpleNamespace(
        calls=calls,
        execute=lambda plan: calls.append(("execute", plan)),
        copy_blocks=lambda pairs: calls.append(("copy_blocks", pairs)),
    )


def _loop_over(*messages: object) -> tuple[Any, int]:
    """Run a worker's loop over `messages` (pickled as rank 0 sends them); the runner and exit code."""
    ours, theirs = mp.Pipe()
    for msg in messages:
        ours.send_bytes(pickle.dumps(msg))
    ours.close()
    runner = _runner()
    return runner, _worker_loop(runner, theirs)


def test_messages_survive_the_pipe_unchanged():
    for msg in (
        tpm.Hello(7),
        tpm.Ready(1, 7, None, 1024),
        tpm.Failed("tensor-parallel rank 1: boom"),
        tpm.Alloc(64, 16, 512),
        tpm.Run(PLAN),
        tpm.CopyBlocks([(3, 4)]),
        tpm.Stop(),
    ):
        assert pickle.loads(tpm.encode(msg)) == msg


def test_the_worker_runs_each_step_until_stop():
    runner, code = _loop_over(tpm.Run(PLAN), tpm.CopyBlocks([(3, 4)]), tpm.Stop(), tpm.Run(PLAN))
    assert code == 0
    assert runner.calls == [("execute", PLAN), ("copy_blocks", [(3, 4)])]  # nothing after Stop


def test_the_worker_exits_when_rank_0_is_gone():
    runner, code = _loop_over(tpm.Run(PLAN))
    assert code == 1 and runner.calls == [("execute", PLAN)]


@pytest.mark.parametrize(
    "msg, named",
    [
        (Unknown(), "test_rank_messages.Unknown"),
        (("run", PLAN), "builtins.tuple"),  # the old string-tagged form is refused too
        (tpm.Alloc(64, 16, 512), "messages.Alloc"),  # known, but out of order once running
    ],
)
def test_an_unexpected_message_fails_the_worker_by_name(msg, named):
    with pytest.raises(tpm.UnexpectedMessage, match=f"tensor-parallel worker: unexpected message .*{named}"):
        _loop_over(tpm.Run(PLAN), msg, tpm.Stop())


def test_rank_0_names_what_it_did_not_expect():
    assert tpm.expect(tpm.Ready(1, 7, None, 8), tpm.Ready, "rank 1") == tpm.Ready(1, 7, None, 8)
    with pytest.raises(ValueError, match="^tensor-parallel rank 1: boom$"):
        tpm.expect(tpm.Failed("tensor-parallel rank 1: boom"), tpm.Ready, "rank 1")
    with pytest.raises(tpm.UnexpectedMessage, match=r"^rank 1: unexpected message .*messages\.Hello$"):
        tpm.expect(tpm.Hello(7), tpm.Ready, "rank 1")
    with pytest.raises(tpm.UnexpectedMessage, match=r"unexpected message builtins\.tuple"):
        tpm.expect(("ready", {"rank": 1}), tpm.Ready, "rank 1")


@pytest.mark.slow
def test_an_unknown_message_ends_the_rank_and_fails_the_engine(llama_dir):
    """End to end at TP=2: the worker raises, exits non-zero, and rank 0's monitor reports it."""
    llm = LLM(llama_dir, dtype="float32", tensor_parallel_size=2)
    tp = llm.engine.tp
    assert tp is not None
    failures: list[str] = []
    tp.set_on_failure(failures.append)
    tp.send(Unknown())  # pyright: ignore[reportArgumentType]  # deliberately not a ToWorker
    deadline = time.monotonic() + 30
    while not failures and time.monotonic() < deadline:
        time.sleep(0.05)
    assert failures and "tensor-parallel rank 1" in failures[0] and "exited with code 1" in failures[0]
    with pytest.raises(RuntimeError, match="tensor-parallel rank 1"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0.0))
    tp.stop()
