"""Chaos during a canary (issue 39): the control plane, the metrics backend and a stable pod fail
in the middle of a rollout's analysis, and the rollout must still end as its policy says.

  .venv/bin/python bench/chaos.py
      [--cases apiserver,etcd,metrics-hold,metrics-rollback,partition-prometheus,partition-operator,
               stable-pod,node-lost,node-lost-rollback,node-lost-replace,node-partition]
      [--node process|real] [--out bench/results/chaos.json]

Against the local cluster (`modeldeploy cluster up`; brought up here if it is not running, and
taken down again then). Each case, in a fresh Pod-Security-restricted namespace with its own
`modeldeploy operator` process: the tiny model (2 stable replicas), a bounded closed-loop load on
the Service's endpoints (modeldeploy_dev.load), a harmless bundle change (maxNumSeqs 8 -> 6) whose
one step (50 %) pauses long enough for the fault to land while the canary is being analysed.

`--node process` (the default): the pods are processes on the process node. `--node real`: the
real-node cluster (`modeldeploy cluster up --real-node`: kubelet, containerd, runc, CNI; its own
cluster, brought up and taken down the same way), the pods are containers of the runtime image,
built here and pulled by digest from the node's registry, the model on a `local` volume of
`real-0`. The node cases (node-lost*, node-partition) add a second real node there, `real-1`
(LocalCluster.spare_real_node: its own kubelet, containerd, bridge, pod CIDR and cgroup root, no
kube-proxy; the model's `local` volume admits both nodes, which share this machine's disk), pull the
runtime image into it before the bundle change, and lose it as faults.RealSpareNode says (kubelet,
containerd, shims and containers SIGKILLed, the pods' veths removed; node-partition: kubelet and
containerd only). The cases:

- apiserver: kube-apiserver SIGKILLed, down 10 s, restarted (`kwokctl start cluster`): promoted.
- etcd: etcd SIGKILLed, down 10 s, restarted: promoted.
- metrics-hold: the analysis reads a real Prometheus, which is frozen (SIGSTOP: connections hang)
  for 30 s; onInconclusive Hold: the step holds on Inconclusive, then the metrics come back and it
  is promoted.
- metrics-rollback: the same with Prometheus frozen until the decision; onInconclusive Rollback:
  rolled back with reason AnalysisInconclusive.
- partition-prometheus: the Prometheus→canary path cut for 30 s (an iptables rule drops what the
  Prometheus process sends to the canary pods; the load still reaches them): its scrapes time out,
  the canary's series go stale, the analysis is Inconclusive; onInconclusive Hold: held, then
  promoted once the path is back.
- partition-operator: no Prometheus; the operator scrapes the pods itself, and the operator→canary
  path is cut until the decision; onInconclusive Rollback: rolled back, AnalysisInconclusive.
- stable-pod: one of the two stable pods' serving process SIGKILLed (an OOM kill; on the real node
  the container's main process, so containerd sees its task exit and kubelet restarts the
  container); the canary must not be blamed: promoted.
- node-lost: the canary alone on a second process node (`proc-1`, its own agent, bridge and pod
  CIDR: the home node is cordoned from the bundle change to the fault), which loses power (agent
  and pod processes SIGKILLed, the pods' network gone: their IPs answer nothing). The node goes
  NotReady after kube-controller-manager's --node-monitor-grace-period (kwokctl's: 3m20s, checked
  every 25 s) and its pods are marked unready; the operator then deletes the canary pods it waits
  on (Event PodOnLostNode; before it did, they waited for their default 300 s unreachable toleration
  and the taint-eviction controller), and their replacements start on the home node. The analysis
  has no canary figures meanwhile (Inconclusive), so with onInconclusive Hold the step holds, then
  judges the replacements: promoted. The case's progress deadline is 1200 s (the others': 600 s).
- node-lost-rollback: the same loss with onInconclusive Rollback: rolled back, AnalysisInconclusive,
  when the step's pause ends, without waiting for Kubernetes to notice the node.
- node-lost-replace: node-lost-rollback under capacity Replace (minAvailable 1): the step scales
  stable down to one pod to make room for the canary's one, the canary's node is lost, the rollback
  (AnalysisInconclusive) brings stable back to two Ready pods on the home node; the stable cohort
  must not fail a request while it runs on one pod, nor while it grows back.
- node-partition: the same node, but only its agent (kubelet and container runtime) is SIGKILLed:
  the canary pods keep running and answering (a node cut off from the control plane only). Nothing
  changes for the clients until the node controller marks the node NotReady and its pods unready
  (out of the endpoints and of the analysis), then evicts them; the step's pause (400 s) is long
  enough for that to happen inside it. onInconclusive Hold: held, then the replacements on the home
  node are judged: promoted. (The unreachable variant, the pods running but cut off from everyone,
  is node-lost to every client and to the operator.)

Each case passes when: the final phase and decision are the policy's; each decision Event is
posted once; no stable request failed (stable-pod: none on the stable pod that was not killed; the
killed pod's own in-flight and refused requests are counted apart; node-lost: the lost canary pods'
failures are counted apart). Prints a markdown timeline
(seconds from the bundle change) and exits non-zero if a case failed.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from modeldeploy_dev import faults
from modeldeploy_dev.cluster.local import LocalCluster, real_node_settings
from modeldeploy_dev.cluster.realnode import images
from modeldeploy_dev.crd_install import apply_crd
from modeldeploy_dev.e2e_cluster import E2ECluster
from modeldeploy_dev.load import Load
from modeldeploy_dev.operator_process import OperatorProcess
from modeldeploy_dev.prometheus import PROMETHEUS, PodTargets, Prom
from modeldeploy_dev.rollout_scenario import (
    ANALYSIS,
    change_bundle,
    create,
    events,
    get_md,
    stable_and_ready,
    tiny_model_local_pv,
    tiny_model_pv,
    tiny_spec,
    wait_md,
)
from modeldeploy_dev.wait import wait_until

NAME = "chaos"
CASES = (
    "apiserver",
    "etcd",
    "metrics-hold",
    "metrics-rollback",
    "partition-prometheus",
    "partition-operator",
    "stable-pod",
    "node-lost",
    "node-lost-rollback",
    "node-lost-replace",
    "node-partition",
)
# the cases whose policy (onInconclusive Rollback) ends in a rollback
ROLLBACK = ("metrics-rollback", "partition-operator", "node-lost-rollback", "node-lost-replace")
BUNDLE = "modeldeploy.dev/bundle"
# node-lost: NotReady after up to 225 s, the lost pods' 300 s toleration, their replacements loading and
# analysed: within the case's progress deadline; bounded by it, so a rollout that never decides fails
NODE_LOST_WAIT_S = 1200
NODE_LOST_DEADLINE_S = 1200
# the real-node cluster's second node for the node cases (LocalCluster.spare_real_node)
SPARE_REAL_NODE = "real-1"
# node-partition: the pods still serve, so the step must outlast the node controller's grace period
# (kwokctl's 3m20s) for the fault to show inside it
PARTITION_PAUSE_S = 400
REAL_NODE = "real-0"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "modeldeployment-tiny.yaml"
# the first pods on the real node pull the 6.3 GB runtime image from the node's registry
REAL_READY_S = 900
# how a failed API call shows in the operator's log (urllib3 / kubernetes client / kopf wording)
API_ERROR = re.compile(
    r"Connection refused|NewConnectionError|MaxRetryError|Max retries|timed out|ReadTimeout|"
    r"\((?:500|503|504)\)|ServiceUnavailable|etcdserver",
)


@dataclass(frozen=True)
class Node:
    """Where a case's pods run: `process` (the process node; the image field is a placeholder there)
    or `real` (containers of `image`, the runtime by digest, on the real node)."""

    kind: str = "process"
    image: str = ""

    def spec(self, obj: dict[str, Any]) -> None:
        """Point a tiny_spec at the real node: the runtime image, its node, the resources of
        examples/modeldeployment-tiny.yaml (two processes importing torch need more than the
        process node's 1 GiB limit)."""
        if self.kind != "real":
            return
        spec = obj["spec"]
        spec["bundle"]["engine"]["image"] = self.image
        spec["topology"] = {"gpusPerReplica": 0, "nodeSelector": {"modeldeploy.dev/node-kind": "real"}}
        spec["resources"] = yaml.safe_load(EXAMPLE.read_text())["spec"]["resources"]
        spec["readiness"] = {"loadTimeoutSeconds": 300}


@dataclass
class Outcome:
    case: str
    expected: str
    node: str = "process"
    timeline: dict[str, float] = field(default_factory=dict)  # seconds from the bundle change
    phase: str = ""
    decision: str = ""
    reason: str = ""
    decisions: dict[str, int] = field(default_factory=dict)
    stable_failed: int = 0
    killed_pod_failed: int = 0
    lost_canary_failed: int = 0  # node-lost, node-partition: requests on the lost node's canary pods
    requests: int = 0
    notes: list[str] = field(default_factory=list)
    passed: bool = False


def namespace(cluster: E2ECluster, case: str) -> str:
    """A restricted namespace, as the e2e tests use (modeldeploy.dev/e2e: swept by `cluster down`)."""
    ns = f"chaos-{case}-{secrets.token_hex(3)}"
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "modeldeploy.dev/e2e": "true",
    }
    cluster.core.create_namespace({"metadata": {"name": ns, "labels": labels}})
    wait_until(
        lambda: (
            cluster.core.list_namespaced_service_account(ns, field_selector="metadata.name=default").items
        ),
        60,
        0.5,
        f"default ServiceAccount in {ns}",
    )
    return ns


