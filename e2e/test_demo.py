# ruff: noqa: F811  (the crd_installed fixture imported from test_operator is a parameter here)
"""`make demo`'s story, run as is against the e2e session's cluster.

The same `modeldeploy.demo.run_story` the command runs: the operator as a subprocess, the tiny
model on the process node, a good bundle promoted and a slow one rolled back under load. The
command adds only its own cluster, the CRD, the namespace and the live table around it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modeldeploy_dev import demo

from .conftest import E2ECluster
from .test_operator import crd_installed  # noqa: F401  (fixture)


def test_demo_story_promotes_the_good_bundle_and_rolls_back_the_slow_one(
    cluster: E2ECluster, namespace: str, crd_installed: None, tmp_path: Path
) -> None:
    if cluster.process_node is None:
        pytest.skip("external $KUBECONFIG cluster: no process node")
    lines: list[str] = []
    seen: list[object] = [None]

    def show(s: demo.Snapshot) -> None:
        if (key := (s.status.get("phase"), s.stage)) != seen[0]:
            seen[0] = key
            lines.append(demo.phase_line(s))
            print(lines[-1])

    try:
        out = demo.run_story(cluster.kubeconfig, namespace, tmp_path, show, deadline_s=600)
    finally:
        demo.remove_volume(cluster.api, namespace)  # cluster-scoped; goes once the namespace's claim is gone
    print("\n".join(demo.summary(out)))
    if not out.ok:
        print(demo.diagnostics(cluster.api, namespace, tmp_path))
    assert out.ok, out.failure
    assert out.promoted and out.rollback_reason == "AnalysisFailed", out
    assert "ttft_p95_seconds" in out.rollback_message, out.rollback_message
    assert len(set(out.bundles.values())) == 3, out.bundles
    by = {c.label: c for c in out.cohorts}
    assert set(by) == {"base", "good", "slow"}, out.cohorts  # every request hit a known bundle
    # base was stable during the good rollout, good during the slow one: no failed request on either
    assert by["base"].errors == 0 and by["good"].errors == 0, out.cohorts
    assert by["base"].ok > 20 and by["good"].ok > 20 and by["slow"].ok > 0, out.cohorts
    assert out.base_during_slow == 0, out  # the prior bundle retired, not serving next to a canary
    phases = [ln.split()[2] for ln in lines]
    for phase in ("Deploying", "Verifying", "Canary", "Stable"):
        assert phase in phases, lines
