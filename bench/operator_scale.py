"""Operator scale bench: N simulated GPU nodes, M ModelDeployments to all-Stable, reconcile latency;
then (--rollouts K) K ModelDeployments changing bundle at once on a full pool of GPU nodes.

  .venv/bin/python bench/operator_scale.py --nodes 2000 --mds 1000 --latency-samples 60
  .venv/bin/python bench/operator_scale.py --nodes 0 --mds 0 --rollouts 100 --rollout-replicas 4
  .venv/bin/python bench/operator_scale.py --nodes 2000 --mds 1000 --floor 1

The floor (--floor S): no operator. The bench creates each ModelDeployment and then, itself, the
children the operator would (its Deployment, built by operator/rollout/children.py, and S of its 3 Services;
an object that has not rolled out has 1, `<name>`) and times them to all Deployments Ready. That is
the control plane's own cost for the same objects: no operator can reach all-Stable faster on the
same machine, so the operator's wall time is read as a ratio to it. (It leaves out what only an
operator does: status writes, Events, reads.)

Against the local cluster (`modeldeploy cluster up`, or $KUBECONFIG). Applies the ModelDeployment
CRD (generated from the API types, so a cluster without it or with a stale copy works), creates
kwok nodes `bench-gpu-*` and namespace `bench-operator`, runs `modeldeploy operator` as a subprocess,
measures from its /proc entry (CPU seconds utime+stime, peak RSS VmHWM), and removes all it
created. Prints a markdown block for bench/results/operator.md.

Concurrent rollouts (--rollouts K): a pool of kwok nodes `bench-pool-*` with exactly the GPUs of
K ModelDeployments x R replicas x 1 GPU (labelled and tainted so only they land there: a full
cluster), steps 25 % and 50 % without pause, analysis every 5 s from the Prometheus stand-in
(modeldeploy_dev.fake_prometheus: kwok pods serve no metrics). Once all K are Stable with R Ready, every
bundle is patched at once; status is listed every 0.5 s, per object: when its rollout started
(status leaves Stable), when it was promoted, the capacity mode chosen. Starved: a rollout not
promoted by --rollout-timeout, or one whose start waited far longer than the others'.
"""

from __future__ import annotations

import argparse
import json
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

from modeldeploy.operator.api.v1alpha1.bundle import Bundle
from modeldeploy.operator.api.v1alpha1.modeldeployment import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    ModelDeploymentSpec,
)
from modeldeploy.operator.rollout import children
from modeldeploy.operator.rollout.bundle import bundle_id
from modeldeploy_dev.cluster.nodes import kwok_node
from modeldeploy_dev.crd_install import apply_crd as install_crd
from modeldeploy_dev.fake_prometheus import FakePrometheus
from modeldeploy_dev.wait import wait_until

ROOT = Path(__file__).resolve().parents[1]
G, V, P = GROUP, VERSION, PLURAL
NS = "bench-operator"
METRICS_PORT = 18090
SETTLE_S = 30.0  # after every node is Ready: kwok creates the nodes' Leases
# the all-Stable poll lists every ModelDeployment (3 MB at 1,000): not faster, it loads the API server
POLL_S = 2.0
IMAGE = "registry.local/modeldeploy-runtime@sha256:" + "5" * 64
DIGEST = "sha256:" + "b" * 64


def md(i: int) -> dict:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": KIND,
        "metadata": {"name": f"md-{i:04d}"},
        "spec": {
            "replicas": 1,
            "bundle": {
                "engine": {"image": IMAGE},
                "model": {"uri": "https://models.invalid/m", "revision": "r1", "digest": DIGEST},
                "tokenizer": {"revision": "r1", "digest": DIGEST},
            },
            "topology": {
                "gpusPerReplica": 1,
                "gpuType": "NVIDIA-H200",
                "nodeSelector": {"modeldeploy.dev/node-kind": "kwok"},
            },
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        },
    }


