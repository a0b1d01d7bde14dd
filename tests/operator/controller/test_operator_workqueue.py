"""WorkQueue: asks during a running pass fold into one more pass, each ask is counted by its source, and
added keys are served by the queue's own workers (folded while waiting, retried after a failure)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import REGISTRY

from modeldeploy.operator.controller import workqueue
from modeldeploy.operator.controller.workqueue import WorkQueue

METRIC = "modeldeploy_operator_reconcile_requests_total"


def _count(source: str, outcome: str) -> float:
    return REGISTRY.get_sample_value(METRIC, {"source": source, "outcome": outcome}) or 0.0


class FirstPassBlocks:
    """A work function that records every pass and holds the first one until `release` is set, so a
    test can ask for keys while a pass is running; `then` runs as the held pass ends."""

    def __init__(self, then: Callable[[], None] = lambda: None) -> None:
        self.started, self.release, self.passes, self.then = threading.Event(), threading.Event(), [], then

    def __call__(self, key: str) -> None:
        self.passes.append(key)
        if len(self.passes) == 1:
            self.started.set()
            assert self.release.wait(10)
            self.then()


def test_asks_while_running_fold_into_one_more_pass_and_are_counted_by_source() -> None:
    work = FirstPassBlocks()
    started, release, passes = work.started, work.release, work.passes
    q = WorkQueue(work, tick_s=3600.0)
    before = {(s, o): _count(s, o) for s in ("modeldeployment", "child") for o in ("run", "coalesced")}
    first = threading.Thread(target=q.request, args=("k", "modeldeployment"))
    first.start()
    assert started.wait(10)
    for _ in range(3):  # three child events while the first pass runs
        q.request("k", "child")
    release.set()
    first.join(10)
    assert passes == ["k", "k"]  # the three asks became one more pass, not three
    assert _count("modeldeployment", "run") - before[("modeldeployment", "run")] == 1
    assert _count("child", "coalesced") - before[("child", "coalesced")] == 3
    assert _count("child", "run") - before[("child", "run")] == 0
    assert not q.holds("k")


def _settle(q: WorkQueue, *keys: str) -> None:
    deadline = time.monotonic() + 10
    while any(q.holds(k) for k in keys) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_added_keys_are_served_by_the_workers_and_a_waiting_key_folds_further_asks() -> None:
    work = FirstPassBlocks()  # "a", the first key added
    started, release, passes = work.started, work.release, work.passes
    q = WorkQueue(work, tick_s=3600.0, workers=1)
    before = _count("child", "coalesced")
    q.add("a", "modeldeployment")  # returns at once: the one worker runs it
    assert started.wait(10)
    for _ in range(3):  # "b" waits behind "a": the later asks fold into the first
        q.add("b", "child")
    assert q.holds("b") and passes == ["a"]
    release.set()
    _settle(q, "a", "b")
    assert passes == ["a", "b"]
    assert _count("child", "coalesced") - before == 2
    assert not q.holds("a") and not q.holds("b")


def test_a_pass_that_raises_is_counted_and_asked_for_again(monkeypatch) -> None:
    monkeypatch.setattr(workqueue, "RETRY_S", 0.05)
    passes: list[str] = []

    def work(key: str) -> None:
        passes.append(key)
        if len(passes) == 1:
            raise RuntimeError("API server went away")

    errors = "modeldeploy_operator_reconcile_errors_total"
    before = REGISTRY.get_sample_value(errors, {"error": "RuntimeError"}) or 0.0
    q = WorkQueue(work, tick_s=3600.0, workers=2)
    q.add("k", "modeldeployment")
    deadline = time.monotonic() + 10
    while len(passes) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert passes == ["k", "k"]  # the worker survived and the key came back
    assert REGISTRY.get_sample_value(errors, {"error": "RuntimeError"}) - before == 1
    assert _count("retry", "run") >= 1


def test_forget_drops_a_waiting_ask() -> None:
    release, passes = threading.Event(), []

    def work(key: str) -> None:
        passes.append(key)
        assert release.wait(10)

    q = WorkQueue(work, tick_s=3600.0, workers=1)
    q.add("busy")
    q.add("gone")
    q.forget("gone")  # deleted while it waited: never reconciled
    assert not q.holds("gone")
    q.add("kept")
    release.set()
    _settle(q, "busy", "kept")
    assert passes == ["busy", "kept"]


def test_an_ask_during_a_pass_is_checked_again_when_it_ends_and_an_echo_runs_nothing() -> None:
    """The echo of a pass's own status write can arrive before the pass records the write: asked
    during the pass, it is checked once the pass ends, and only real news runs another pass."""
    recorded: set[str] = set()
    # the pass records its status write after its echo was asked
    work = FirstPassBlocks(then=lambda: recorded.add("rv-2"))
    started, release, passes = work.started, work.release, work.passes
    q = WorkQueue(work, tick_s=3600.0)
    before = _count("modeldeployment", "echo")
    first = threading.Thread(target=q.request, args=("k", "modeldeployment"))
    first.start()
    assert started.wait(10)
    q.request("k", "modeldeployment", lambda: "rv-2" not in recorded)  # news at the time it came
    release.set()
    first.join(10)
    assert passes == ["k"]  # found to be the echo once the pass ended: no second pass
    q.request("k", "modeldeployment", lambda: "rv-2" not in recorded)  # the same echo, later
    assert passes == ["k"] and _count("modeldeployment", "echo") - before == 1
    q.request("k", "modeldeployment", lambda: "rv-3" not in recorded)  # someone else's write
    assert passes == ["k", "k"] and not q.holds("k")


def test_asks_folded_while_waiting_are_news_if_any_of_them_is() -> None:
    work = FirstPassBlocks()  # "busy", the first key added
    started, release, passes = work.started, work.release, work.passes
    q = WorkQueue(work, tick_s=3600.0, workers=1)
    echo = {"yes"}
    q.add("busy")
    assert started.wait(10)
    q.add("echoed", "modeldeployment", lambda: not echo)  # an echo once the worker takes it
    q.add("mixed", "modeldeployment", lambda: not echo)
    q.add("mixed", "child")  # a child change folded in: no check, always news
    release.set()
    _settle(q, "busy", "echoed", "mixed")
    assert passes == ["busy", "mixed"]
