# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""Manual rollout controls and Argo CD health on live objects.

A step with `awaitPromotion` holds the canary for a human: Argo CD must call that Suspended.
`modeldeploy rollout promote` and `abort` run as the real CLI against the cluster. At each
point the chart's health Lua is evaluated on the object as the API server returns it; with
MODELDEPLOY_RECORD_STATUS=DIR those objects are also written out (tests/data/argocd/ holds
the ones recorded from this test, which the unit tests replay).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from modeldeploy_dev.argocd import checked
from modeldeploy_dev.load import Load

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    Operator,
    condition,
    crd_installed,
    get_md,
    operator,
)
from .test_rollout import (
    change_bundle,
    events,
    pod_ips,
    rolled_back,
    serve_tiny,
    stable_and_ready,
    stable_errors,
    wait_md,
    wait_phase,
)

AWAIT = {"steps": [{"weight": 50, "pauseSeconds": 3, "awaitPromotion": True}]}


def rollout_cli(cluster: E2ECluster, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "modeldeploy", "rollout", *args, "--kubeconfig", cluster.kubeconfig],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout


def test_await_promotion_is_suspended_then_manual_promote_and_abort(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    ns, name = namespace, "ctl"
    md, old = serve_tiny(cluster, ns, tmp_path, name, **AWAIT)
    checked(md, "Healthy", "healthy-stable")
    old_ips = pod_ips(cluster, ns, old)
    with Load(cluster.api, ns, name) as load:
        change_bundle(cluster, ns, name, lambda b: b["config"].update(maxNumSeqs=6))
        seen: dict[str, dict[str, Any]] = {}

        def held() -> dict[str, Any] | None:
            m = get_md(cluster, ns, name)
            seen.setdefault(m.get("status", {}).get("phase", ""), m)
            return m if condition(m, "Progressing").get("reason") == "AwaitingPromotion" else None

        waiting = cluster.wait(held, 240, "canary held with reason AwaitingPromotion")
        for phase in ("Deploying", "Verifying", "Canary"):
            if phase in seen and seen[phase]["status"].get("canary"):
                checked(seen[phase], "Progressing", f"progressing-{phase.lower()}")
        msg = checked(waiting, "Suspended", "suspended-awaiting-promotion")
        assert "modeldeploy rollout promote" in msg and "50%" in msg, msg
        assert (
            waiting["status"]["canaryWeight"] == 50 and waiting["status"]["lastAnalysis"]["verdict"] == "Pass"
        )
        shown = rollout_cli(cluster, "status", name, "-n", ns)
        assert "AwaitingPromotion" in shown and "Canary" in shown, shown

        new = waiting["status"]["canary"]["bundle"]
        out = rollout_cli(cluster, "promote", name, "-n", ns)
        assert "modeldeploy.dev/promote=" in out, out
        promoted = wait_md(
            cluster,
            ns,
            name,
            lambda m: stable_and_ready(m) and m["status"]["stable"]["bundle"] == new,
            120,
            "manual promote done",
        )
        checked(promoted, "Healthy", "healthy-after-promote")
        assert "modeldeploy.dev/promote" not in (promoted["metadata"].get("annotations") or {})
        new_ips = pod_ips(cluster, ns, new)

        change_bundle(cluster, ns, name, lambda b: b["config"].update(maxNumSeqs=5))
        canary = wait_phase(cluster, ns, name, ("Canary",), 240)["status"]["canary"]["bundle"]
        rollout_cli(cluster, "abort", name, "-n", ns)
        aborted = wait_md(cluster, ns, name, rolled_back, 120, "abort rolled back")
    st = aborted["status"]
    assert st["stable"]["bundle"] == new and st["failedBundles"] == [canary], st
    assert condition(aborted, "Degraded")["reason"] == "Aborted"
    msg = checked(aborted, "Degraded", "degraded-aborted")
    assert "abort" in msg, msg
    reasons = [r for r, _ in events(cluster, ns, name)]
    for r in ("AwaitingPromotion", "ManualPromote", "Aborted"):
        assert reasons.count(r) == 1, (r, reasons)
    print(f"load during promote and abort: {load.by_ip()}")
    assert not stable_errors(load, old_ips | new_ips), (load.by_ip(), load.transport_errors)