class Clock:
    """Seconds since the bundle change, recorded once per named moment."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, what: str, at: float | None = None) -> None:
        self.marks.setdefault(what, round((at if at is not None else time.monotonic()) - self.t0, 1))


def phase_is(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m.get("status", {}).get("phase") in phases


def log_lines(op: OperatorProcess) -> int:
    return len(op.log.read_text(errors="replace").splitlines()) if op.log.exists() else 0


def first_api_error(op: OperatorProcess, after_line: int) -> bool:
    lines = op.log.read_text(errors="replace").splitlines()[after_line:] if op.log.exists() else []
    return any(API_ERROR.search(line) for line in lines)


def control_plane_fault(
    cluster: E2ECluster, op: OperatorProcess, clock: Clock, sup: faults.Supervisor, component: str
) -> None:
    """SIGKILL `component`, keep it down 10 s (the operator's reconciles and the analysis fail
    meanwhile), then let the supervisor start it again (and whatever exited meanwhile)."""
    assert cluster.local is not None
    before = log_lines(op)
    sup.held.set()
    clock.mark("fault", faults.kill_component(cluster.local, component))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if first_api_error(op, before):
            clock.mark("detected")  # the operator logged a failed API call
        time.sleep(0.2)
    sup.held.clear()
    wait_until(lambda: not faults.api_down(cluster), 180, 0.2, "the API server back")
    clock.mark("recovered")
    if first_api_error(op, before):
        clock.mark("detected")


def run_case(
    cluster: E2ECluster, case: str, work: Path, sup: faults.Supervisor, node: Node | None = None
) -> Outcome:
    node = node or Node()
    metrics = case.startswith("metrics") or case == "partition-prometheus"
    expected = "RolledBack" if case in ROLLBACK else "Promoted"
    out = Outcome(case, expected, node.kind)
    ns = namespace(cluster, case)
    op = OperatorProcess(cluster.kubeconfig, ns, work / f"operator-{case}.log")
    op.start()
    cut: faults.Partition | None = None  # the process a partition case cuts off, in its cgroup from its start
    if case == "partition-operator":
        assert op.proc is not None
        cut = faults.Partition(op.proc.pid)
    prom: Prom | None = None
    targets: PodTargets | None = None
    spare: faults.SpareNode | faults.RealSpareNode | None = None
    home = REAL_NODE if node.kind == "real" else cluster.process_node or "proc-0"
    try:
        analysis = dict(ANALYSIS)
        if metrics:
            targets = PodTargets(cluster, ns, NAME, work / f"targets-{case}.json").__enter__()
            (work / case).mkdir(parents=True, exist_ok=True)
            prom = Prom(work / case, {}, file_sd=targets.path)
            if case == "partition-prometheus":  # before its first scrape connection (no targets yet)
                cut = faults.Partition(prom.proc.pid)
            prom.wait_ready()
            analysis |= {
                "prometheus": {"address": prom.url},
                "onInconclusive": "Rollback" if case in ROLLBACK else "Hold",
            }
        elif case in ROLLBACK:  # partition-operator, node-lost-*: the operator's own scrape
            analysis["onInconclusive"] = "Rollback"
        real = node.kind == "real"
        if real:
            # the node cases' canary runs on the second real node, which shares this machine's disk
            on = (REAL_NODE, SPARE_REAL_NODE) if case.startswith("node-") else REAL_NODE
            digest = tiny_model_local_pv(cluster, ns, work / case, on)
        else:
            digest = tiny_model_pv(cluster, ns, work / case)
        pause = PARTITION_PAUSE_S if case == "node-partition" else 30
        obj = tiny_spec(NAME, digest, steps=[{"weight": 50, "pauseSeconds": pause}], analysis=analysis)
        obj["spec"]["replicas"] = 2
        node.spec(obj)
        if case.startswith("node-"):
            obj["spec"]["rollout"]["progressDeadlineSeconds"] = NODE_LOST_DEADLINE_S
        if case == "node-lost-replace":  # one of the two stable pods makes room for the canary's one
            obj["spec"]["rollout"] |= {"capacity": "Replace", "minAvailable": 1}
        create(cluster, ns, obj)
        ready_s = REAL_READY_S if real else 300
        md = wait_md(cluster, ns, NAME, stable_and_ready, ready_s, f"{NAME} Stable and Ready")
        old = md["status"]["stable"]["bundle"]
        stable_pods = pods_of(cluster, ns, old)
        if case.startswith("node-"):
            if real:
                assert cluster.local is not None
                spare = faults.RealSpareNode(cluster.local, cluster, SPARE_REAL_NODE)
                spare.start()
                spare.pull(node.image)  # before the change: the canary's first pull is not the case's
            else:
                spare = faults.SpareNode(cluster, work / "proc-1")
                spare.start()
            out.notes.append(f"spare node {spare.name}: bridge {spare.bridge}, pods on {spare.cidr}")
        # bounded in time and count; the count so that it never ends a case early: the node cases run
        # ~10 minutes at up to ~90 requests/s here (the default 50,000 stopped node-partition's load
        # before its replacements took any traffic, so its analysis had no canary sample)
        seconds, count = (900, 200_000) if spare is None else (1800, 400_000)
        with Load(cluster.api, ns, NAME, workers=3, max_requests=count, max_seconds=seconds) as load:
            time.sleep(3)  # both cohorts' load established before the change
            if spare is not None:
                faults.cordon(cluster, home)  # the canary's pods can go to the spare node only
            clock = Clock()
            change_bundle(cluster, ns, NAME, lambda b: b["config"].update(maxNumSeqs=6))
            wait_md(cluster, ns, NAME, phase_is("Canary"), ready_s + 120, "the canary in its analysed step")
            clock.mark("canary")
            killed: str | None = None
            lost: set[str] = set()
            if case in ("apiserver", "etcd"):
                control_plane_fault(
                    cluster, op, clock, sup, "kube-apiserver" if case == "apiserver" else "etcd"
                )
            elif cut is not None:
                partition(cluster, ns, clock, cut, 30.0 if prom is not None else 400.0, out)
            elif metrics:
                assert prom is not None
                hold = 30.0 if case == "metrics-hold" else 400.0
                with faults.Frozen(prom.proc.pid):
                    clock.mark("fault")
                    inconclusive_or_decided(cluster, ns, NAME, clock, hold, out)
                clock.mark("recovered")
            elif spare is not None:
                lost = node_lost(cluster, ns, clock, spare, home, out, pods_too=case != "node-partition")
            else:
                now_stable = wait_until(  # the step scales stable down (Replace): wait until it has
                    lambda: settled(cluster, ns, old), 120, 0.5, "the stable cohort at its step's size"
                )
                killed = sorted(now_stable)[0]
                ip = now_stable[killed]
                stable_pods |= now_stable
                faults.kill_pod_process(cluster, ns, killed)
                clock.mark("fault")
                wait_until(lambda: restarted(cluster, ns, killed), 120, 0.2, f"{killed} restarted")
                clock.mark("detected")  # the node saw the container die and restarted it
                wait_until(lambda: ready(cluster, ns, killed), 180, 0.5, f"{killed} Ready again")
                clock.mark("recovered")
                gone = "" if _pod(cluster, ns, killed) else " (retired by the promotion before Ready again)"
                out.notes.append(f"killed stable pod {killed} ({ip}){gone}")
            wait = 600 if spare is None else 30  # node-lost: node_lost() waited for the decision
            done = wait_md(cluster, ns, NAME, phase_is("Stable"), wait, "the rollout decided")
            clock.mark("decided")
            if case == "node-lost-replace":  # the rollback grows stable back: its new pod is stable too
                assert spare is not None
                back = stable_restored(cluster, ns, old, spare.name, clock, out)
                out.notes.append(f"stable back to 2 Ready pods at {clock.marks['stable restored']} s: {back}")
                stable_pods |= back
                time.sleep(5)  # the restored pod in the endpoints and under load
        out.notes.append(f"work dir (operator log, Prometheus data): {work}")
        out.timeline = clock.marks
        judge(out, cluster, ns, done, old, stable_pods, killed, load, lost)
        tracebacks = op.log.read_text(errors="replace").count("Traceback") if op.log.exists() else 0
        out.notes.append(f"operator log: {tracebacks} traceback(s)")
        out.notes += [
            f"supervisor restarted {', '.join(cs)} at {t - clock.t0:.1f} s"
            for t, cs in sup.restarts
            if t > clock.t0
        ]
        return out
    finally:
        if cut is not None:
            cut.close()
        op.stop()
        if spare is not None:
            try:
                faults.cordon(cluster, home, False)
            finally:
                spare.remove()  # its pods stay Terminating on a dead node until force-deleted
        if prom is not None:
            prom.stop()
        if targets is not None:
            targets.__exit__()
        cluster.kubectl("delete", "ns", ns, "--wait=false", check=False, timeout=60)
        cluster.kubectl("delete", "pv", f"{ns}-models", "--wait=false", check=False, timeout=60)


def partition(
    cluster: E2ECluster, ns: str, clock: Clock, cut: faults.Partition, hold: float, out: Outcome
) -> None:
    """Cut the process's path to the canary pods for `hold` seconds or until the rollout decides
    (faults.Partition); the load, from another process, still reaches them."""
    canary = get_md(cluster, ns, NAME)["status"]["canary"]["bundle"]
    ips = wait_until(lambda: pods_of(cluster, ns, canary), 120, 0.5, "the canary pods running")
    out.notes.append(f"cut off from process {cut.pid}: canary pods {ips}")
    clock.mark("fault", cut.cut(ips.values()))
    try:
        inconclusive_or_decided(cluster, ns, NAME, clock, hold, out)
    finally:
        cut.heal()
    clock.mark("recovered")


def node_lost(
    cluster: E2ECluster,
    ns: str,
    clock: Clock,
    spare: faults.SpareNode | faults.RealSpareNode,
    home: str,
    out: Outcome,
    pods_too: bool = True,
) -> set[str]:
    """The spare node, holding every canary pod, loses power (`pods_too`; else only its agent dies
    and the pods keep serving); watch until the rollout decides and return the lost pods' IPs.
    Marks: fault; detected (the operator's first analysis after the fault without canary figures);
    node NotReady, pods unready, evicted (the node and taint-eviction controllers); recovered (a
    replacement canary pod Ready on another node)."""
    canary = get_md(cluster, ns, NAME)["status"]["canary"]["bundle"]
    placed = wait_until(lambda: canary_placed(cluster, ns, canary), 120, 0.5, "every canary pod bound")
    off = sorted(n for n, node in placed.items() if node != spare.name)
    if off:
        raise AssertionError(f"canary pods {off} not on {spare.name} (home node {home} was cordoned)")
    ips = pods_of(cluster, ns, canary)
    lost_pods = {p: ips.get(p, "") for p in placed}  # "": bound, not started yet
    before = (get_md(cluster, ns, NAME)["status"].get("lastAnalysis") or {}).get("time")
    clock.mark("fault", spare.lose(pods=pods_too))
    faults.cordon(cluster, home, False)  # the healthy node takes the replacements
    out.notes.append(f"lost with {spare.name}: canary pods {lost_pods}")
    deadline = time.monotonic() + NODE_LOST_WAIT_S
    while time.monotonic() < deadline:
        st = get_md(cluster, ns, NAME).get("status", {})
        la = st.get("lastAnalysis") or {}
        if la.get("time") != before and la.get("verdict") == "Inconclusive" and "detected" not in clock.marks:
            if "unreachable" in (la.get("message") or "") or "pods unready" in clock.marks:
                clock.mark("detected")
                out.notes.append(
                    f"operator's first analysis after the fault: Inconclusive, {la.get('message')!r}"
                )
        if not spare.ready():
            clock.mark("node NotReady")
        pods = {p.metadata.name: p for p in canary_pods(cluster, ns, canary)}
        gone = [pods.get(n) for n in lost_pods]
        if all(p is None or not pod_is_ready(p) for p in gone):
            clock.mark("pods unready")
        if "evicted" not in clock.marks and any(p is None or p.metadata.deletion_timestamp for p in gone):
            clock.mark("evicted")
            ro = st.get("rollout") or {}
            out.notes.append(
                f"status while held (at the eviction): phase {st.get('phase')}, reason {ro.get('reason')}, "
                f"lastAnalysis {la.get('verdict')}: {la.get('message')!r}"
            )
        fresh = [p for n, p in pods.items() if n not in lost_pods and pod_is_ready(p)]
        if fresh and "recovered" not in clock.marks:
            clock.mark("recovered")
            out.notes.append(f"replacement canary pods Ready on {sorted({p.spec.node_name for p in fresh})}")
        if st.get("phase") == "RollingBack":  # decided; Replace's StableFirst restore may hold it there
            clock.mark("rolling back")
        operator_deleted(cluster, ns, clock, out)
        if st.get("phase") == "Stable":
            break
        time.sleep(1)
    marks = ", ".join(
        f"{k} {clock.marks[k]} s" for k in ("node NotReady", "pods unready", "evicted") if k in clock.marks
    )
    out.notes.append(f"node and pods as the controllers saw them: {marks or 'no change seen'}")
    return {ip for ip in lost_pods.values() if ip}


def canary_pods(cluster: E2ECluster, ns: str, bundle: str) -> list[Any]:
    return cluster.core.list_namespaced_pod(ns, label_selector=f"{BUNDLE}={bundle}").items


def canary_placed(cluster: E2ECluster, ns: str, bundle: str) -> dict[str, str] | None:
    """Canary pod name -> node, once the canary Deployment's pods all exist and are bound."""
    deps = cluster.apps.list_namespaced_deployment(ns, label_selector=f"{BUNDLE}={bundle}").items
    want = sum(d.spec.replicas or 0 for d in deps)
    pods = [p for p in canary_pods(cluster, ns, bundle) if p.metadata.deletion_timestamp is None]
    bound = {p.metadata.name: p.spec.node_name for p in pods if p.spec.node_name}
    return bound if want and len(bound) == len(pods) == want else None


def pod_is_ready(p: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])


