"""Read the world for one reconcile: children, nodes, load progress and the rollout's inputs -> `Observed`.

The Deployments, Services and NetworkPolicies come from the Controller's watch-fed store when it knows them
complete (store.py says why that is as good as a LIST), else from a fresh LIST that refills it;
pods, routes and nodes are always read fresh. Everything that talks to pods is bounded:
MAX_PROBES load probes of PROBE_TIMEOUT_S each per reconcile, one conformance run per
(object, canary) in the background, one analysis per interval.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import httpx
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from modeldeploy.operator.analysis.gate import ConformanceRunner
from modeldeploy.operator.analysis.pods import pod_ready, pod_url, ready_pod_ips
from modeldeploy.operator.analysis.quality import (
    Cohort,
    EvalSetError,
    QualityRunner,
    refused,
    resolve,
    run_quality,
)
from modeldeploy.operator.analysis.scrape import Baselines
from modeldeploy.operator.analysis.sources import analyze_interval, source_for
from modeldeploy.operator.analysis.window import AnalysisWindow
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.status import AnalysisResult, QualityResult
from modeldeploy.operator.controller import metrics
from modeldeploy.operator.controller.claims import (
    Claim,
    ObjectKey,
    PodCounts,
    claim_pending,
    claimed,
    counted,
)
from modeldeploy.operator.controller.gatekey import GateKey
from modeldeploy.operator.controller.kube import Kube
from modeldeploy.operator.controller.pull import crash_failure, pull_failure
from modeldeploy.operator.controller.store import Store
from modeldeploy.operator.rollout import commands
from modeldeploy.operator.rollout.actions import LostPod, Observed
from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, INSTANCE_LABEL, MANAGED_BY
from modeldeploy.operator.rollout.machine import UNDER_TEST, quality_stage
from modeldeploy.operator.rollout.network import KIND as POLICY_KIND
from modeldeploy.operator.rollout.prefetch import HOLD_LABEL, PREFETCH_LABEL
from modeldeploy.operator.rollout.prefetch import error_key as prefetch_error_key
from modeldeploy.operator.rollout.prefetch import waiting as prefetch_waiting
from modeldeploy.operator.rollout.progression import epoch, iso, policy
from modeldeploy.operator.rollout.topology import NodeInfo, Nodes, gpu_requests, lost_nodes

log = logging.getLogger("modeldeploy.operator")

# How old the node list a pass plans on may be. What a pass reads of it is mostly what nodes are (labels,
# allocatable GPUs, taints), which rarely changes, while relisting thousands of nodes and every bound
# pod often costs more of the operator's run time than its reconciles.
# A capacity decision reads a list begun after its pass began, whatever the age (`get(since=...)`),
# and a "no node can ever fit" verdict one at most UNFIT_TTL_S old: a node just added counts soon.
NODE_TTL_S = 60.0
# How old a single node's read may be when one of our pods sits there not Ready: the lost-node check
# (plan_lost_pods) reads those nodes, not the list, so a node marked lost counts within seconds
NODE_READ_TTL_S = 10.0
MAX_NODE_READS = 32  # single-node GETs per pass at most (a rollout loading pods on hundreds of nodes)
UNFIT_TTL_S = 15.0
MAX_PROBES = 8
PROBE_TIMEOUT_S = 0.5
UNREACHABLE_S = 60.0
MAX_UNREACHABLE = 10_000  # remembered unroutable pods, all objects together
CHILD_KINDS = ("Deployment", "Service", POLICY_KIND)  # listed together, or read from the store
OPERATOR_NAMESPACE_ENV = "MODELDEPLOY_OPERATOR_NAMESPACE"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def operator_namespace(env: Mapping[str, str] = os.environ, sa_file: str = SA_NAMESPACE_FILE) -> str | None:
    """The namespace the operator runs in: $MODELDEPLOY_OPERATOR_NAMESPACE, else the one its in-cluster
    ServiceAccount token was issued for (the file every pod with a mounted token has, the same the
    kubernetes clients read); None outside a cluster (a process on a host reaches pods from the node)."""
    if ns := env.get(OPERATOR_NAMESPACE_ENV, "").strip():
        return ns
    try:
        with open(sa_file) as f:
            return f.read().strip() or None
    except OSError:
        return None


class NodeCache:
    """All nodes, relisted every `ttl_s` (no node watch: kwok heartbeats would flood it).

    Stale-while-revalidate: one thread relists, the others keep using the previous list
    instead of queueing behind a slow LIST of a thousand nodes. The GPUs requested on each node
    come with the list, so they can be up to `ttl_s` old: a capacity decision asks for a list
    begun after its reconcile began (`get(since=...)`, see Controller._reconcile); decisions
    waiting together share one relist, and read it with the other objects' claims on it (claims.py).
    """

    def __init__(self, kube: Kube, ttl_s: float = NODE_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.kube, self.ttl_s, self.clock = kube, ttl_s, clock
        self._lock = threading.Lock()
        self._at = 0.0  # when the current list was begun (clock)
        self._nodes: list[NodeInfo] = []
        self._listed = False  # until the first relist, every caller waits for one
        self._seen: PodCounts = Counter()  # pods per (namespace, bundle) the current list counted
        self._claims: dict[ObjectKey, Claim] = {}

    def _fresh(self, since: float | None) -> bool:
        if not self._listed:
            return False
        return self._at >= since if since is not None else self.clock() - self._at <= self.ttl_s

    def get(self, since: float | None = None) -> list[NodeInfo]:
        """The node list; with `since` (clock time) one begun at or after then, waiting for a relist if
        need be (a decision that reads the spare GPUs now), instead of the cached one."""
        if self._fresh(since) or not self._lock.acquire(blocking=not self._listed or since is not None):
            return self._nodes
        try:
            if not self._fresh(since):
                begun = self.clock()
                seen: PodCounts = Counter()
                used = gpu_requests(counted(self.kube.list_bound_pods(), seen))  # spare GPUs for Auto
                unbound = list(counted(self.kube.list_unbound_pods(), seen))  # Pending ones only: few
                nodes = Nodes(
                    NodeInfo.from_node(n, used.get(n["metadata"]["name"], 0)) for n in self.kube.list_nodes()
                )
                self._nodes, self._seen, self._listed = claim_pending(nodes, unbound), seen, True
                self._at = begun
            return self._nodes
        finally:
            self._lock.release()

    def for_decision(self, key: ObjectKey, since: float) -> list[NodeInfo]:
        """A list begun at or after `since` with every other object's claim placed on it."""
        nodes = self.get(since)
        others = [c for k, c in list(self._claims.items()) if k != key]
        return claimed(nodes, others, self._seen)

    def claim(self, key: ObjectKey, claim: Claim | None) -> None:
        """Record (None: drop) what this object's last plan wants, for the decisions of the others."""
        if claim is None or not claim.wants:
            self._claims.pop(key, None)
        else:
            self._claims[key] = claim

    def claims(self, key: ObjectKey) -> bool:
        return key in self._claims


