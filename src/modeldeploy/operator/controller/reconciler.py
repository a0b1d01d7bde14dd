"""The Controller: one object owning everything the reconcile loop keeps between calls.

As kubebuilder's Reconciler struct owns its client: the API client, the node cache, the work
queue (coalescing and rollout ticks), the per-object locks, the own-write echoes, the
conformance gate runs and the analysis baselines all hang off one `Controller`, created in
kopf's startup handler and kept in `memo`. Handlers call its methods and stay a few lines.
Deleting a ModelDeployment clears every entry kept for it (`forget`).

One reconcile = observe (observe.py: read the world) -> plan (plan.py: pure decision) ->
apply (apply.py: actions and Events) -> schedule the next tick while a rollout moves.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from modeldeploy.operator.analysis.gate import ConformanceRunner
from modeldeploy.operator.analysis.quality import QualityRunner
from modeldeploy.operator.analysis.scrape import Baselines
from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT
from modeldeploy.operator.controller import apply as applying
from modeldeploy.operator.controller import metrics
from modeldeploy.operator.controller.apply import Hooks, apply
from modeldeploy.operator.controller.claims import Claim, ObjectKey
from modeldeploy.operator.controller.kube import Kube
from modeldeploy.operator.controller.object_metrics import ObjectMetrics
from modeldeploy.operator.controller.observe import UNFIT_TTL_S, LoadProbe, NodeCache, Observer
from modeldeploy.operator.controller.store import MD, Store
from modeldeploy.operator.controller.tracing import OperatorTracing
from modeldeploy.operator.controller.workqueue import WorkQueue
from modeldeploy.operator.rollout.actions import Action, PatchStatus
from modeldeploy.operator.rollout.drift import DESIRED_HASH
from modeldeploy.operator.rollout.machine import IN_FLIGHT
from modeldeploy.operator.rollout.plan import capacity_decided, plan, unschedulable
from modeldeploy.operator.rollout.progression import now_iso

OWN_WRITES = 4  # status writes per object whose watch events are recognised as our own echoes
ROLLOUT_TICK_S = 2.0  # while a rollout is active, reconcile again this soon (gate, pauses)
# A child's owner (namespace, name; None parts for a child no ModelDeployment owns) and what plan() reads
Remembered = tuple[tuple[str | None, str | None], tuple]


class Controller:
    """Reconciles ModelDeployments; all of the operator's in-memory state lives here."""

    def __init__(
        self,
        kube: Kube,
        tick_s: float = ROLLOUT_TICK_S,
        leader: Callable[[str], bool] | None = None,
        workers: int = 0,
        cache: bool = False,
    ) -> None:
        """`cache`: read the ModelDeployment and its Deployments, Services and NetworkPolicies from `store`
        (store.py), which the watch handlers feed through md_event and child_event. Off, every pass reads
        fresh: for callers that change the API server between passes without telling the Controller."""
        self.kube = kube
        self.store = Store() if cache else None
        self.doubted: set[ObjectKey] = set()  # keys whose next pass reads fresh, not from the store
        self.leader = leader  # peering: whether this replica is the active one for a namespace
        self.nodes = NodeCache(kube)
        self.deciding = threading.Lock()  # capacity decisions, one at a time (claims.py)
        self.probe = LoadProbe(PORT)
        self.gate = ConformanceRunner()
        self.quality = QualityRunner()
        self.baselines = Baselines()
        self.apply_pool = applying.pool()  # a plan's creates and Events (and observe's LISTs) go together
        self.observer = Observer(
            kube,
            self.nodes,
            self.probe,
            self.gate,
            self.baselines,
            self.apply_pool.map,
            self.store,
            self.quality,
        )
        self.queue = WorkQueue(lambda key: self.reconcile(*key), tick_s, workers)  # workers: see enqueue
        self.reconciles = 0  # completed, for the liveness probe
        self._guard = threading.Lock()
        self._locks: dict[ObjectKey, threading.Lock] = {}  # one reconcile per object at a time
        self.known: set[ObjectKey] = set()  # ModelDeployments seen by the watch, for the periodic resync
        self.uids: dict[ObjectKey, str] = {}
        self.own_writes: dict[ObjectKey, tuple[str, ...]] = {}  # resourceVersions of our last status writes
        self.last_done: dict[ObjectKey, float] = {}  # monotonic time of the last completed reconcile
        self.children: dict[str, Remembered] = {}  # child uid -> (owner, what plan() reads of it)
        self.object_metrics = ObjectMetrics()  # per-object gauges: phase, weight, cohorts, conditions
        self.tracing = OperatorTracing()  # reconcile/analysis spans when OTEL_EXPORTER_OTLP_ENDPOINT is set

    def request(self, namespace: str, name: str, source: str = "modeldeployment") -> None:
        """Reconcile now or, when a reconcile of this object is running, once more after it.
        `source`: what asked (modeldeployment, child, resync), counted per source in the metrics.
        A resync pass reads fresh: it is what corrects a store that missed a deletion (store.py)."""
        if source == "resync":
            self.doubt((namespace, name))
        self.queue.request((namespace, name), source)

    def enqueue(
        self, namespace: str, name: str, source: str = "modeldeployment", version: str | None = None
    ) -> None:
        """`request` on one of the queue's worker threads, without waiting: what watch handlers call, so
        that kopf's threads never wait on a reconcile (workqueue.py says why).

        `version`: the resourceVersion of the ModelDeployment event that asked. Arriving while a pass
        runs, it may be the echo of that pass's own status write, delivered before the write's response
        was recorded in own_writes; it is checked again once the pass ends, and is no news if it was."""
        key = (namespace, name)
        if version is None:
            self.queue.add(key, source)
            return

        def news() -> bool:
            with self._guard:
                return version not in self.own_writes.get(key, ())

        self.queue.add(key, source, news)

    def reconcile(self, namespace: str, name: str) -> list[Action]:
        """Observe, plan and apply one ModelDeployment; returns the actions taken (for logs and tests)."""
        key = (namespace, name)
        if self.leader is not None and not self.leader(namespace):
            # a standby replica: kopf paused its watches, and our own ticks and resync stop here
            # (no tick is scheduled); kopf re-lists everything when this replica becomes active
            metrics.STANDBY_SKIPS.inc()
            self.doubt(key)  # the watches pause while standby: what the store holds may be stale
            return []
        with self._lock(key), metrics.RECONCILE_SECONDS.time():
            with self._guard:
                fresh = self.store is None or key in self.doubted
                self.doubted.discard(key)
            md = self._read(key, fresh)
            if md is not None:
                return self._reconcile(key, md, fresh)
        self.forget(key)  # gone: nothing of it is kept
        return []

    def _read(self, key: ObjectKey, fresh: bool) -> dict[str, Any] | None:
        """The ModelDeployment from the store, else (or `fresh`) a GET, kept in the store."""
        if not fresh and self.store is not None and (kept := self.store.md(*key)) is not None:
            return kept
        md = self.kube.get_md(*key)
        if md is not None and self.store is not None:
            self.store.put(md, MD)
        return md

    def doubt(self, key: ObjectKey) -> None:
        """The next pass of `key` reads fresh (no effect without the store)."""
        if self.store is not None:
            with self._guard:
                self.doubted.add(key)

    def _reconcile(self, key: ObjectKey, md: dict[str, Any], fresh: bool = True) -> list[Action]:
        now, uid, t0 = now_iso(), md["metadata"]["uid"], time.time()

        def status_written(resource_version: str) -> None:
            # its watch event is an echo, not news; the last few are kept because a busy operator can
            # write status twice before the first write's event is handled
            with self._guard:
                self.own_writes[key] = (*self.own_writes.get(key, ()), resource_version)[-OWN_WRITES:]

        def raced() -> None:
            # a create met 409 or a write 404: what the pass read was out of date. Read fresh once more;
            # a fresh pass that races too is left to the next event (no retry loop)
            if not fresh:
                self.doubt(key)
                self.queue.add(key, "raced")

        began = self.nodes.clock()
        observed = self.observer.observe(md, fresh)
        observed_at = time.time()
        actions = plan(md, observed, now)
        if observed.nodes is not None and unschedulable(md.get("status"), actions):
            recent = self.nodes.get(since=max(0.0, self.nodes.clock() - UNFIT_TTL_S))
            if recent is not observed.nodes:  # judged on an older list: judge again on a recent one
                observed.nodes = recent
                actions = plan(md, observed, now)
        decided = observed.nodes is not None and capacity_decided(md.get("status"), actions)
        # one decision on spare GPUs at a time, each seeing the claims the earlier ones recorded
        with self.deciding if decided else contextlib.nullcontext():
            if decided:
                observed.nodes = self.nodes.for_decision(key, since=began)  # GPUs taken now, not cached
                actions = plan(md, observed, now)
            status = next((a.status for a in actions if isinstance(a, PatchStatus)), md.get("status") or {})
            self.nodes.claim(key, Claim.of(md, status))
        hooks = Hooks(
            status_written, lambda c: self._created(key, c), self._stored, self._removed(key[0]), raced
        )
        apply(self.kube, md, actions, now, hooks, self.apply_pool.map)
        self.object_metrics.record(md, status)
        analysis = observed.analysis if observed.analysis_fresh else None
        self.tracing.reconcile(md, actions, status, t0, analysis, observed_at)
        if status.get("phase") in IN_FLIGHT and status.get("canary"):
            self.queue.tick(key)  # gate results, pauses and analysis intervals raise no watch event
        elif status.get("phase") == "Stable":
            self._forget_rollout(uid)
        metrics.RECONCILES.inc()
        with self._guard:
            self.reconciles += 1
            self.uids[key] = uid
            self.last_done[key] = time.monotonic()
        return actions

    def md_event(self, kind: str | None, namespace: str, name: str, body: Mapping[str, Any]) -> bool:
        """Bookkeeping for a ModelDeployment watch event; True when it calls for a reconcile."""
        key, meta = (namespace, name), body.get("metadata") or {}
        if kind == "DELETED":
            self.forget(key, meta.get("uid"))
            return False
        if self.store is not None:
            self.store.put(body, MD)
            if kind == "ADDED" and meta.get("uid"):  # created while we watch: its children all come to us
                self.store.complete(meta["uid"])
        with self._guard:
            self.known.add(key)
        echo = meta.get("resourceVersion") in self.own_writes.get(key, ())  # of one of our status writes
        return not echo

    def child_event(self, kind: str | None, body: Mapping[str, Any]) -> str | None:
        """The owning ModelDeployment's name when a child's change matters to plan(), else None."""
        if self.store is not None:
            meta = body.get("metadata") or {}
            if kind == "DELETED":
                self.store.drop(
                    body.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
                )
            else:
                self.store.put(body)
        if kind in (None, "ADDED"):  # listing or our own create: the ModelDeployment's reconcile covers it
            return None
        meta = body.get("metadata") or {}
        owner = next(
            (r["name"] for r in meta.get("ownerReferences", []) if r.get("kind") == "ModelDeployment"), None
        )
        uid = meta.get("uid")
        if not uid:
            return owner
        seen: Remembered = ((meta.get("namespace"), owner), signature(body))
        with self._guard:
            if kind == "DELETED":
                self.children.pop(uid, None)
            elif self.children.get(uid) == seen:
                return None  # only status fields plan() does not read changed (observedGeneration, ...)
            else:
                self.children[uid] = seen
        return owner

    def _created(self, owner: ObjectKey, child: Mapping[str, Any]) -> None:
        """Remember what plan() reads of a child we just created, so that its first watch events (the
        Deployment controller's revision annotation and first status, none of which plan() reads) do not
        each cost the owner a reconcile; readiness changing later does."""
        with self._guard:
            self.children[child["metadata"]["uid"]] = (owner, signature(child))

    def _stored(self, kind: str, obj: dict[str, Any]) -> None:
        if self.store is not None:
            self.store.put(obj, kind)

    def _removed(self, namespace: str) -> Callable[[str, str], None]:
        def removed(kind: str, name: str) -> None:
            if self.store is not None:
                self.store.drop(kind, namespace, name)

        return removed

    def due(self, key: ObjectKey, period_s: float) -> bool:
        """Whether the periodic resync should reconcile `key`: not reconciled lately, and no pass of it
        running, waiting for a worker or ticking (that pass is as good as a resync)."""
        return time.monotonic() - self.last_done.get(key, 0.0) >= period_s and not self.queue.holds(key)

    def forget(self, key: ObjectKey, uid: str | None = None) -> None:
        """Drop every entry kept for a deleted object (after any reconcile of it in flight)."""
        with self._lock(key):
            self.queue.forget(key)
            self.probe.forget(key)
            self.nodes.claim(key, None)
            self.object_metrics.forget(*key)
            with self._guard:
                self.known.discard(key)
                self.own_writes.pop(key, None)
                self.last_done.pop(key, None)
                for child in [c for c, (owner, _) in self.children.items() if owner == key]:
                    del self.children[child]  # its own DELETED event may never come (a watch restart)
                uid = self.uids.pop(key, None) or uid
                self._locks.pop(key, None)
                self.doubted.discard(key)
            if self.store is not None:
                self.store.forget(*key, uid)
        if uid:
            self._forget_rollout(uid)

    def holds(self, namespace: str, name: str, uid: str) -> list[str]:
        """Which stores still hold an entry for this object (empty once it is forgotten): for tests."""
        key = (namespace, name)
        found = [
            n
            for n in ("known", "uids", "own_writes", "last_done", "_locks", "doubted")
            if key in getattr(self, n)
        ]
        found += ["store"] if self.store is not None and self.store.holds(*key, uid) else []
        found += ["children"] if any(owner == key for owner, _ in self.children.values()) else []
        found += ["object_metrics"] if self.object_metrics.holds(*key) else []
        found += ["queue"] if self.queue.holds(key) else []
        found += ["probe"] if self.probe.holds(key) else []
        found += ["nodes"] if self.nodes.claims(key) else []
        found += ["gate"] if self.gate.holds(uid) else []
        found += ["quality"] if self.quality.holds(uid) else []
        found += ["baselines"] if self.baselines.holds(uid) else []
        return found

    def _forget_rollout(self, uid: str) -> None:
        """Settled or deleted: no gate results or metric baselines kept; the next rollout starts fresh."""
        self.gate.forget_md(uid)
        self.quality.forget_md(uid)
        self.baselines.forget(uid)

    def _lock(self, key: ObjectKey) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())


def signature(body: Mapping[str, Any]) -> tuple:
    """What plan() reads of a child: spec (via generation), labels, our desired-hash annotation, readiness,
    failures. Other annotations are left out: the Deployment controller's `deployment.kubernetes.io/revision`
    lands right after every create and would cost each new object a reconcile that changes nothing."""
    meta, status, spec = body.get("metadata") or {}, body.get("status") or {}, body.get("spec") or {}
    failure = [
        c.get("message")
        for c in status.get("conditions") or []
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True"
    ]
    return (
        meta.get("generation"),
        # Services have no generation; a NetworkPolicy's is kept by the API server, its spec is small
        repr(spec) if body.get("kind") in ("Service", "NetworkPolicy") else None,
        repr(sorted((meta.get("labels") or {}).items())),
        (meta.get("annotations") or {}).get(DESIRED_HASH),
        status.get("readyReplicas"),
        tuple(failure),
    )
