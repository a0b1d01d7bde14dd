"""The I/O around plan(): read what exists, apply the actions. Everything decided is in plan.

Reads are fresh GETs/LISTs (not the watch event body), so a reconcile never acts on a
status it wrote a moment ago and has not seen yet. Per-object locks keep the MD and child
watchers from reconciling one object twice at once. Names are deterministic, so a create
racing a restarted operator gets 409 and the next event converges: never duplicates.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import httpx
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from modeldeploy.operator import canary_io, metrics, rollout_cli, routing
from modeldeploy.operator.api import GROUP, PLURAL, VERSION, AnalysisResult, ModelDeploymentSpec
from modeldeploy.operator.bundle import BUNDLE_LABEL, MANAGED_BY
from modeldeploy.operator.children import PORT
from modeldeploy.operator.plan import (
    Action,
    Annotate,
    Create,
    Delete,
    Event,
    Observed,
    Patch,
    PatchStatus,
    plan,
)
from modeldeploy.operator.progression import epoch
from modeldeploy.operator.pull import pull_failure
from modeldeploy.operator.topology import NodeInfo

NODE_TTL_S = 15.0
ROLLOUT_TICK_S = 2.0  # while a rollout is active, reconcile again this soon (gate, pauses)
RUNNER = canary_io.ConformanceRunner()
BASELINES = canary_io.Baselines()
ROUTE_API = ("gateway.networking.k8s.io", "v1", "httproutes")
MAX_PROBES = 8
COUNT = {"reconciles": 0}
UNREACHABLE_S = 60.0
_unreachable: dict[
    str, float
] = {}  # pod uid -> when its /health/ready was last unreachable  # for the liveness probe body
PROBE_TIMEOUT_S = 0.5
_locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
_nodes: dict[str, Any] = {"at": 0.0, "nodes": None}
_nodes_lock = threading.Lock()


_api: dict[str, Any] = {}


def load_config() -> None:
    """Load credentials once and share one ApiClient, so connections are kept alive and reused."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 32  # above the 16 worker threads plus the resync task
    _api["client"] = client.ApiClient(cfg)


def _shared() -> client.ApiClient:
    if "client" not in _api:
        load_config()
    return _api["client"]


def _core() -> client.CoreV1Api:
    return client.CoreV1Api(_shared())


def _apps() -> client.AppsV1Api:
    return client.AppsV1Api(_shared())


def _custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(_shared())


def _json(resp: Any) -> dict[str, Any]:
    return json.loads(resp.data)


def nodes() -> list[NodeInfo]:
    """All nodes, relisted every NODE_TTL_S (no node watch: kwok heartbeats would flood it).

    Stale-while-revalidate: one thread relists, the others keep using the previous list
    instead of queueing behind a slow LIST of a thousand nodes.
    """
    fresh = _nodes["nodes"] is not None and time.monotonic() - _nodes["at"] <= NODE_TTL_S
    if fresh or not _nodes_lock.acquire(blocking=_nodes["nodes"] is None):
        return _nodes["nodes"]
    try:
        if _nodes["nodes"] is None or time.monotonic() - _nodes["at"] > NODE_TTL_S:
            items = _json(_core().list_node(_preload_content=False))["items"]
            _nodes["nodes"] = [NodeInfo.from_node(n) for n in items]
            _nodes["at"] = time.monotonic()
        return _nodes["nodes"]
    finally:
        _nodes_lock.release()


def observe(md: dict[str, Any]) -> Observed:
    ns, name, uid = md["metadata"]["namespace"], md["metadata"]["name"], md["metadata"]["uid"]
    sel = f"app.kubernetes.io/instance={name},app.kubernetes.io/managed-by={MANAGED_BY}"
    apps, core = _apps(), _core()
    deps = _json(apps.list_namespaced_deployment(ns, label_selector=sel, _preload_content=False))["items"]
    svcs = _json(core.list_namespaced_service(ns, label_selector=sel, _preload_content=False))["items"]

    def owned(o: dict[str, Any]) -> bool:
        return any(
            r.get("uid") == uid and r.get("controller") for r in o["metadata"].get("ownerReferences", [])
        )

    deps = [d for d in deps if owned(d)]
    loading, errors = _loading(ns, sel) if any(_not_ready(d) for d in deps) else ({}, {})
    obs = Observed(deps, [s for s in svcs if owned(s)], nodes(), loading, errors)
    _observe_rollout(md, sel, obs)
    return obs


