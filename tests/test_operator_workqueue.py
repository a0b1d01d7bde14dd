"""WorkQueue: asks during a running pass fold into one more pass, and each ask is counted by its source."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY

from modeldeploy.operator.workqueue import WorkQueue

METRIC = "modeldeploy_operator_reconcile_requests_total"


def _count(source: str, outcome: str) -> float:
    return REGISTRY.get_sample_value(METRIC, {"source": source, "outcome": outcome}) or 0.0


def test_asks_while_running_fold_into_one_more_pass_and_are_counted_by_source() -> None:
    started, release, passes = threading.Event(), threading.Event(), []

    def work(key: str) -> None:
        passes.append(key)
        if len(passes) == 1:
            started.set()
            assert release.wait(10)

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