def judge(
    out: Outcome,
    cluster: E2ECluster,
    ns: str,
    done: dict[str, Any],
    old: str,
    stable_pods: dict[str, str],
    killed: str | None,
    load: Load,
    lost: set[str] | None = None,
) -> None:
    """The case's verdict: the policy's decision, each decision posted once, no failed stable request
    (the killed pod's own failures, and the lost node's canary pods', counted apart)."""
    st = done["status"]
    la = st.get("lastAnalysis") or {}
    out.notes.append(
        f"last analysis {la.get('verdict')}: "
        + "; ".join(
            f"{m.get('metric')} {m.get('verdict')} (canary {m.get('canary')}, stable {m.get('stable')}, "
            f"samples {m.get('samples')})"
            for m in la.get("metrics") or []
        )
    )
    out.phase = st["phase"]
    promoted = st["stable"]["bundle"] != old
    out.decision = "Promoted" if promoted else ("RolledBack" if st.get("failedBundles") else "none")
    out.reason = (st.get("rollout") or {}).get("reason", "")
    reasons = Counter(r for r, _ in events(cluster, ns, NAME))
    out.decisions = {r: reasons[r] for r in ("NewBundle", "CanaryReady", "ConformancePassed", out.decision)}
    killed_ip = stable_pods.get(killed or "")
    by_ip = load.by_ip()

    def failed(ips: set[str]) -> int:
        return sum(n for ip in ips for code, n in by_ip.get(ip, Counter()).items() if code != 200)

    out.requests = sum(sum(c.values()) for c in by_ip.values())
    if out.requests >= load.max_requests:
        out.notes.append(f"the load reached its bound of {load.max_requests} requests before the case ended")
    out.stable_failed = failed(set(stable_pods.values()) - {killed_ip or ""})
    out.killed_pod_failed = failed({killed_ip}) if killed_ip else 0
    out.lost_canary_failed = failed(lost or set())
    if load.api_errors:
        out.notes.append(f"load's EndpointSlice reads failed {sum(load.api_errors.values())}x (API down)")
    once = all(n == 1 for n in out.decisions.values())
    out.passed = out.decision == out.expected and out.phase == "Stable" and once and out.stable_failed == 0
    if out.case in ROLLBACK:
        out.passed = out.passed and out.reason == "AnalysisInconclusive"
    if out.case == "node-lost-replace":
        out.passed = out.passed and "stable restored" in out.timeline


