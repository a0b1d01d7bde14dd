# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""Rollout on the local cluster with real runtime processes.

Each scenario serves the tiny model through a ModelDeployment on the process node, keeps a
bounded closed-loop load running against the endpoints of the `<name>` Service (read from
its real EndpointSlices and spread round-robin, as kube-proxy would), changes the bundle,
and checks what the operator decided, with the figures it wrote to status and Events.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from modeldeploy_dev.load import Load
from modeldeploy_dev.rollout_scenario import (  # noqa: F401 (re-exported)
    ANALYSIS,
    change_bundle,
    events,
    stable_and_ready,
    tiny_model_pv,
    tiny_spec,
    wait_md,
)

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    G,
    Operator,
    P,
    V,
    condition,
    crd_installed,
    create,
    get_md,
    manifest,
    operator,
)
from .watch import Watch


def pod_ips(cluster: E2ECluster, ns: str, bundle: str) -> set[str]:
    pods = cluster.core.list_namespaced_pod(ns, label_selector=f"modeldeploy.dev/bundle={bundle}").items
    return {p.status.pod_ip for p in pods if p.status.pod_ip}


def serve_tiny(
    cluster: E2ECluster,
    ns: str,
    tmp: Path,
    name: str,
    adapters: list[dict[str, str]] | None = None,
    topology: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    **rollout: Any,
) -> tuple[dict[str, Any], str]:
    """A ModelDeployment on the tiny model (and `adapters`, if any; `topology` and serving `config`
    fields over the defaults), Ready and Stable; returns (object, stable bundle id)."""
    if cluster.process_node is None:
        pytest.skip("external $KUBECONFIG cluster: no process node")
    obj = tiny_spec(name, tiny_model_pv(cluster, ns, tmp), config, topology, **rollout)
    if adapters:
        obj["spec"]["bundle"]["adapters"] = adapters
    create(cluster, ns, obj)
    md = wait_md(cluster, ns, name, stable_and_ready, 240, f"{name} Stable and Ready")
    return md, md["status"]["stable"]["bundle"]


def wait_phase(
    cluster: E2ECluster, ns: str, name: str, phases: tuple[str, ...], timeout: float
) -> dict[str, Any]:
    return wait_md(
        cluster,
        ns,
        name,
        lambda m: m.get("status", {}).get("phase") in phases,
        timeout,
        f"{name} phase in {phases}",
    )


def rolled_back(m: dict[str, Any]) -> bool:
    """Stable again with a bundle recorded as failed."""
    return bool(m.get("status", {}).get("failedBundles")) and m["status"].get("phase") == "Stable"


def stable_errors(load: Load, stable_ips: set[str]) -> dict[str, Counter]:
    return {ip: c for ip, c in load.by_ip().items() if ip in stable_ips and set(c) - {200}}


