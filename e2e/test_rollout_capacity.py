# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""Rollouts on a full GPU cluster, on kwok GPU nodes with exact GPU counts.

Each test makes a node pool of its own: kwok nodes with exactly 8 allocatable nvidia.com/gpu,
labelled and tainted for the test's namespace alone, so the fit check and the scheduler see
exactly those GPUs whatever else the session runs. A ModelDeployment of 16 replicas x 1 GPU
fills 2 such nodes. kwok pods serve nothing, so canary analysis reads its figures from a
Prometheus HTTP API stand-in (modeldeploy_dev.fake_prometheus: a good bundle answers like stable, a slow one
with a slow TTFT) through the operator's real Prometheus source; the capacity decisions, Replace
batches, promotion and rollback are the operator's, on a real API server and scheduler.

Ready replicas are counted from the pods themselves (Ready, not terminating) every 0.1 s. Shown:
Auto picks Replace on a full pool (Surge on a roomy one) and says so in the NewBundle Event and
status; Replace never goes below minAvailable, promotes, and a slow bundle's rollback gives all
16 back to stable; a minAvailable that cannot be kept waits with InsufficientCapacity; keepPrior
warm within its GPU budget, cold without spare GPUs; `kubectl scale md` at a 25 % canary keeps
the ratio. The chart's Argo CD health is checked on the live objects of each new state
(MODELDEPLOY_RECORD_STATUS=tests/data/argocd records them as *-kwok.json).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL
from modeldeploy_dev.argocd import checked
from modeldeploy_dev.fake_prometheus import FakePrometheus
from modeldeploy_dev.rollout_scenario import (
    MIN_AVAILABLE,
    REPLICAS,
    ReadyWatch,
    change,
    gpu_pool,
    pool_spec,
    ready_by_bundle,
    serve,
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
from .test_rollout import events


def settled(cluster: E2ECluster, ns: str, name: str, timeout: float, what: str, pred) -> dict[str, Any]:
    return cluster.wait(
        lambda: (lambda m: m if pred(m["status"]) else None)(get_md(cluster, ns, name)), timeout, what
    )


def new_bundle_message(cluster: E2ECluster, ns: str, name: str) -> str:
    return cluster.wait(
        lambda: next((m for r, m in events(cluster, ns, name) if r == "NewBundle"), None),
        30,
        "NewBundle Event",
    )


def test_full_cluster_replace_keeps_min_available_promotes_then_slow_bundle_rolls_back_to_full_capacity(
    cluster: E2ECluster, namespace: str, operator: Operator
) -> None:
    ns, name = namespace, "full"
    with gpu_pool(cluster, ns, 2) as pool, FakePrometheus() as prom:
        old = serve(cluster, ns, name, pool_spec(name, pool, prom))
        with ReadyWatch(cluster, ns, name) as watch:
            t0 = time.monotonic()
            new = change(cluster, ns, name, max_num_seqs=2)
            md = settled(
                cluster,
                ns,
                name,
                180,
                "promoted",
                lambda s: s["phase"] == "Stable" and s["stable"]["bundle"] == new and not s.get("canary"),
            )
            took = time.monotonic() - t0
        st = md["status"]
        msg = new_bundle_message(cluster, ns, name)
        print(
            f"[timing] full cluster, Replace: bundle change -> promoted {took:.1f}s; min Ready "
            f"{watch.minimum} of {REPLICAS} over {len(watch.samples)} polls (0.1 s); NewBundle: {msg}"
        )
        assert "capacity Replace (Auto: 16 more replicas" in msg and "0 of 16 GPUs spare" in msg, msg
        assert st["rollout"]["capacity"] == "Replace" and st["rollout"]["capacityReason"].startswith("Auto: ")
        assert any(c[old] and c[new] for c in watch.samples), watch.samples  # it watched the rollout itself
        assert watch.minimum >= MIN_AVAILABLE, watch.samples
        reasons = [r for r, _ in events(cluster, ns, name)]
        assert "Promoted" in reasons and "AnalysisPassed" in reasons, reasons
        # the stable gave its GPUs up in batches no larger than the 4 replicas above minAvailable
        sizes = sorted(
            {
                int(m.rsplit(" ", 1)[1])
                for r, m in events(cluster, ns, name)
                if r == "Scaled" and f"(bundle {old})" in m
            },
            reverse=True,
        )
        assert sizes and all(
            a - b <= REPLICAS - MIN_AVAILABLE for a, b in zip([REPLICAS, *sizes], sizes, strict=False)
        ), sizes
        checked(md, "Healthy", "healthy-replace-promoted-prior-cold-kwok")
        # no spare GPU for a warm prior: scaled to zero, a cold rollback target, and status says why
        assert st["history"][-1]["bundle"] == old and st["rollout"]["prior"] == "Cold", st["rollout"]
        assert "GPUs not spare" in st["rollout"]["priorReason"], st["rollout"]
        cluster.wait(
            lambda: ready_by_bundle(cluster, ns, name) == Counter({new: REPLICAS}), 60, "16 Ready on new"
        )

        # a slow bundle: analysis fails at the first step, the canary's GPUs go back to stable
        with ReadyWatch(cluster, ns, name) as back:
            t0 = time.monotonic()
            slow = change(cluster, ns, name, max_num_seqs=1, slow=prom.slow)
            md = settled(
                cluster,
                ns,
                name,
                180,
                "slow bundle rolled back",
                lambda s: slow in s.get("failedBundles", []),
            )
            decided = time.monotonic()
            cluster.wait(
                lambda: ready_by_bundle(cluster, ns, name) == Counter({new: REPLICAS}),
                120,
                "16 Ready on the stable bundle, none of the canary",
            )
            full = time.monotonic()
        st = md["status"]
        print(
            f"[timing] full cluster, Replace: slow bundle change -> rolled back {decided - t0:.1f}s; "
            f"rollback decision -> {REPLICAS} Ready on stable {full - decided:.1f}s; min Ready {back.minimum}"
        )
        assert st["stable"]["bundle"] == new and st["phase"] == "Stable", st
        assert condition(md, "Degraded")["reason"] == "AnalysisFailed", condition(md, "Degraded")
        checked(md, "Degraded", "degraded-replace-analysis-failed-kwok")
        assert st["rollout"]["capacity"] == "Replace" and st["rollout"]["restore"] == "CanaryFirst", st[
            "rollout"
        ]
        assert back.minimum >= MIN_AVAILABLE, back.samples
        rolled = [m for r, m in events(cluster, ns, name) if r == "RolledBack"]
        assert rolled and slow in rolled[-1] and "capacity gap" in rolled[-1], rolled
        deps = cluster.apps.list_namespaced_deployment(ns).items
        assert {d.metadata.labels[BUNDLE_LABEL]: d.spec.replicas for d in deps} == {new: REPLICAS}, deps
        args = deps[0].spec.template.spec.containers[0].args
        assert args[args.index("--queue-budget") + 1] == "1", args  # the analysis TTFT SLO (default 1 s)


def test_spare_gpus_surge(cluster: E2ECluster, namespace: str, operator: Operator) -> None:
    ns, name = namespace, "roomy"
    with gpu_pool(cluster, ns, 4) as pool, FakePrometheus() as prom:
        # keepPrior asks for 4 warm replicas but its GPU budget holds 2
        spec = pool_spec(name, pool, prom, keepPrior={"replicas": 4, "maxGPUs": 2, "seconds": 600})
        old = serve(cluster, ns, name, spec)
        with ReadyWatch(cluster, ns, name) as watch:
            t0 = time.monotonic()
            new = change(cluster, ns, name, max_num_seqs=2)
            md = settled(
                cluster,
                ns,
                name,
                180,
                "promoted",
                lambda s: s["phase"] == "Stable" and s["stable"]["bundle"] == new and not s.get("canary"),
            )
            took = time.monotonic() - t0
        msg = new_bundle_message(cluster, ns, name)
        print(
            f"[timing] spare GPUs, Surge: bundle change -> promoted {took:.1f}s; min Ready {watch.minimum}; "
            f"NewBundle: {msg}"
        )
        assert "capacity Surge (Auto: 16 more replicas" in msg and "16 of 32 GPUs spare" in msg, msg
        assert md["status"]["rollout"]["capacity"] == "Surge", md["status"]["rollout"]
        # Surge: the stable fleet stayed whole beside the canary until promotion
        assert all(c[old] == REPLICAS for c in watch.samples if c[new] < REPLICAS), watch.samples
        # spare GPUs and within its budget: the prior bundle stays warm, at the budget's 2 replicas
        rollout = md["status"]["rollout"]
        assert rollout["prior"] == "Warm" and "maxGPUs 2" in rollout["priorReason"], rollout
        checked(md, "Healthy", "healthy-surge-promoted-prior-warm-kwok")
        cluster.wait(
            lambda: ready_by_bundle(cluster, ns, name) == Counter({new: REPLICAS, old: 2}),
            60,
            "16 Ready on the new bundle, 2 warm on the prior",
        )


def test_scale_during_canary_at_25_percent_keeps_the_ratio(
    cluster: E2ECluster, namespace: str, operator: Operator
) -> None:
    ns, name = namespace, "scaled"
    with gpu_pool(cluster, ns, 2) as pool, FakePrometheus() as prom:
        spec = pool_spec(
            name, pool, prom, steps=[{"weight": 25, "pauseSeconds": 900}], progressDeadlineSeconds=1200
        )
        old = serve(cluster, ns, name, spec)
        new = change(cluster, ns, name, max_num_seqs=2)
        settled(cluster, ns, name, 120, "canary at 25 %", lambda s: s["phase"] == "Canary")

        def cohorts(stable: int, canary: int) -> None:
            cluster.wait(
                lambda: ready_by_bundle(cluster, ns, name) == Counter({old: stable, new: canary}),
                120,
                f"{stable} stable + {canary} canary Ready",
            )
            deps = {
                d.metadata.labels[BUNDLE_LABEL]: d.spec.replicas
                for d in cluster.apps.list_namespaced_deployment(ns).items
            }
            assert deps == {old: stable, new: canary}, deps
            assert canary / (stable + canary) == 0.25

        cohorts(12, 4)
        checked(get_md(cluster, ns, name), "Progressing", "progressing-replace-canary-kwok")
        for replicas, stable, canary in ((8, 6, 2), (16, 12, 4)):
            cluster.kubectl("scale", "md", name, "-n", ns, f"--replicas={replicas}")
            cohorts(stable, canary)
            scale = cluster.wait(
                lambda n=replicas: (lambda s: s if s["status"].get("replicas") == n else None)(
                    cluster.custom.get_namespaced_custom_object_scale(G, V, ns, P, name)
                ),
                30,
                f"scale subresource status.replicas {replicas}",
            )
            assert (
                scale["spec"]["replicas"] == replicas
                and "app.kubernetes.io/instance" in scale["status"]["selector"]
            )
            md = get_md(cluster, ns, name)
            assert md["status"]["phase"] == "Canary" and md["status"]["canary"]["bundle"] == new, md["status"]


def test_a_min_available_that_cannot_be_kept_waits_with_insufficient_capacity(
    cluster: E2ECluster, namespace: str, operator: Operator
) -> None:
    ns, name = namespace, "tight"
    with gpu_pool(cluster, ns, 2) as pool, FakePrometheus() as prom:
        old = serve(cluster, ns, name, pool_spec(name, pool, prom, minAvailable="100%"))
        with ReadyWatch(cluster, ns, name) as watch:
            new = change(cluster, ns, name, max_num_seqs=2)
            md = cluster.wait(
                lambda: (
                    lambda m: (
                        m if condition(m, "Progressing").get("reason") == "InsufficientCapacity" else None
                    )
                )(get_md(cluster, ns, name)),
                60,
                "Progressing reason InsufficientCapacity",
            )
            warned = [m for r, m in events(cluster, ns, name) if r == "InsufficientCapacity"]
            assert warned and "minAvailable 16" in warned[0], warned
            assert md["status"]["rollout"]["capacity"] == "Replace", md["status"]["rollout"]
            checked(md, "Progressing", "progressing-insufficient-capacity-kwok")
            waited = list(watch.samples)
            # a bound that can be kept (a spec change outside the bundle): the rollout moves and promotes
            cluster.custom.patch_namespaced_custom_object(
                G, V, ns, P, name, {"spec": {"rollout": {"minAvailable": "75%"}}}
            )
            settled(
                cluster,
                ns,
                name,
                180,
                "promoted",
                lambda s: s["phase"] == "Stable" and s["stable"]["bundle"] == new and not s.get("canary"),
            )
        # nothing moved while it waited
        assert waited and all(c == Counter({old: REPLICAS}) for c in waited), waited
        assert watch.minimum >= MIN_AVAILABLE, watch.samples