def inconclusive_or_decided(
    cluster: E2ECluster, ns: str, name: str, clock: Clock, hold: float, out: Outcome
) -> None:
    """While the metrics are cut off: note every analysis the operator posts (its verdict and
    message, in `out.notes`), mark `detected` at the first Inconclusive one made after the fault (or
    a rollback naming Inconclusive); return after `hold` seconds or once the rollout decided."""
    seen = {(get_md(cluster, ns, name).get("status", {}).get("lastAnalysis") or {}).get("time")}
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        st = get_md(cluster, ns, name).get("status", {})
        la = st.get("lastAnalysis") or {}
        if la.get("time") not in seen:
            seen.add(la.get("time"))
            at, msg = time.monotonic() - clock.t0, (la.get("message") or "")[:240]
            out.notes.append(f"analysis at {at:.1f} s: {la.get('verdict')}: {msg!r}")
            if la.get("verdict") == "Inconclusive":
                clock.mark("detected")
        if any("Inconclusive" in m for r, m in events(cluster, ns, name) if r == "RolledBack"):
            clock.mark("detected")
        if st.get("phase") == "Stable":
            return
        time.sleep(0.5)


def pods_of(cluster: E2ECluster, ns: str, bundle: str) -> dict[str, str]:
    """The bundle's running pods (not terminating: a step may be scaling stable down) by name -> IP."""
    pods = cluster.core.list_namespaced_pod(ns, label_selector=f"modeldeploy.dev/bundle={bundle}").items
    return {
        p.metadata.name: p.status.pod_ip
        for p in pods
        if p.status.pod_ip and p.metadata.deletion_timestamp is None and p.status.phase == "Running"
    }