def test_good_bundle_promoted_across_an_operator_kill_then_rollback_to(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    md, old = serve_tiny(cluster, namespace, tmp_path, "chat")
    old_ips = pod_ips(cluster, namespace, old)
    with Load(cluster.api, namespace, "chat") as load, Watch(cluster.api, namespace, "chat") as watch:
        t0 = time.monotonic()
        change_bundle(cluster, namespace, "chat", lambda b: b["config"].update(maxNumSeqs=6))
        wait_phase(cluster, namespace, "chat", ("Canary",), 240)
        killed = time.monotonic()
        operator.kill(signal.SIGKILL)  # killed mid-step: state is in status
        operator.start()
        done = wait_phase(cluster, namespace, "chat", ("Stable", "Degraded"), 300)
        # the same figure e2e/test_real_node.py prints for containers (bench/results/real_node.md)
        print(
            f"[timing] good bundle change -> promoted, operator killed {killed - t0:.1f}s in: "
            f"{time.monotonic() - t0:.1f}s (process node)"
        )
        st = done["status"]
        assert st["phase"] == "Stable" and st["stable"]["bundle"] != old, (
            st,
            events(cluster, namespace, "chat"),
        )
        new = st["stable"]["bundle"]
        assert st["history"][-1]["bundle"] == old and st["rollout"]["previous"] == old
        assert st["lastAnalysis"]["verdict"] == "Pass" and st["lastAnalysis"]["metrics"][0]["samples"] >= 8
        reasons = [r for r, _ in events(cluster, namespace, "chat")]
        for r in ("NewBundle", "CanaryReady", "ConformancePassed", "Promoted"):
            assert r in reasons, reasons
        warm = cluster.apps.list_namespaced_deployment(
            namespace, label_selector=f"modeldeploy.dev/bundle={old}"
        ).items
        assert len(warm) == 1 and warm[0].spec.replicas == 1  # prior bundle kept warm
        # rollback-to the warm prior bundle: all traffic back without a cold start
        t0 = time.monotonic()
        cluster.custom.patch_namespaced_custom_object(
            G, V, namespace, P, "chat", {"metadata": {"annotations": {"modeldeploy.dev/rollback-to": old}}}
        )
        back = cluster.wait(
            lambda: (lambda m: m if m["status"]["stable"]["bundle"] == old else None)(
                get_md(cluster, namespace, "chat")
            ),
            60,
            "rollback-to applied",
        )
        svc = cluster.wait(
            lambda: (
                cluster.core.read_namespaced_service("chat", namespace).spec.selector.get(
                    "modeldeploy.dev/bundle"
                )
                == old
            ),
            30,
            "chat Service on the prior bundle",
        )
        all_old = cluster.wait(
            lambda: next((t for t, eps in watch.endpoints if t >= t0 and eps and eps <= old_ips), None),
            30,
            "all ready endpoints on the prior bundle",
        )
        print(
            f"rollback-to: status after {time.monotonic() - t0:.1f}s; all endpoints on the prior bundle "
            f"{all_old - t0:.2f}s after the annotation (0.1 s polling)"
        )
        assert svc and new in back["status"]["failedBundles"]
        assert "modeldeploy.dev/rollback-to" not in (
            get_md(cluster, namespace, "chat")["metadata"].get("annotations") or {}
        )
    seen = load.by_ip()
    print(f"load during promotion and rollback-to, by pod ip (old {old_ips}): {seen}")
    assert not {ip: c for ip, c in seen.items() if set(c) - {200}}, (
        seen,
        load.transport_errors,
    )  # no cohort lost one
    assert sum(sum(c.values()) for c in seen.values()) > 20


def test_slow_bundle_fails_analysis_and_rolls_back(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    md, old = serve_tiny(
        cluster, namespace, tmp_path, "slow", analysis=ANALYSIS | {"maxTtftP95Ratio": 1.5, "minSamples": 10}
    )
    old_ips = pod_ips(cluster, namespace, old)
    with (
        Load(cluster.api, namespace, "slow", workers=8) as load,
        Watch(cluster.api, namespace, "slow") as watch,
    ):
        t0 = time.monotonic()
        change_bundle(cluster, namespace, "slow", lambda b: b["config"].update(maxNumSeqs=1))
        try:
            done = cluster.wait(
                lambda: (lambda m: m if m["status"].get("failedBundles") else None)(
                    get_md(cluster, namespace, "slow")
                ),
                300,
                "slow bundle rolled back",
            )
        except AssertionError:
            print("status:", get_md(cluster, namespace, "slow")["status"], "\nload:", load.by_ip())
            raise
        print(
            f"[timing] slow bundle change -> rolled back by analysis: {time.monotonic() - t0:.1f}s "
            "(process node)"
        )
        failed_at = cluster.wait(lambda: watch.seen.get("AnalysisFailed"), 10, "AnalysisFailed Event seen")
        out_at = cluster.wait(
            lambda: next(
                (t for t, eps in watch.endpoints if t >= failed_at and eps and eps <= old_ips), None
            ),
            30,
            "canary out of the Service's ready endpoints",
        )
    st = done["status"]
    assert st["stable"]["bundle"] == old and st["phase"] == "Stable", st
    deg = condition(done, "Degraded")
    assert deg["status"] == "True" and deg["reason"] == "AnalysisFailed", deg
    ttft = next(m for m in st["lastAnalysis"]["metrics"] if m["metric"] == "ttft_p95_seconds")
    assert ttft["verdict"] == "Fail" and ttft["canary"] > ttft["threshold"], ttft
    assert any(
        r == "AnalysisFailed" and "ttft_p95_seconds" in m for r, m in events(cluster, namespace, "slow")
    )
    print(
        f"slow: AnalysisFailed Event seen -> canary out of the ready endpoints of the Service "
        f"{out_at - failed_at:+.2f}s (0.1 s polling)"
    )
    print(
        f"load during the failed canary, by pod ip (old {old_ips}): {load.by_ip()}; "
        f"analysis {st['lastAnalysis']}"
    )
    assert not stable_errors(load, old_ips), (load.by_ip(), load.transport_errors)
    canary = st["failedBundles"][0]
    cluster.wait(
        lambda: (
            not cluster.apps.list_namespaced_deployment(
                namespace, label_selector=f"modeldeploy.dev/bundle={canary}"
            ).items
        ),
        60,
        "canary Deployment removed",
    )


def test_broken_digest_never_ready_rolls_back_with_reason(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    md, old = serve_tiny(cluster, namespace, tmp_path, "bad")
    change_bundle(cluster, namespace, "bad", lambda b: b["model"].update(digest="sha256:" + "0" * 64))
    done = cluster.wait(
        lambda: (lambda m: m if m["status"].get("failedBundles") else None)(
            get_md(cluster, namespace, "bad")
        ),
        240,
        "broken bundle rolled back",
    )
    deg = condition(done, "Degraded")
    assert done["status"]["stable"]["bundle"] == old and deg["status"] == "True"
    assert deg["reason"] in ("CanaryFailed", "LoadTimeout") and "digest" in deg["message"].lower(), deg
    assert condition(done, "Ready")["status"] == "True"  # the stable bundle kept serving