def _observe_rollout(md: dict[str, Any], sel: str, obs: Observed) -> None:
    """The rollout machine's inputs: manual command, conformance gate result, canary analysis, routes."""
    meta, st = md["metadata"], md.get("status") or {}
    ann = meta.get("annotations") or {}
    obs.command = rollout_cli.command_from_annotations(ann)
    obs.command_annotations = tuple(a for a in rollout_cli.ANNOTATIONS if ann.get(a))
    last = st.get("lastAnalysis")
    if last:
        obs.analysis, obs.analysis_at = AnalysisResult.model_validate(last), epoch(last.get("time"))
    try:
        spec = ModelDeploymentSpec.model_validate(md.get("spec") or {})
    except ValidationError:
        return
    obs.routes = _routes(meta["namespace"], sel) if spec.rollout.traffic_routing.gateway_api else []
    phase, uid = st.get("phase"), meta["uid"]
    canary = (st.get("canary") or {}).get("bundle")
    stable = (st.get("stable") or {}).get("bundle")
    if phase not in ("Verifying", "Canary") or not canary:
        return
    pods = _json(_core().list_namespaced_pod(meta["namespace"], label_selector=sel, _preload_content=False))[
        "items"
    ]

    def ips(bundle: str | None) -> list[str]:
        return canary_io.ready_pod_ips(
            [p for p in pods if (p["metadata"].get("labels") or {}).get(BUNDLE_LABEL) == bundle]
        )

    if phase == "Verifying":
        canary_ips = ips(canary)
        if canary_ips and spec.rollout.conformance_gate:
            obs.conformance = RUNNER.ensure((uid, canary), canary_io.pod_url(canary_ips[0]))
        return
    step = st.get("currentStep")
    cfg = spec.rollout.analysis
    now = time.time()
    stale = obs.analysis is None or obs.analysis.step != step or obs.analysis_at is None
    if stale or now - obs.analysis_at >= cfg.interval_seconds:
        since = (st.get("rollout") or {}).get("phaseSince")
        mark = (canary, step, since)
        stamp = datetime.fromtimestamp(round(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        result, problems = canary_io.canary_analysis(
            BASELINES,
            uid,
            meta["namespace"],
            mark,
            epoch(since),
            (stable, ips(stable)),
            (canary, ips(canary)),
            cfg,
            step=step,
            time=stamp,
        )
        if problems:  # shown in status.lastAnalysis: why an interval is Inconclusive, not only in a log
            result = result.model_copy(update={"message": problems[:1024]})
        obs.analysis, obs.analysis_at, obs.analysis_fresh = result, epoch(stamp), True
        metrics.DECISIONS.labels("analysis", result.verdict).inc()


def _routes(ns: str, sel: str) -> list[dict[str, Any]] | None:
    """HTTPRoutes of this object; None when the cluster does not serve the Gateway API."""
    try:
        return _json(
            _custom().list_namespaced_custom_object(
                *ROUTE_API[:2], ns, ROUTE_API[2], label_selector=sel, _preload_content=False
            )
        )["items"]
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _not_ready(dep: dict[str, Any]) -> bool:
    st = dep.get("status") or {}
    return int(st.get("readyReplicas") or 0) < int((dep.get("spec") or {}).get("replicas") or 0)


def _loading(ns: str, sel: str) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Load progress and load errors of Running-but-not-Ready serving pods, from /health/ready,
    and image pull failures of Pending ones (pull.py).

    The runtime answers 503 with {"status": "failed", "error": ...} when loading failed
    (e.g. a digest mismatch); that error is what status should show, not "0/1 ready".

    Bounded: at most MAX_PROBES pods, PROBE_TIMEOUT_S each; an unreachable pod counts as 0.
    """
    pods = _json(_core().list_namespaced_pod(ns, label_selector=sel, _preload_content=False))["items"]
    out: dict[str, list[float]] = {}
    errors: dict[str, str] = {}
    probed = 0
    if len(_unreachable) > 10_000:
        _unreachable.clear()
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as http:
        for p in pods:
            st = p.get("status") or {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []
            )
            if not ready and (pulled := pull_failure(p)) is not None:  # Pending, never loads
                errors.setdefault(p["metadata"].get("labels", {}).get(BUNDLE_LABEL, ""), pulled)
                continue
            if ready or st.get("phase") != "Running" or not st.get("podIP") or probed >= MAX_PROBES:
                continue
            uid, progress = p["metadata"].get("uid", ""), 0.0
            if time.monotonic() - _unreachable.get(uid, -UNREACHABLE_S) >= UNREACHABLE_S:
                probed += 1
                try:
                    body = http.get(f"http://{st['podIP']}:{PORT}/health/ready").json()
                    progress = float(body.get("progress", 0.0))
                    if body.get("status") == "failed" and body.get("error"):
                        errors.setdefault(
                            p["metadata"].get("labels", {}).get(BUNDLE_LABEL, ""), str(body["error"])[:800]
                        )
                except httpx.TransportError:
                    _unreachable[uid] = (
                        time.monotonic()
                    )  # not routable from here: don't wait on it every time
                except (httpx.HTTPError, ValueError, AttributeError):
                    pass
            out.setdefault(p["metadata"].get("labels", {}).get(BUNDLE_LABEL, ""), []).append(progress)
    return out, errors


_guard = threading.Lock()
_rerun: dict[tuple[str, str], bool] = {}  # objects being reconciled -> another pass requested meanwhile
last_done: dict[tuple[str, str], float] = {}
own_writes: dict[
    tuple[str, str], str
] = {}  # resourceVersion of our last status write, per object  # monotonic time of each object's last completed reconcile


def request(namespace: str, name: str) -> None:
    """Reconcile now or, when a reconcile of this object is already running, once more after it.

    Bursts of watch events (a child created, its status updated, ...) collapse into at most
    one extra pass instead of one full reconcile each.
    """
    key = (namespace, name)
    with _guard:
        if key in _rerun:
            _rerun[key] = True
            return
        _rerun[key] = False
    try:
        while True:
            reconcile(namespace, name)
            with _guard:
                if not _rerun[key]:
                    return
                _rerun[key] = False
    finally:
        with _guard:
            _rerun.pop(key, None)


def reconcile(namespace: str, name: str) -> list[Action]:
    """Plan and apply one ModelDeployment; returns the actions taken (for logs and tests)."""
    with _locks[(namespace, name)], metrics.RECONCILE_SECONDS.time():
        try:
            md = _json(
                _custom().get_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name, _preload_content=False
                )
            )
        except ApiException as e:
            if e.status == 404:
                return []
            raise
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        actions = plan(md, observe(md), now)
        apply(md, actions, now)
        status = next((a.status for a in actions if isinstance(a, PatchStatus)), md.get("status") or {})
        if status.get("phase") in (
            "Deploying",
            "Verifying",
            "Canary",
            "Promoting",
            "RollingBack",
        ) and status.get("canary"):
            _tick(namespace, name)  # gate results, pauses and analysis intervals raise no watch event
        elif status.get("phase") == "Stable":
            _forget_rollout(md["metadata"]["uid"])
        metrics.RECONCILES.inc()
        COUNT["reconciles"] += 1
        last_done[(namespace, name)] = time.monotonic()
        return actions


_ticks: set[tuple[str, str]] = set()


def _tick(namespace: str, name: str) -> None:
    """One delayed re-reconcile per object at a time (a daemon timer; lost on restart, as status is not)."""
    key = (namespace, name)
    with _guard:
        if key in _ticks:
            return
        _ticks.add(key)

    def fire() -> None:
        with _guard:
            _ticks.discard(key)
        try:
            request(namespace, name)
        except Exception as e:  # noqa: BLE001 - the next watch event or resync retries
            metrics.ERRORS.labels(type(e).__name__).inc()

    t = threading.Timer(ROLLOUT_TICK_S, fire)
    t.daemon = True
    t.start()


def _forget_rollout(uid: str) -> None:
    """A settled object keeps no gate results or metric baselines: a later rollout starts fresh."""
    RUNNER.forget_md(uid)
    BASELINES.forget(uid)


def apply(md: dict[str, Any], actions: list[Action], now: str) -> None:
    ns, name = md["metadata"]["namespace"], md["metadata"]["name"]
    apps, core = _apps(), _core()
    raw = {"_preload_content": False}  # the response body is not needed: skip model decoding
    failures: list[str] = []
    for a in actions:
        try:
            if isinstance(a, Create) and a.obj["kind"] == routing.KIND:
                _custom().create_namespaced_custom_object(*ROUTE_API[:2], ns, ROUTE_API[2], a.obj, **raw)
                metrics.DECISIONS.labels("create", routing.KIND).inc()
            elif isinstance(a, Patch | Delete) and a.kind == routing.KIND:
                if isinstance(a, Patch):
                    _custom().patch_namespaced_custom_object(
                        *ROUTE_API[:2],
                        ns,
                        ROUTE_API[2],
                        a.name,
                        a.body,
                        _content_type="application/merge-patch+json",
                        **raw,
                    )
                else:
                    _custom().delete_namespaced_custom_object(*ROUTE_API[:2], ns, ROUTE_API[2], a.name, **raw)
                metrics.DECISIONS.labels(type(a).__name__.lower(), routing.KIND).inc()
            elif isinstance(a, Annotate):
                _custom().patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    ns,
                    PLURAL,
                    name,
                    {"metadata": {"annotations": a.annotations}},
                    _content_type="application/merge-patch+json",
                    **raw,
                )
            elif isinstance(a, Create):
                kind = a.obj["kind"]
                create = (
                    apps.create_namespaced_deployment
                    if kind == "Deployment"
                    else core.create_namespaced_service
                )
                create(ns, a.obj, **raw)
                metrics.DECISIONS.labels("create", kind).inc()
            elif isinstance(a, Patch):
                patch = (
                    apps.patch_namespaced_deployment
                    if a.kind == "Deployment"
                    else core.patch_namespaced_service
                )
                patch(a.name, ns, a.body, _content_type="application/merge-patch+json", **raw)
                metrics.DECISIONS.labels("patch", a.kind).inc()
            elif isinstance(a, Delete):
                delete = (
                    apps.delete_namespaced_deployment
                    if a.kind == "Deployment"
                    else core.delete_namespaced_service
                )
                delete(a.name, ns, body={"propagationPolicy": "Background"}, **raw)
                metrics.DECISIONS.labels("delete", a.kind).inc()
            elif isinstance(a, PatchStatus):
                # JSON patch `add /status` replaces the whole status, so fields plan() dropped go too
                body = [{"op": "add", "path": "/status", "value": a.status}]
                resp = _custom().patch_namespaced_custom_object_status(
                    GROUP, VERSION, ns, PLURAL, name, body, _content_type="application/json-patch+json", **raw
                )
                own_writes[(ns, name)] = _json(resp)["metadata"]["resourceVersion"]
                _failpoint(a.status.get("phase"))
            elif isinstance(a, Event):
                post_event(md, a, now)
        except ApiException as e:
            if e.status in (
                404,
                409,
            ):  # raced with GC, another writer or a restarted operator: next event converges
                continue
            failures.append(f"{_describe(a)}: {_api_message(e)}")
    if failures:
        # every other action (status included) was still applied; the failure is an Event and an error
        post_event(md, Event("Warning", "ApplyFailed", "; ".join(failures)), now)
        raise ApplyError("; ".join(failures))


def _failpoint(phase: str | None) -> None:
    """Crash tests: `MODELDEPLOY_FAILPOINT=kill-after-status:<Phase>` SIGKILLs this process right
    after it persisted a status whose phase is <Phase>, so a test can kill the operator in
    phases that last a single reconcile (Promoting, RollingBack) as surely as in long ones."""
    point = os.environ.get("MODELDEPLOY_FAILPOINT", "")
    if phase and point == f"kill-after-status:{phase}":
        os.kill(os.getpid(), signal.SIGKILL)


class ApplyError(RuntimeError):
    """Some actions of a plan were refused by the API server."""


def _describe(a: Action) -> str:
    if isinstance(a, Create):
        return f"create {a.obj['kind']} {a.obj['metadata']['name']}"
    if isinstance(a, Patch | Delete):
        return f"{type(a).__name__.lower()} {a.kind} {a.name}"
    return type(a).__name__


def _api_message(e: ApiException) -> str:
    try:
        return json.loads(e.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{e.status} {e.reason}"


def post_event(md: dict[str, Any], ev: Event, now: str) -> None:
    meta = md["metadata"]
    body = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelDeployment", "name": meta["name"],
            "namespace": meta["namespace"], "uid": meta["uid"], "resourceVersion": meta.get("resourceVersion"),
        },
        "type": ev.type, "reason": ev.reason, "message": ev.message[:1024],
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": MANAGED_BY}, "reportingComponent": MANAGED_BY,
    }  # fmt: skip
    _core().create_namespaced_event(meta["namespace"], body, _preload_content=False)
    metrics.EVENTS.labels(ev.reason).inc()