def apply_crd(ext: client.ApiextensionsV1Api, timeout: float = 60) -> None:
    """Create or replace the ModelDeployment CRD from the API types, then wait until it is Established."""
    name = install_crd(ext, timeout)
    print(f"CRD {name} applied", file=sys.stderr)


def all_nodes_ready(core: client.CoreV1Api, names: set[str]) -> bool:
    """Raw JSON, not the client's models (nodes.node_ready): decoding 2,000 nodes each poll would load
    the machine the bench measures."""
    ready = set()
    for n in json.loads(core.list_node(_preload_content=False, _request_timeout=60).data)["items"]:
        conds = (n.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
            ready.add(n["metadata"]["name"])
    return names <= ready


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


POOL = "modeldeploy.dev/pool"
POOL_NAME = "bench-rollouts"


def rollout_md(i: int, replicas: int, prom: str) -> dict:
    """A ModelDeployment of the full pool: R replicas x 1 GPU, Replace-friendly steps, analysis from
    `prom`."""
    obj = md(i)
    obj["metadata"]["name"] = f"ro-{i:03d}"
    spec = obj["spec"]
    spec["replicas"] = replicas
    spec["bundle"]["config"] = {"maxNumSeqs": 4}
    spec["topology"]["nodeSelector"] = {POOL: POOL_NAME}
    spec["topology"]["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": POOL, "operator": "Equal", "value": POOL_NAME, "effect": "NoSchedule"},
    ]
    spec["rollout"] = {
        "conformanceGate": False,  # kwok pods serve nothing to run the suite against
        "steps": [{"weight": 25, "pauseSeconds": 0}, {"weight": 50, "pauseSeconds": 0}],
        "analysis": {
            "intervalSeconds": 5,
            "minSamples": 20,
            "maxTtftP95Ratio": 1.5,
            "prometheus": {"address": prom},
        },
        "progressDeadlineSeconds": 1800,
    }
    return obj