def stable_restored(
    cluster: E2ECluster, ns: str, old: str, lost: str, clock: Clock, out: Outcome
) -> dict[str, str]:
    """Wait (up to NODE_LOST_WAIT_S) until the rolled-back stable has its 2 Ready pods again and mark
    `stable restored`. Until the node controller's grace period ends the lost node is Ready in the
    API, so the scheduler may bind the rollback's new pod there: it then waits for the node to go
    NotReady and for the taint-eviction controller, as the lost canary pods do. Noted when it happens."""
    deadline, seen = time.monotonic() + NODE_LOST_WAIT_S, False
    while time.monotonic() < deadline:
        pods = cluster.core.list_namespaced_pod(ns, label_selector=f"{BUNDLE}={old}").items
        if not seen and any(p.spec.node_name == lost for p in pods):
            seen = True
            clock.mark("stable pod bound to the lost node")
            out.notes.append(
                f"the rollback's new stable pod was bound to the lost node {lost} (seen at "
                f"{clock.marks['stable pod bound to the lost node']} s; bound while the node was "
                "still Ready in the API)"
            )
        operator_deleted(cluster, ns, clock, out)
        if back := ready_pods_of(cluster, ns, old, 2):
            clock.mark("stable restored")
            return back
        time.sleep(1)
    raise TimeoutError(f"stable {old} not back to 2 Ready pods within {NODE_LOST_WAIT_S} s")