class NodeReads:
    """Fresh single-node reads for the nodes our not-Ready pods sit on. The node list is up to
    NODE_TTL_S old, which would delay the operator's reaction to a lost node (plan_lost_pods) by up to
    a minute; these few GETs, each kept NODE_READ_TTL_S, see the node controller's taint in seconds.
    A node that cannot be read is not called lost; past MAX_NODE_READS a pass reads no more (the rest
    wait for the next pass or the list)."""

    def __init__(
        self, kube: Kube, ttl_s: float = NODE_READ_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kube, self.ttl_s, self.clock = kube, ttl_s, clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, bool]] = {}  # node -> (read at, lost)

    def lost(self, names: set[str]) -> frozenset[str]:
        now, out, reads = self.clock(), set(), 0
        for name in sorted(names):
            with self._lock:
                at, lost = self._seen.get(name, (None, False))
            if at is None or now - at > self.ttl_s:
                if reads >= MAX_NODE_READS:
                    continue
                reads += 1
                try:
                    node = self.kube.get_node(name)
                except (ApiException, OSError, ValueError) as e:
                    log.warning("node %s: cannot read it for the lost-node check: %s", name, e)
                    continue
                lost = node is not None and bool(lost_nodes([NodeInfo.from_node(node)]))
                with self._lock:
                    self._seen[name] = (now, lost)
                    for old in [n for n, (t, _) in self._seen.items() if now - t > 10 * self.ttl_s]:
                        del self._seen[old]
            if lost:
                out.add(name)
        return frozenset(out)