def pool_node(name: str) -> dict:
    body = kwok_node(name)
    body["metadata"]["labels"][POOL] = POOL_NAME
    body["spec"]["taints"].append({"key": POOL, "value": POOL_NAME, "effect": "NoSchedule"})
    return body


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--mds", type=int, default=200)
    ap.add_argument("--latency-samples", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument(
        "--rollouts", type=int, default=0, help="ModelDeployments changing bundle at once, full pool"
    )
    ap.add_argument("--rollout-replicas", type=int, default=4)
    ap.add_argument("--rollout-timeout", type=float, default=900)
    ap.add_argument(
        "--floor",
        type=int,
        choices=(1, 2, 3),
        default=None,
        metavar="SERVICES",
        help="no operator: create each object's Deployment and this many of its Services directly",
    )
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    a = ap.parse_args()
    if a.floor is not None and (a.rollouts or a.mds <= 0):
        ap.error("--floor times --mds objects (at least 1) to all Ready; it takes no --rollouts")
    if not a.kubeconfig:
        from modeldeploy_dev.cluster.local import LocalCluster

        a.kubeconfig = str(LocalCluster.existing().kubeconfig)
    config.load_kube_config(a.kubeconfig)
    core, apps, custom = client.CoreV1Api(), client.AppsV1Api(), client.CustomObjectsApi()
    apply_crd(client.ApiextensionsV1Api())
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True)
    print(
        f"git {rev.stdout.strip()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
        f"load average {Path('/proc/loadavg').read_text().split()[:3]}, "
        f"MODELDEPLOY_WORKERS={os.environ.get('MODELDEPLOY_WORKERS', '(default)')}: {' '.join(sys.argv)}"
    )
    names = [f"bench-gpu-{i}" for i in range(a.nodes)]
    pool = [f"bench-pool-{i}" for i in range(-(-a.rollouts * a.rollout_replicas // 8))]
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda n: _ignore_409(lambda: core.create_node(kwok_node(n))), names))
        list(ex.map(lambda n: _ignore_409(lambda: core.create_node(pool_node(n))), pool))
    print(
        f"{a.nodes} nodes + {len(pool)} pool nodes created in {time.monotonic() - t0:.1f}s", file=sys.stderr
    )
    # the nodes' own start (kwok's node-initialize status and their Leases) must be over before the clock
    # starts: 2,000 nodes coming up cost the API server about half a core for a minute, which the first
    # runs of this bench counted against the operator
    wait_until(lambda: all_nodes_ready(core, set(names) | set(pool)), 600, 2.0, "every node Ready")
    time.sleep(SETTLE_S)
    print(
        f"nodes Ready after {time.monotonic() - t0:.1f}s (then {SETTLE_S:.0f} s to settle)", file=sys.stderr
    )
    _ignore_409(lambda: core.create_namespace({"metadata": {"name": NS}}))
    # 3 ClusterIP Services per MD: widen a small local Service range (kwokctl's is a /24)
    net = client.NetworkingV1Api()
    _ignore_409(
        lambda: net.create_service_cidr(
            {"metadata": {"name": "bench-operator"}, "spec": {"cidrs": ["10.96.0.0/16"]}}
        )
    )
    if a.floor is not None:
        try:
            return 0 if floor(a, apps, custom, core) else 1
        finally:
            _ignore_404(lambda: core.delete_namespace(NS))
            _wait_gone(core, NS)
            _ignore_404(lambda: net.delete_service_cidr("bench-operator"))
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda n: _ignore_404(lambda: core.delete_node(n)), names + pool))
    env = {**os.environ, "KUBECONFIG": a.kubeconfig}
    op = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "modeldeploy",
            "operator",
            "-n",
            NS,
            "--standalone",
            "--metrics-port",
            str(METRICS_PORT),
            "--bind",
            "127.0.0.1",
            "--health-port",
            "0",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open("/tmp/bench-operator.log", "wb"),
    )
    ok = True
    try:
        time.sleep(3)
        if a.mds:
            ok = scale(a, op.pid, apps, custom)
        if a.rollouts:
            with FakePrometheus() as prom:
                ok = rollouts(a, op.pid, custom, prom.address) and ok
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
        print(
            f"(reconciles: {n:.0f}, mean reconcile {total / max(n, 1):.3f} s; "
            f"load average at the end {Path('/proc/loadavg').read_text().split()[:3]})"
        )
        asked = {
            k.split("{", 1)[1].rstrip("}"): v
            for k, v in m.items()
            if k.startswith("modeldeploy_operator_reconcile_requests_total{")
        }
        print(
            "(reconcile requests by source and outcome: "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(asked.items()))
            + ")"
        )
        return 0 if ok else 1
    finally:
        op.terminate()
        try:
            op.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a loaded machine: a busy operator is not left running
            op.kill()
            op.wait(timeout=30)
        _ignore_404(lambda: core.delete_namespace(NS))
        _wait_gone(core, NS)
        _ignore_404(lambda: net.delete_service_cidr("bench-operator"))
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda n: _ignore_404(lambda: core.delete_node(n)), names + pool))