def operator_deleted(cluster: E2ECluster, ns: str, clock: Clock, out: Outcome) -> None:
    """Mark `operator deleted a pod` at the operator's first PodOnLostNode Event (it deletes a pod
    stuck on a node marked lost that it waits on or that never started there); note each message."""
    msgs = [m for r, m in events(cluster, ns, NAME) if r == "PodOnLostNode"]
    seen = sum(1 for n in out.notes if n.startswith("PodOnLostNode: "))
    if msgs and "operator deleted a pod" not in clock.marks:
        clock.mark("operator deleted a pod")
    for m in msgs[seen:]:
        out.notes.append(f"PodOnLostNode: {m} (seen at {round(time.monotonic() - clock.t0, 1)} s)")


def ready_pods_of(cluster: E2ECluster, ns: str, bundle: str, want: int) -> dict[str, str] | None:
    """The bundle's pods by name -> IP once `want` of them are Ready and none is terminating."""
    pods = cluster.core.list_namespaced_pod(ns, label_selector=f"{BUNDLE}={bundle}").items
    live = [p for p in pods if p.metadata.deletion_timestamp is None and p.spec.node_name]
    ok = {p.metadata.name: p.status.pod_ip for p in live if pod_is_ready(p) and p.status.pod_ip}
    return ok if len(ok) == want else None


