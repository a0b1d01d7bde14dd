"""`modeldeploy cluster up|down|status|kubeconfig|build|testserver`: the local test cluster."""

from __future__ import annotations

import argparse
import json
import sys

from modeldeploy_dev.cluster.local import LocalCluster, Settings


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    for name, help_ in (
        ("up", "build what is missing, start the cluster and the process node"),
        ("down", "stop everything; leaves no process and no listening port"),
        ("status", "print components, process node and paths as JSON"),
        ("kubeconfig", "print the kubeconfig path (use: export KUBECONFIG=$(...))"),
        ("build", "compile the pinned binaries into ~/.cache/modeldeploy (cached)"),
    ):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument(
            "--name", default=None, help="cluster name (default $MODELDEPLOY_CLUSTER_NAME or modeldeploy)"
        )
        if name in ("up", "build"):
            sp.add_argument(
                "--real-node",
                action="store_true",
                help="also a real worker node: kubelet + containerd v2 + runc + CNI bridge, kube-proxy, "
                "and the loopback image registry. Opt-in: its first build compiles them from Go modules "
                "(minutes on a cold Go cache); one real node per machine",
            )
        if name == "up":
            sp.add_argument("--gpu-nodes", type=int, default=2, help="simulated (kwok) GPU nodes")
            sp.add_argument("--ready-delay-ms", type=int, default=1000, help="kwok pod Running/Ready delay")
            sp.add_argument(
                "--bridge",
                default=None,
                help="host-local bridge of the process node (default $MODELDEPLOY_CLUSTER_BRIDGE or mdbr0)",
            )
            sp.add_argument(
                "--pod-cidr",
                default=None,
                help="private pod CIDR on that bridge "
                "(default $MODELDEPLOY_CLUSTER_POD_CIDR or 10.244.0.0/24)",
            )
    from modeldeploy_dev.procnode import testserver

    testserver.configure(sub.add_parser("testserver", help="test workload for the process node"))


def _settings(a: argparse.Namespace) -> Settings:
    s = Settings()
    if a.name:
        s.name = a.name
    for k in ("gpu_nodes", "ready_delay_ms", "bridge", "pod_cidr", "real_node"):
        if getattr(a, k, None) is not None:
            setattr(s, k, getattr(a, k))
    if s.gpu_nodes < 0:
        raise SystemExit("modeldeploy cluster up: --gpu-nodes must be >= 0")
    return s


def main(a: argparse.Namespace) -> int:
    if a.action == "testserver":
        from modeldeploy_dev.procnode import testserver

        return testserver.main(a)
    c = LocalCluster(_settings(a)) if a.action in ("up", "build") else LocalCluster.existing(a.name)
    if a.action == "build":
        c.build()
        print(f"binaries in {c.bins.root}")
    elif a.action == "up":
        c.up(log=lambda m: print(m, file=sys.stderr))
        print(c.kubeconfig)
    elif a.action == "down":
        c.down(log=lambda m: print(m, file=sys.stderr))
    elif a.action == "status":
        st = c.status()
        print(json.dumps(st, indent=2))
        return 0 if st["running"] else 1
    elif a.action == "kubeconfig":
        if not c.kubeconfig.exists():
            print(f"no kubeconfig at {c.kubeconfig}: run `modeldeploy cluster up` first", file=sys.stderr)
            return 1
        print(c.kubeconfig)
    return 0
