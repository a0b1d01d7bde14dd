"""kwok scale on the local cluster: time to N Ready simulated nodes and M Ready pods.

Runs against its own throwaway cluster (name md-scale, bridge mdbr8) so it never disturbs a
cluster in use, and takes it down at the end. Prints one JSON line with the figures.

  .venv/bin/python bench/cluster_scale.py --nodes 1000 --pods 2000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client, config

from modeldeploy.operator.rollout.progression import RFC3339
from modeldeploy_dev.cluster.local import LocalCluster, Settings
from modeldeploy_dev.cluster.nodes import kwok_node, node_ready
from modeldeploy_dev.wait import wait_until


def wait(fn, timeout: float, what: str, interval: float = 1.0) -> float:  # noqa: ANN001
    """Seconds until `fn()` held."""
    t0 = time.monotonic()
    wait_until(fn, timeout, interval, what)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--keep", action="store_true", help="leave the md-scale cluster running")
    a = ap.parse_args()
    c = LocalCluster(
        Settings(name="md-scale", gpu_nodes=0, ready_delay_ms=0, bridge="mdbr8", pod_cidr="10.244.8.0/24")
    )
    c.down()
    t_up = c.up()
    try:
        api = config.new_client_from_config(config_file=str(c.kubeconfig))
        api.configuration.connection_pool_maxsize = 16
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: core.create_node(kwok_node(f"scale-{i:05d}")), range(a.nodes)))
        t_created = time.monotonic() - t0

        def nodes_ready() -> bool:
            items = core.list_node(label_selector="type=kwok").items
            return sum(node_ready(n) for n in items) >= a.nodes

        wait(nodes_ready, a.timeout, f"{a.nodes} Ready nodes")
        t_nodes = time.monotonic() - t0
        t1 = time.monotonic()
        apps.create_namespaced_deployment(
            "default",
            {
                "metadata": {"name": "scale"},
                "spec": {
                    "replicas": a.pods,
                    "selector": {"matchLabels": {"app": "scale"}},
                    "template": {
                        "metadata": {"labels": {"app": "scale"}},
                        "spec": {
                            "nodeSelector": {"type": "kwok"},
                            "tolerations": [
                                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                            ],
                            "containers": [{"name": "c", "image": "registry.invalid/x@sha256:" + "0" * 64}],
                        },
                    },
                },
            },
        )

        def pods_ready() -> bool:
            d = apps.read_namespaced_deployment("scale", "default")
            return (d.status.ready_replicas or 0) >= a.pods

        wait(pods_ready, a.timeout, f"{a.pods} Ready pods", interval=2.0)
        t_pods = time.monotonic() - t1
    finally:
        if not a.keep:
            c.down()
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        json.dumps(
            {
                "nodes": a.nodes,
                "pods": a.pods,
                "up_s": round(t_up, 1),
                "nodes_created_s": round(t_created, 1),
                "nodes_ready_s": round(t_nodes, 1),
                "pods_ready_s": round(t_pods, 1),
                "git_rev": rev,
                "date": time.strftime(RFC3339, time.gmtime()),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
