"""Operator scale bench: N simulated GPU nodes, M ModelDeployments to all-Stable, reconcile latency.

  .venv/bin/python bench/operator_scale.py --nodes 1000 --mds 200 --latency-samples 40

Against the local cluster (`modeldeploy cluster up`, or $KUBECONFIG). Applies the ModelDeployment
CRD (generated from the API types, so a cluster without it or with a stale copy works), creates
kwok nodes `bench-gpu-*` and namespace `bench-operator`, runs `modeldeploy operator` as a subprocess,
measures from its /proc entry (CPU seconds utime+stime, peak RSS VmHWM), and removes all it
created. Prints a markdown block for bench/results/operator.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from modeldeploy.operator import api
from modeldeploy_dev.cluster.nodes import kwok_node
from modeldeploy_dev.crd_install import apply_crd as install_crd
from modeldeploy_dev.wait import wait_until

G, V, P = api.GROUP, api.VERSION, api.PLURAL
NS = "bench-operator"
METRICS_PORT = 18090
IMAGE = "registry.local/modeldeploy-runtime@sha256:" + "5" * 64
DIGEST = "sha256:" + "b" * 64


def md(i: int) -> dict:
    return {
        "apiVersion": f"{G}/{V}", "kind": api.KIND, "metadata": {"name": f"md-{i:04d}"},
        "spec": {
            "replicas": 1,
            "bundle": {"engine": {"image": IMAGE},
                       "model": {"uri": "https://models.invalid/m", "revision": "r1", "digest": DIGEST},
                       "tokenizer": {"revision": "r1", "digest": DIGEST}},
            "topology": {"gpusPerReplica": 1, "gpuType": "NVIDIA-H200", "nodeSelector": {"modeldeploy.dev/node-kind": "kwok"}},
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        },
    }  # fmt: skip


def apply_crd(ext: client.ApiextensionsV1Api, timeout: float = 60) -> None:
    """Create or replace the ModelDeployment CRD from the API types, then wait until it is Established."""
    name = install_crd(ext, timeout)
    print(f"CRD {name} applied", file=sys.stderr)


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds, peak RSS bytes) of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    hwm = next(
        int(line.split()[1]) * 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmHWM")
    )
    return cpu, hwm


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--mds", type=int, default=200)
    ap.add_argument("--latency-samples", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    a = ap.parse_args()
    if not a.kubeconfig:
        from modeldeploy_dev.cluster.local import LocalCluster

        a.kubeconfig = str(LocalCluster().kubeconfig)
    config.load_kube_config(a.kubeconfig)
    core, apps, custom = client.CoreV1Api(), client.AppsV1Api(), client.CustomObjectsApi()
    apply_crd(client.ApiextensionsV1Api())
    names = [f"bench-gpu-{i}" for i in range(a.nodes)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda n: _ignore_409(lambda: core.create_node(kwok_node(n))), names))
    print(f"{a.nodes} nodes created in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    _ignore_409(lambda: core.create_namespace({"metadata": {"name": NS}}))
    # 3 ClusterIP Services per MD: widen a small local Service range (kwokctl's is a /24)
    net = client.NetworkingV1Api()
    _ignore_409(
        lambda: net.create_service_cidr(
            {"metadata": {"name": "bench-operator"}, "spec": {"cidrs": ["10.96.0.0/16"]}}
        )
    )
    env = {**os.environ, "KUBECONFIG": a.kubeconfig}
    op = subprocess.Popen([sys.executable, "-m", "modeldeploy", "operator", "-n", NS, "--standalone", "--metrics-port", str(METRICS_PORT), "--bind", "127.0.0.1",
                           "--health-port", "0"], env=env, stdout=subprocess.DEVNULL, stderr=open("/tmp/bench-operator.log", "wb"))  # fmt: skip
    try:
        time.sleep(3)
        cpu0, _ = proc_stats(op.pid)
        start = time.monotonic()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: custom.create_namespaced_custom_object(G, V, NS, P, md(i)), range(a.mds)))
        stable = 0
        while time.monotonic() - start < a.timeout:
            items = custom.list_namespaced_custom_object(G, V, NS, P, _request_timeout=30)["items"]
            stable = sum(1 for m in items if (m.get("status") or {}).get("phase") == "Stable")
            if stable == a.mds:
                break
            time.sleep(0.5)
        wall = time.monotonic() - start
        cpu1, rss = proc_stats(op.pid)
        lat = latency(apps, custom, min(a.latency_samples, a.mds))
        cpu2, rss = proc_stats(op.pid)
        q = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
        print(f"| nodes | MDs | all-Stable wall s | operator CPU s | peak RSS MB | latency p50 s | p99 s | samples |\n"
              f"|---|---|---|---|---|---|---|---|\n"
              f"| {a.nodes} | {stable}/{a.mds} | {wall:.1f} | {cpu1 - cpu0:.1f} | {rss / 2**20:.0f} | "
              f"{statistics.median(lat):.3f} | {q[98]:.3f} | {len(lat)} |")  # fmt: skip
        print(f"(CPU including latency phase: {cpu2 - cpu0:.1f} s)")
        text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).read().decode()
        m = {
            ln.split()[0]: float(ln.split()[1])
            for ln in text.splitlines()
            if ln.startswith("modeldeploy_operator_") and " " in ln
        }
        n, total = (
            m.get("modeldeploy_operator_reconciles_total", 0),
            m.get("modeldeploy_operator_reconcile_seconds_sum", 0),
        )
        print(f"(reconciles: {n:.0f}, mean reconcile {total / max(n, 1):.3f} s)")
        return 0 if stable == a.mds else 1
    finally:
        op.terminate()
        op.wait(timeout=30)
        _ignore_404(lambda: core.delete_namespace(NS))
        _wait_gone(core, NS)
        _ignore_404(lambda: net.delete_service_cidr("bench-operator"))
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda n: _ignore_404(lambda: core.delete_node(n)), names))


def latency(apps: client.AppsV1Api, custom: client.CustomObjectsApi, n: int) -> list[float]:
    """Seconds from a spec.replicas change to the child Deployment carrying it, one MD at a time."""
    out = []
    for i in range(n):
        name = f"md-{i:04d}"
        want = 2  # every MD starts at 1
        sent = time.monotonic()
        custom.patch_namespaced_custom_object(G, V, NS, P, name, {"spec": {"replicas": want}})
        w = watch.Watch()
        sel = f"app.kubernetes.io/instance={name}"
        for ev in w.stream(
            apps.list_namespaced_deployment, NS, label_selector=sel, timeout_seconds=30, _request_timeout=35
        ):
            if ev["object"].spec.replicas == want:
                out.append(time.monotonic() - sent)
                w.stop()
    return out


def _wait_gone(core: client.CoreV1Api, ns: str, timeout: float = 180) -> None:
    """Services must be gone before their ServiceCIDR can be deleted."""

    def gone() -> bool:
        try:
            core.read_namespace(ns, _request_timeout=10)
        except ApiException as e:
            return e.status == 404
        return False

    try:
        wait_until(gone, timeout, 1, f"namespace {ns} to be deleted")
    except TimeoutError as e:  # best effort: the nodes and the ServiceCIDR are removed all the same
        print(f"warning: {e}", file=sys.stderr)


def _ignore_409(fn) -> None:
    try:
        fn()
    except ApiException as e:
        if e.status != 409:
            raise


def _ignore_404(fn) -> None:
    try:
        fn()
    except ApiException as e:
        if e.status != 404:
            raise


if __name__ == "__main__":
    sys.exit(main())