def settled(cluster: E2ECluster, ns: str, bundle: str) -> dict[str, str] | None:
    """The stable bundle's pods once their count is what status.stable.replicas asks."""
    want = (get_md(cluster, ns, NAME).get("status", {}).get("stable") or {}).get("replicas")
    pods = pods_of(cluster, ns, bundle)
    return pods if want and len(pods) == want else None


def _pod(cluster: E2ECluster, ns: str, pod: str) -> Any:
    """The pod, or None once it is deleted (the rollout may promote and retire stable meanwhile)."""
    try:
        return cluster.core.read_namespaced_pod(pod, ns)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def restarted(cluster: E2ECluster, ns: str, pod: str) -> bool:
    p = _pod(cluster, ns, pod)
    cs = (p.status.container_statuses or []) if p else []
    return p is None or (bool(cs) and cs[0].restart_count > 0)


def ready(cluster: E2ECluster, ns: str, pod: str) -> bool:
    p = _pod(cluster, ns, pod)
    return p is None or any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])


def table(outcomes: list[Outcome]) -> str:
    rows = [
        "| case | fault | detected | recovered | decided | decision (reason) | decisions posted | "
        "stable requests failed | final phase | pass |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        t = o.timeline
        case = o.case if o.node == "process" else f"{o.case} ({o.node} node)"
        posted = ", ".join(f"{r} {n}" for r, n in o.decisions.items())
        failed = f"{o.stable_failed} of {o.requests}"
        if o.case == "stable-pod":
            failed += f" (+{o.killed_pod_failed} on the killed pod)"
        if o.case.startswith("node-"):
            failed += f" (+{o.lost_canary_failed} on the lost canary pods)"
        rows.append(
            f"| {case} | {t.get('fault', '-')} | {t.get('detected', '-')} | {t.get('recovered', '-')} | "
            f"{t.get('decided', '-')} | {o.decision} ({o.reason or '-'}) | {posted} | {failed} | {o.phase} | "
            f"{'yes' if o.passed else 'NO'} |"
        )
    return "\n".join(rows)


def cluster_for(kind: str) -> tuple[LocalCluster, Node]:
    """The local cluster a run uses (as `up` recorded it when it runs) and a Node without its image."""
    if kind == "real":
        s = real_node_settings()
        existing = LocalCluster.existing(s.name)
        return (existing if existing.s.real_node else LocalCluster(s)), Node("real")
    return LocalCluster.existing(), Node()


def real_node(local: LocalCluster) -> Node:
    """The runtime image built and pushed to the real node's registry (Docker's layer cache makes a
    rebuild cheap); a Docker engine is started for the build when none answers."""
    with images.docker_engine() as why:
        if why:
            raise SystemExit(f"--node real: cannot build the runtime image: {why}")
        return Node("real", images.build_runtime_or_operator(local.registry().host, "runtime"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument(
        "--node",
        choices=("process", "real"),
        default="process",
        help="process: pods as processes on the process node; real: containers on the real node "
        "(kubelet + containerd), the runtime image built here (default: %(default)s)",
    )
    p.add_argument("--out", type=Path, default=None, help="write every outcome as JSON here")
    a = p.parse_args(argv)
    cases = [c for c in a.cases.split(",") if c]
    if bad := sorted(set(cases) - set(CASES)):
        p.error(f"--cases: unknown {', '.join(bad)} (known: {', '.join(CASES)})")
    if any(c.startswith("metrics") or c == "partition-prometheus" for c in cases) and not PROMETHEUS.exists():
        p.error(f"--cases: the metrics cases need {PROMETHEUS} (make cluster-build)")
    local, node = cluster_for(a.node)
    was_running = (
        local.cluster_running()
        and (local.real_node().pid("kubelet") if a.node == "real" else local.procnode_pid()) is not None
    )
    local.build()
    local.up()
    cluster = E2ECluster(str(local.kubeconfig), local)
    outcomes: list[Outcome] = []
    try:
        if a.node == "real":
            node = real_node(local)
        apply_crd(client.ApiextensionsV1Api(cluster.api))
        with faults.Supervisor(cluster) as sup:
            for case in cases:
                t = time.monotonic()
                try:
                    o = run_case(cluster, case, Path(tempfile.mkdtemp(prefix=f"chaos-{case}-")), sup, node)
                except Exception as e:  # noqa: BLE001 - a case that errs is a failed case, the rest still run
                    ours = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == __file__]
                    o = Outcome(
                        case, "?", node.kind, notes=[f"{type(e).__name__} at chaos.py:{ours[-1:]}: {e}"[:600]]
                    )
                    sup.held.clear()  # a case that died mid-fault: the next one needs the control plane
                o.notes.append(f"case wall time {time.monotonic() - t:.0f} s")
                print(f"[chaos] {case}: {'pass' if o.passed else 'FAIL'} {asdict(o)}", flush=True)
                outcomes.append(o)
    finally:
        if not was_running:
            local.down()
    print(table(outcomes))
    for o in outcomes:
        for n in o.notes:
            print(f"- {o.case}: {n}")
    if a.out:
        a.out.write_text(json.dumps([asdict(o) for o in outcomes], indent=1) + "\n")
    return 0 if outcomes and all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