def scale(a: argparse.Namespace, pid: int, apps: client.AppsV1Api, custom: client.CustomObjectsApi) -> bool:
    """M ModelDeployments created at once until all are Stable, then the spec-change latency."""
    cpu0, _ = proc_stats(pid)
    start = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: custom.create_namespaced_custom_object(G, V, NS, P, md(i)), range(a.mds)))
    stable = 0
    while time.monotonic() - start < a.timeout:
        items = custom.list_namespaced_custom_object(G, V, NS, P, _request_timeout=30)["items"]
        stable = sum(
            1
            for m in items
            if m["metadata"]["name"].startswith("md-") and (m.get("status") or {}).get("phase") == "Stable"
        )
        if stable == a.mds:
            break
        time.sleep(POLL_S)
    wall = time.monotonic() - start
    cpu1, rss = proc_stats(pid)
    lat = latency(apps, custom, min(a.latency_samples, a.mds))
    cpu2, rss2 = proc_stats(pid)
    # inclusive: a p99 of 60 samples lies between the two slowest, never above the slowest (the default
    # "exclusive" method extrapolates past it)
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    print(
        "| nodes | MDs | all-Stable wall s | operator CPU s | peak RSS MB | latency p50 s | p99 s "
        "| samples |\n"
        f"|---|---|---|---|---|---|---|---|\n"
        f"| {a.nodes} | {stable}/{a.mds} | {wall:.1f} | {cpu1 - cpu0:.1f} | {rss / 2**20:.0f} | "
        f"{statistics.median(lat):.3f} | {q[98]:.3f} | {len(lat)} |"
    )
    print(f"(CPU including latency phase: {cpu2 - cpu0:.1f} s, peak RSS after it {rss2 / 2**20:.0f} MB)")
    slowest = sorted(enumerate(lat), key=lambda x: -x[1])[:3]  # p99 of 60 is the slowest: which, and alone?
    print("(slowest spec-change samples: " + ", ".join(f"#{i} {s:.3f} s" for i, s in slowest) + ")")
    return stable == a.mds


def floor(
    a: argparse.Namespace, apps: client.AppsV1Api, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> bool:
    """--floor: each object created, then its Deployment and `a.floor` Services by the bench itself
    (owned by the object, as the operator's are, so the garbage collector keeps them), until every
    Deployment has its replica Ready. The same 8 client threads and 2 s poll as `scale`."""
    suffixes = ("", "stable", "canary")[: a.floor]

    def one(i: int) -> None:
        obj = custom.create_namespaced_custom_object(G, V, NS, P, md(i))
        spec = ModelDeploymentSpec.model_validate(obj["spec"])
        bid = bundle_id(spec.bundle)
        apps.create_namespaced_deployment(NS, children.deployment(obj, spec, bid, spec.replicas))
        for s in suffixes:
            core.create_namespaced_service(NS, children.service(obj, s, bid if s == "stable" else None))

    start = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(one, range(a.mds)))
    created = time.monotonic() - start
    ready = 0
    while time.monotonic() - start < a.timeout:
        body = json.loads(
            apps.list_namespaced_deployment(NS, _preload_content=False, _request_timeout=30).data
        )
        ready = sum(1 for d in body["items"] if ((d.get("status") or {}).get("readyReplicas") or 0) >= 1)
        if ready == a.mds:
            break
        time.sleep(POLL_S)
    wall = time.monotonic() - start
    print(
        f"| nodes | objects | Services each | created in s | all Ready wall s |\n|---|---|---|---|---|\n"
        f"| {a.nodes} | {ready}/{a.mds} | {a.floor} | {created:.1f} | {wall:.1f} |"
    )
    print(f"(load average at the end {Path('/proc/loadavg').read_text().split()[:3]})")
    return ready == a.mds