class LoadProbe:
    """Load progress and load errors of Running-but-not-Ready pods, from their /health/ready,
    and the image pull failures of Pending ones (pull.py), which never get to load.

    The runtime answers 503 with {"status": "failed", "error": ...} when loading failed
    (e.g. a digest mismatch); that error is what status should show, not "0/1 ready".
    A pod not routable from the operator is not asked again for UNREACHABLE_S.
    """

    def __init__(self, port: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.port, self.clock = port, clock
        self._lock = threading.Lock()
        self._unreachable: dict[tuple[str, str], dict[str, float]] = {}  # object -> pod uid -> when

    def probe(
        self, key: tuple[str, str], pods: list[dict[str, Any]]
    ) -> tuple[dict[str, list[float]], dict[str, str]]:
        """(bundle -> progress per loading pod, bundle -> load error); an unreachable pod counts as 0."""
        out: dict[str, list[float]] = {}
        errors: dict[str, str] = {}
        crashes: dict[str, str] = {}
        with self._lock:
            if sum(len(v) for v in self._unreachable.values()) > MAX_UNREACHABLE:
                self._unreachable.clear()
            skip = dict(self._unreachable.get(key, {}))
        probed = 0
        with httpx.Client(timeout=PROBE_TIMEOUT_S) as http:
            for p in pods:
                st = p.get("status") or {}
                if not pod_ready(p) and (pulled := pull_failure(p)) is not None:  # Pending: never loads
                    errors.setdefault(_error_key(p), pulled)
                    continue
                if not pod_ready(p) and (crashed := crash_failure(p)) is not None:  # restarted after a crash
                    crashes.setdefault(_error_key(p), crashed)
                labels = p["metadata"].get("labels") or {}
                if (
                    PREFETCH_LABEL in labels  # pulls images, serves nothing
                    or HOLD_LABEL in labels  # keeps the rollback target's images in use, serves nothing
                    or pod_ready(p)
                    or st.get("phase") != "Running"
                    or not st.get("podIP")
                    or probed >= MAX_PROBES
                ):
                    continue
                uid, bundle = (
                    p["metadata"].get("uid", ""),
                    p["metadata"].get("labels", {}).get(BUNDLE_LABEL, ""),
                )
                progress = 0.0
                if self.clock() - skip.get(uid, -UNREACHABLE_S) >= UNREACHABLE_S:
                    probed += 1
                    progress = self._ask(http, key, uid, st["podIP"], bundle, errors)
                out.setdefault(bundle, []).append(progress)
        return out, crashes | errors  # the runtime's own words win over kubelet's exit code

    def _ask(
        self, http: httpx.Client, key: tuple[str, str], uid: str, ip: str, bundle: str, errors: dict
    ) -> float:
        try:
            body = http.get(f"http://{ip}:{self.port}/health/ready").json()
            progress = float(body.get("progress", 0.0))
            if body.get("status") == "failed" and body.get("error"):
                errors.setdefault(bundle, str(body["error"])[:800])
            return progress
        except httpx.TransportError:
            with self._lock:  # not routable from here: don't wait on it every time
                self._unreachable.setdefault(key, {})[uid] = self.clock()
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        return 0.0

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._unreachable.pop(key, None)

    def holds(self, key: tuple[str, str]) -> bool:
        with self._lock:
            return key in self._unreachable


class Observer:
    """Reads one ModelDeployment's world into `Observed`, using the Controller's caches and runners."""

    def __init__(
        self,
        kube: Kube,
        nodes: NodeCache,
        probe: LoadProbe,
        gate: ConformanceRunner,
        baselines: Baselines,
        together: Callable[[Callable[[str], Any], list[str]], Any] = map,
        store: Store | None = None,
        quality: QualityRunner | None = None,
    ) -> None:
        self.kube, self.nodes, self.probe, self.gate, self.baselines = kube, nodes, probe, gate, baselines
        self.quality = quality or QualityRunner()
        self.together = together  # a pool's map: the children's LISTs in one round trip's time
        self.store = store
        self.operator_namespace = operator_namespace()  # the NetworkPolicy admits it to /metrics
        self.node_reads = NodeReads(kube)
        self.gate_key = GateKey.from_env()  # how the gates ask keyed pods (gatekey.py); None: cannot

    def observe(self, md: dict[str, Any], fresh: bool = True) -> Observed:
        """`fresh`: LIST the children even when the store knows them."""
        meta = md["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        sel = f"{INSTANCE_LABEL}={name},app.kubernetes.io/managed-by={MANAGED_BY}"
        kept = None if fresh or self.store is None else self._kept(uid, name)
        if kept is not None:
            deps, svcs, policies = kept
        else:
            deps, svcs, policies = (
                [o for o in listed if _owned(o, uid)]
                for listed in self.together(lambda kind: self.kube.list(kind, ns, sel), list(CHILD_KINDS))
            )
            if self.store is not None:
                self.store.replace(uid, ns, dict(zip(CHILD_KINDS, (deps, svcs, policies), strict=True)))
        loading, errors, pulling, pods = {}, {}, {}, []
        if any(_not_ready(d) for d in deps):
            pods = self.kube.list("Pod", ns, sel)
            loading, errors = self.probe.probe((ns, name), pods)
            pulling = prefetch_waiting(pods)  # what pre-pull pods wait on (status.rollout.prefetchWaiting)
        nodes = self.nodes.get()
        obs = Observed(deps, svcs, nodes, loading, errors, prefetch_waiting=pulling)
        if pods and nodes is not None:
            lost = lost_nodes(nodes)
            lost |= self.node_reads.lost(suspect_nodes(pods) - lost)  # the list may be a minute old
            obs.lost_pods = lost_pods(pods, lost)
        obs.policies, obs.operator_namespace = policies, self.operator_namespace
        if self.gate_key is not None:
            obs.gate_key_sha256 = self.gate_key.digest(ns, name, uid)
        self._rollout(md, sel, obs)
        return obs

    def _kept(self, uid: str, name: str) -> tuple[list[dict[str, Any]], ...] | None:
        assert self.store is not None
        kept = [self.store.children(kind, uid, name) for kind in CHILD_KINDS]
        return None if any(k is None for k in kept) else tuple(k or [] for k in kept)

    def _rollout(self, md: dict[str, Any], sel: str, obs: Observed) -> None:
        """The rollout machine's inputs: manual command, conformance gate result, canary analysis, routes."""
        meta, st = md["metadata"], md.get("status") or {}
        obs.command = commands.command_from_annotations(meta.get("annotations"))
        obs.command_annotations = commands.pending(meta.get("annotations"))
        last = st.get("lastAnalysis")
        if last:
            obs.analysis, obs.analysis_at = AnalysisResult.model_validate(last), epoch(last.get("time"))
        try:
            spec = ModelDeploymentSpec.model_validate(md.get("spec") or {})
        except ValidationError:
            return
        ns = meta["namespace"]
        obs.routes = self.kube.list_routes(ns, sel) if spec.rollout.traffic_routing.gateway_api else []
        phase, canary = st.get("phase"), (st.get("canary") or {}).get("bundle")
        if phase not in UNDER_TEST or not canary:
            return
        pods = self.kube.list("Pod", ns, sel)

        def ips(bundle: str | None) -> tuple[str, ...]:
            return tuple(
                ready_pod_ips(
                    [p for p in pods if (p["metadata"].get("labels") or {}).get(BUNDLE_LABEL) == bundle]
                )
            )

        if phase == "Verifying":
            reason = (st.get("rollout") or {}).get("reason", "")
            if quality_stage(policy(spec), reason):
                stable = (st.get("stable") or {}).get("bundle")
                obs.quality = self._quality(meta, spec, canary, stable, ips(canary), ips(stable))
            elif (canary_ips := ips(canary)) and spec.rollout.conformance_gate:
                obs.conformance = self.gate.ensure(
                    (meta["uid"], canary),
                    pod_url(canary_ips[0]),
                    api_key=self._token(meta, spec),
                    structured_output=spec.bundle.config.structured_output,
                )
            return
        cfg, step = spec.rollout.analysis, st.get("currentStep")
        stable = (st.get("stable") or {}).get("bundle")
        if cfg.quality is not None and cfg.quality.enabled and cfg.quality.at_each_step and step is not None:
            obs.quality = self._quality(meta, spec, canary, stable, ips(canary), ips(stable), step)
        now = time.time()
        last, at = obs.analysis, obs.analysis_at
        if last is not None and last.step == step and at is not None and now - at < cfg.interval_seconds:
            return  # this step's last interval is recent enough
        since = (st.get("rollout") or {}).get("phaseSince")
        if not stable:
            return  # no stable cohort to compare the canary with
        cohorts = AnalysisWindow(
            meta["uid"], ns, stable, canary, ips(stable), ips(canary), (canary, step, since), epoch(since)
        )
        stamp = iso(now)
        result, problems = analyze_interval(
            source_for(cfg, self.baselines), cohorts, cfg, step=step, time=stamp
        )
        if problems:  # shown in status.lastAnalysis: why an interval is Inconclusive, not only in a log
            result = result.model_copy(update={"message": problems[:1024]})
        obs.analysis, obs.analysis_at, obs.analysis_fresh = result, epoch(stamp), True
        metrics.DECISIONS.labels("analysis", result.verdict).inc()

    def _token(self, meta: dict[str, Any], spec: ModelDeploymentSpec) -> str | None:
        """The bearer token the gates send: this ModelDeployment's gate token where its pods need a key
        (None otherwise, or when the operator has no gate key: plan() refuses that spec then)."""
        if spec.bundle.config.api_key_secret_ref is None or self.gate_key is None:
            return None
        return self.gate_key.token(meta["namespace"], meta["name"], meta["uid"])

    def _quality(
        self,
        meta: dict[str, Any],
        spec: ModelDeploymentSpec,
        canary: str,
        stable: str | None,
        canary_ips: tuple[str, ...],
        stable_ips: tuple[str, ...],
        step: int | None = None,
    ) -> QualityResult | None:
        """The quality gate's verdict on this canary at Verifying (`step` None) or at a canary step (None
        while it runs or before both cohorts have a Ready pod). The eval set is resolved once, when the
        run starts: a referenced ConfigMap is read then and refused unless its items match its digest."""
        q = spec.rollout.analysis.quality
        key = (meta["uid"], canary, -1 if step is None else step)
        if q is None or not stable or not canary_ips or not stable_ips:
            return None
        if self.quality.has(key):
            return self.quality.ensure(key, _never)
        try:
            ref = q.eval_set.config_map_ref if q.eval_set else None
            es = resolve(q, self.kube.get_configmap(meta["namespace"], ref.name) if ref else None)
        except EvalSetError as e:
            es, problem = None, refused(e.reason, str(e))
        else:
            problem = None

        def job() -> QualityResult:
            if es is None:
                assert problem is not None
                out = problem
            else:
                token = self._token(meta, spec)
                cohorts = Cohort(pod_url(stable_ips[0]), token), Cohort(pod_url(canary_ips[0]), token)
                # per request as long as the whole gate may take: a slow pod is the machine's timeout
                # (QualityTimeout), not a read timeout misread as a failed gate
                out = run_quality(
                    q, es, *cohorts, timeout_s=q.timeout_seconds, canary_serving=step is not None
                )
            metrics.QUALITY_GATES.labels(out.verdict, out.reason).inc()
            if out.seconds is not None:
                metrics.QUALITY_SECONDS.observe(out.seconds)
            stamp = {"time": iso(time.time()), "canary": canary, "stable": stable, "step": step}
            return out.model_copy(update=stamp)

        return self.quality.ensure(key, job)


def _never() -> QualityResult:
    raise AssertionError("a quality run exists for this key: ensure() does not start another")


def _error_key(pod: dict[str, Any]) -> str:
    """A serving pod's failure is its bundle's; a pre-pull pod's is filed apart (prefetch.error_key)."""
    labels = pod["metadata"].get("labels") or {}
    if PREFETCH_LABEL in labels:
        return prefetch_error_key(labels[PREFETCH_LABEL])
    return labels.get(BUNDLE_LABEL, "")


def _owned(o: dict[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid and r.get("controller") for r in o["metadata"].get("ownerReferences", []))


def _stuck_on(p: dict[str, Any]) -> str | None:
    """The node a pod sits on not Ready and not being deleted (None otherwise)."""
    if (p.get("metadata") or {}).get("deletionTimestamp") or pod_ready(p):
        return None
    return (p.get("spec") or {}).get("nodeName")


def suspect_nodes(pods: list[dict[str, Any]]) -> set[str]:
    """The nodes our pods sit on not Ready (and not being deleted): where a lost node would show."""
    return {node for p in pods if (node := _stuck_on(p))}


def lost_pods(pods: list[dict[str, Any]], lost: frozenset[str]) -> dict[str, list[LostPod]]:
    """bundle -> its pods that are not Ready, not being deleted, on a node in `lost`."""
    out: dict[str, list[LostPod]] = {}
    for p in pods:
        meta, node = p.get("metadata") or {}, _stuck_on(p)
        bundle = (meta.get("labels") or {}).get(BUNDLE_LABEL)
        if node in lost and node and bundle:
            started = (p.get("status") or {}).get("phase", "Pending") != "Pending"
            out.setdefault(bundle, []).append(LostPod(meta.get("name", ""), node, started))
    return out


def _not_ready(dep: dict[str, Any]) -> bool:
    st = dep.get("status") or {}
    return int(st.get("readyReplicas") or 0) < int((dep.get("spec") or {}).get("replicas") or 0)
