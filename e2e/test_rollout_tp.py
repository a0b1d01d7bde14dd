# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""A tensor-parallel ModelDeployment (gpusPerReplica 2, tensorParallel 2) on the process node:
the pod's args carry the TP size, the runtime really runs two ranks (gloo on CPU), and a bundle
change passes the conformance gate and is promoted under load."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT
from modeldeploy_dev.load import Load

from .conftest import E2ECluster
from .test_operator import Operator, crd_installed, operator  # noqa: F401  (fixtures)
from .test_process_node import alive, get
from .test_rollout import change_bundle, events, serve_tiny, wait_phase

TP = {"gpusPerReplica": 2, "tensorParallel": 2}


def test_tp2_pod_serves_passes_the_gate_and_rolls_out(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    md, old = serve_tiny(cluster, namespace, tmp_path, "tp", topology=TP)
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"modeldeploy.dev/bundle={old}").items
    assert len(pods) == 1
    serve = next(c for c in pods[0].spec.containers if c.name == "serve")
    args = serve.args or []
    assert args[args.index("--tensor-parallel-size") + 1] == "2", args
    assert serve.resources.limits["nvidia.com/gpu"] == "2"  # one GPU per rank
    status, body = get(f"http://{pods[0].status.pod_ip}:{PORT}/v1/bundle")
    assert status == 200, body
    parallel = json.loads(body)["parallel"]
    assert parallel["tensor_parallel_size"] == 2 and parallel["backend"] == "gloo", parallel
    (worker,) = parallel["worker_pids"]
    assert alive(worker)

    with Load(cluster.api, namespace, "tp") as load:
        change_bundle(cluster, namespace, "tp", lambda b: b["config"].update(maxNumSeqs=6))
        wait_phase(cluster, namespace, "tp", ("Canary",), 420)  # past the conformance gate
        done = wait_phase(cluster, namespace, "tp", ("Stable", "Degraded"), 300)
    st = done["status"]
    reasons = [r for r, _ in events(cluster, namespace, "tp")]
    assert st["phase"] == "Stable" and st["stable"]["bundle"] != old, (st, reasons)
    for r in ("NewBundle", "CanaryReady", "ConformancePassed", "Promoted"):
        assert r in reasons, reasons
    seen = load.by_ip()
    assert not {ip: c for ip, c in seen.items() if set(c) - {200}}, (seen, load.transport_errors)
    assert sum(sum(c.values()) for c in seen.values()) > 10
    new_pods = cluster.core.list_namespaced_pod(
        namespace, label_selector=f"modeldeploy.dev/bundle={st['stable']['bundle']}"
    ).items
    for p in new_pods:
        args = next(c for c in p.spec.containers if c.name == "serve").args
        assert args[args.index("--tensor-parallel-size") + 1] == "2", args


def test_a_dead_rank_in_the_canary_rolls_back_with_the_reason(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    """The canary's worker rank SIGKILLed mid-step: its runtime fails fast (exit 1), kubelet restarts
    it, and the operator rolls back naming the crash (or the runtime's own 'engine failed' error)."""
    md, old = serve_tiny(cluster, namespace, tmp_path, "tpfail", topology=TP)
    with Load(cluster.api, namespace, "tpfail"):
        change_bundle(cluster, namespace, "tpfail", lambda b: b["config"].update(maxNumSeqs=6))
        wait_phase(cluster, namespace, "tpfail", ("Canary",), 420)
        canary = next(
            p
            for p in cluster.core.list_namespaced_pod(
                namespace, label_selector="app.kubernetes.io/instance=tpfail"
            ).items
            if p.metadata.labels.get("modeldeploy.dev/bundle") != old and p.status.pod_ip
        )
        status, body = get(f"http://{canary.status.pod_ip}:{PORT}/v1/bundle")
        assert status == 200, body
        (worker,) = json.loads(body)["parallel"]["worker_pids"]
        os.kill(worker, signal.SIGKILL)
        done = wait_phase(cluster, namespace, "tpfail", ("Stable", "Degraded"), 300)
    st = done["status"]
    evs = events(cluster, namespace, "tpfail")
    assert st["stable"]["bundle"] == old, (st, evs)
    failed = [m for r, m in evs if r == "CanaryFailed"]
    assert failed, evs
    assert "tensor-parallel rank" in failed[0] or "exited with code 1" in failed[0], failed