def rollouts(a: argparse.Namespace, pid: int, custom: client.CustomObjectsApi, prom: str) -> bool:
    """K ModelDeployments filling the pool; every bundle changed at once; per object start and promotion."""
    k, r = a.rollouts, a.rollout_replicas
    names = [f"ro-{i:03d}" for i in range(k)]
    with ThreadPoolExecutor(8) as ex:
        list(
            ex.map(
                lambda i: custom.create_namespaced_custom_object(G, V, NS, P, rollout_md(i, r, prom)),
                range(k),
            )
        )

    def listed() -> dict[str, dict]:
        items = custom.list_namespaced_custom_object(G, V, NS, P, _request_timeout=30)["items"]
        return {m["metadata"]["name"]: m for m in items if m["metadata"]["name"].startswith("ro-")}

    def all_ready() -> bool:
        ms = listed()
        return len(ms) == k and all(
            (s := m.get("status") or {}).get("phase") == "Stable"
            and (s.get("stable") or {}).get("readyReplicas") == r
            for m in ms.values()
        )

    t = time.monotonic()
    wait_until(all_ready, a.rollout_timeout, 1.0, f"{k} rollout objects Stable with {r} Ready")
    print(
        f"{k} x {r} replicas Stable on {-(-k * r // 8)} full pool nodes in {time.monotonic() - t:.1f}s",
        file=sys.stderr,
    )
    specs = {n: m["spec"] for n, m in listed().items()}
    new: dict[str, str] = {}
    for n, spec in specs.items():
        spec["bundle"]["config"]["maxNumSeqs"] = 2
        new[n] = bundle_id(Bundle.model_validate(spec["bundle"]))
    cpu0, _ = proc_stats(pid)
    sent: dict[str, float] = {}
    start = time.monotonic()

    def patch(n: str) -> None:
        custom.patch_namespaced_custom_object(G, V, NS, P, n, {"spec": {"bundle": specs[n]["bundle"]}})
        sent[n] = time.monotonic()

    with ThreadPoolExecutor(16) as ex:
        list(ex.map(patch, names))
    patched = time.monotonic() - start
    started: dict[str, float] = {}
    promoted: dict[str, float] = {}
    failed: set[str] = set()
    capacity: dict[str, str] = {}
    while time.monotonic() - start < a.rollout_timeout and len(promoted) + len(failed) < k:
        now = time.monotonic()
        for n, m in listed().items():
            s = m.get("status") or {}
            if n not in started and (
                s.get("phase") != "Stable" or (s.get("canary") or {}).get("bundle") == new[n]
            ):
                started[n] = now
            if (s.get("rollout") or {}).get("capacity"):
                capacity[n] = s["rollout"]["capacity"]
            if new[n] in s.get("failedBundles", []):
                failed.add(n)
            if (
                n not in promoted
                and s.get("phase") == "Stable"
                and (s.get("stable") or {}).get("bundle") == new[n]
            ):
                promoted[n] = now
                started.setdefault(n, now)
        time.sleep(0.5)
    wall = time.monotonic() - start
    cpu1, rss = proc_stats(pid)
    took = sorted(promoted[n] - sent[n] for n in promoted)
    wait = sorted(started[n] - sent[n] for n in started)
    q = statistics.quantiles(took, n=10) if len(took) > 1 else took * 9
    late = [n for n in names if n not in promoted]
    slow_start = [n for n in started if started[n] - sent[n] > max(10.0, 5 * statistics.median(wait))]
    modes = {m: list(capacity.values()).count(m) for m in sorted(set(capacity.values()))}
    nan = float("nan")
    header = [
        "rollouts", "replicas each", "pool GPUs", "patched in s", "all promoted wall s", "promote p50 s",
        "p90 s", "max s", "start wait p50 s", "max s", "capacity", "not promoted", "rolled back",
        "operator CPU s", "peak RSS MB",
    ]  # fmt: skip
    row = [
        k, r, -(-k * r // 8) * 8, f"{patched:.1f}", f"{wall:.1f}" + (" (timeout)" if late else ""),
        f"{statistics.median(took) if took else nan:.1f}", f"{q[8]:.1f}", f"{took[-1] if took else nan:.1f}",
        f"{statistics.median(wait) if wait else nan:.1f}", f"{wait[-1] if wait else nan:.1f}", modes,
        len(late), len(failed), f"{cpu1 - cpu0:.1f}", f"{rss / 2**20:.0f}",
    ]  # fmt: skip
    print(
        "\n".join("| " + " | ".join(map(str, cells)) + " |" for cells in (header, ["---"] * len(header), row))
    )
    slowest = sorted(promoted, key=lambda n: promoted[n] - sent[n])[-5:]
    print(
        f"(starved: not promoted {late or 'none'}; start waited > max(10 s, 5x median) "
        f"{slow_start or 'none'}; slowest promotions {slowest})"
    )
    return not late and not failed


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
