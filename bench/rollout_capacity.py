"""Rollout capacity: Replace vs Surge wall time, minimum Ready, rollback.

  .venv/bin/python bench/rollout_capacity.py --reps 3 --out bench/results/rollout_capacity.json

Against the local cluster (`modeldeploy cluster up`, or $KUBECONFIG), with the e2e test's own
setup (modeldeploy_dev.rollout_scenario, as in e2e/test_rollout_capacity.py: node pools of kwok
nodes with exactly 8 GPUs, 16 replicas x 1 GPU, steps 25 % and 50 % with no pause, analysis every
5 s through the Prometheus stand-in).
Each repetition, in a fresh namespace with its own `modeldeploy operator` subprocess:

- full cluster (2 nodes x 8 GPUs, all 16 used): a bundle change until promoted (Auto picks
  Replace), Ready pods counted every 0.1 s (the minimum kept); then a slow bundle until the
  operator records it in status.failedBundles (the rollback decision), and from there until 16
  pods of the stable bundle are Ready and none of the canary's (full stable capacity);
- spare GPUs (4 nodes x 8 GPUs): the same bundle change until promoted (Auto picks Surge).

Status is polled every 0.1 s here (the e2e test polls every 0.5 s). Prints one line per figure
and a markdown table of medians and ranges; --out writes every sample as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from modeldeploy_dev.crd_install import apply_crd
from modeldeploy_dev.e2e_cluster import E2ECluster
from modeldeploy_dev.fake_prometheus import FakePrometheus
from modeldeploy_dev.operator_process import OperatorProcess
from modeldeploy_dev.rollout_scenario import (
    MIN_AVAILABLE,
    REPLICAS,
    ReadyWatch,
    change,
    events,
    get_md,
    gpu_pool,
    pool_spec,
    ready_by_bundle,
    serve,
)
from modeldeploy_dev.wait import wait_until

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.1


def status_until(cluster: E2ECluster, ns: str, name: str, timeout: float, what: str, pred) -> dict[str, Any]:
    return wait_until(
        lambda: (lambda m: m if pred(m.get("status") or {}) else None)(get_md(cluster, ns, name)),
        timeout,
        POLL_S,
        what,
    )


def promoted_to(bid: str):
    return lambda s: (
        s.get("phase") == "Stable" and s.get("stable", {}).get("bundle") == bid and not s.get("canary")
    )


def namespace(cluster: E2ECluster, tag: str) -> str:
    ns = f"bench-rollout-{tag}-{secrets.token_hex(3)}"
    cluster.core.create_namespace({"metadata": {"name": ns}})
    wait_until(
        lambda: any(
            a.metadata.name == "default" for a in cluster.core.list_namespaced_service_account(ns).items
        ),
        60,
        0.5,
        f"default ServiceAccount in {ns}",
    )
    return ns


def full_cluster(cluster: E2ECluster, ns: str) -> dict[str, Any]:
    name = "full"
    with gpu_pool(cluster, ns, 2) as pool, FakePrometheus() as prom:
        serve(cluster, ns, name, pool_spec(name, pool, prom))
        with ReadyWatch(cluster, ns, name) as watch:
            t0 = time.monotonic()
            new = change(cluster, ns, name, max_num_seqs=2)
            md = status_until(cluster, ns, name, 300, "promoted", promoted_to(new))
            took = time.monotonic() - t0
        capacity = md["status"]["rollout"]["capacity"]
        wait_until(
            lambda: ready_by_bundle(cluster, ns, name) == Counter({new: REPLICAS}), 120, POLL_S, "16 on new"
        )
        with ReadyWatch(cluster, ns, name) as back:
            t0 = time.monotonic()
            slow = change(cluster, ns, name, max_num_seqs=1, slow=prom.slow)
            md = status_until(
                cluster, ns, name, 300, "rolled back", lambda s: slow in s.get("failedBundles", [])
            )
            decided = time.monotonic()
            wait_until(
                lambda: ready_by_bundle(cluster, ns, name) == Counter({new: REPLICAS}),
                180,
                POLL_S,
                "16 Ready on the stable bundle, none of the canary",
            )
            full = time.monotonic()
        rolled = [m for r, m in events(cluster, ns, name) if r == "RolledBack"]
    return {
        "capacity": capacity,
        "promote_s": round(took, 2),
        "min_ready": watch.minimum,
        "polls": len(watch.samples),
        "slow_to_decision_s": round(decided - t0, 2),
        "decision_to_full_s": round(full - decided, 2),
        "rollback_min_ready": back.minimum,
        "restore": md["status"].get("rollout", {}).get("restore"),
        "rolled_back_event": rolled[-1] if rolled else None,
    }


def spare_gpus(cluster: E2ECluster, ns: str) -> dict[str, Any]:
    name = "roomy"
    with gpu_pool(cluster, ns, 4) as pool, FakePrometheus() as prom:
        serve(cluster, ns, name, pool_spec(name, pool, prom))
        with ReadyWatch(cluster, ns, name) as watch:
            t0 = time.monotonic()
            new = change(cluster, ns, name, max_num_seqs=2)
            md = status_until(cluster, ns, name, 300, "promoted", promoted_to(new))
            took = time.monotonic() - t0
    return {
        "capacity": md["status"]["rollout"]["capacity"],
        "promote_s": round(took, 2),
        "min_ready": watch.minimum,
        "polls": len(watch.samples),
    }


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})" if xs else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--out", type=Path, default=None, help="write every sample here as JSON")
    a = ap.parse_args()
    if not a.kubeconfig:
        from modeldeploy_dev.cluster.local import LocalCluster

        a.kubeconfig = str(LocalCluster.existing().kubeconfig)
    os.environ["KUBECONFIG"] = a.kubeconfig
    cluster = E2ECluster(a.kubeconfig, None)
    from kubernetes import client

    apply_crd(client.ApiextensionsV1Api(cluster.api))
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "git": rev.strip(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
    }
    runs: list[dict[str, Any]] = []
    logs = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    for i in range(a.reps):
        for tag, scenario in (("full", full_cluster), ("spare", spare_gpus)):
            ns = namespace(cluster, tag)
            op = OperatorProcess(a.kubeconfig, ns, logs / f"{ns}.log")
            op.start()
            try:
                r = {"rep": i, "scenario": tag, **scenario(cluster, ns)}
            except Exception as e:  # one failed repetition is recorded, not hidden
                r = {"rep": i, "scenario": tag, "error": f"{type(e).__name__}: {e}"[:500]}
                print(op.tail(40), file=sys.stderr)
            finally:
                op.stop()
                cluster.core.delete_namespace(ns)
            r["loadavg"] = Path("/proc/loadavg").read_text().split()[0]
            runs.append(r)
            print(json.dumps(r), flush=True)
    meta["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    full = [r for r in runs if r["scenario"] == "full" and "error" not in r]
    spare = [r for r in runs if r["scenario"] == "spare" and "error" not in r]
    print(f"\n{meta}\n")
    print("| figure | median (min-max) | runs |\n|---|---|---|")
    print(
        f"| full cluster ({[r['capacity'] for r in full]}): bundle change -> promoted, s | "
        f"{spread([r['promote_s'] for r in full])} | {len(full)} |"
    )
    print(
        f"| spare GPUs ({[r['capacity'] for r in spare]}): bundle change -> promoted, s | "
        f"{spread([r['promote_s'] for r in spare])} | {len(spare)} |"
    )
    print(
        f"| full cluster: min Ready of {REPLICAS} during the rollout (minAvailable {MIN_AVAILABLE}) | "
        f"{[r['min_ready'] for r in full]} | {len(full)} |"
    )
    print(
        f"| spare GPUs: min Ready of {REPLICAS} during the rollout | {[r['min_ready'] for r in spare]} | "
        f"{len(spare)} |"
    )
    print(
        f"| full cluster: slow bundle change -> rollback decision, s | "
        f"{spread([r['slow_to_decision_s'] for r in full])} | {len(full)} |"
    )
    print(
        f"| full cluster: rollback decision -> {REPLICAS} Ready on stable, s | "
        f"{spread([r['decision_to_full_s'] for r in full])} | {len(full)} |"
    )
    print(
        f"| full cluster: min Ready during the rollback | {[r['rollback_min_ready'] for r in full]} | "
        f"{len(full)} |"
    )
    if a.out:
        a.out.write_text(json.dumps({**meta, "runs": runs}, indent=1) + "\n")
    return 0 if len(full) == len(spare) == a.reps else 1


if __name__ == "__main__":
    sys.exit(main())
