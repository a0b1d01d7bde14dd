"""kopf handlers: a few lines each, all of them ending in a method of the `Controller` kept in memo.

Level-triggered: any change to a ModelDeployment or to a child it controls, plus a
periodic resync (node changes, missed events), runs the same idempotent reconcile.
Only `on.event` is used, so kopf keeps no state and no finalizer of its own in the objects.
"""

from __future__ import annotations

import asyncio
import logging
import os
from types import MappingProxyType

import kopf

from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, PLURAL, VERSION
from modeldeploy.operator.controller import metrics, peering
from modeldeploy.operator.controller.kube import Kube
from modeldeploy.operator.controller.reconciler import Controller
from modeldeploy.operator.rollout.bundle import MANAGED_BY

RESYNC_S = float(os.environ.get("MODELDEPLOY_RESYNC_SECONDS", "30"))
log = logging.getLogger("modeldeploy.operator")
WORKERS = int(os.environ.get("MODELDEPLOY_WORKERS", "16"))  # reconciles at a time (the Controller's threads)
# passes read from the store these handlers feed (store.py); 0: every pass GETs and LISTs (for A/B benches)
CACHE = os.environ.get("MODELDEPLOY_READ_CACHE", "1") != "0"
CHILD = MappingProxyType({"app.kubernetes.io/managed-by": MANAGED_BY})


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base, for the on.create/on.update handlers we do not have: nothing built or kept.

    kopf builds one for every watch event regardless, a deep copy of the whole body, on the event
    loop every watch shares: work for nothing when no handler reads it."""

    def build(self, *, body: kopf.Body, extra_fields: object = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="modeldeploy.dev")
    settings.persistence.diffbase_storage = NoDiffBase()  # only on.event handlers: no diff is read
    settings.posting.level = logging.WARNING  # our own Events carry the decisions
    settings.watching.server_timeout = 300
    kube = Kube.connect()
    leader = peering.Peering(kube.custom, peering.CONFIG).active if peering.CONFIG else None
    memo.controller = Controller(kube, leader=leader, workers=WORKERS, cache=CACHE)
    memo.resync = asyncio.create_task(_resync_forever(memo.controller))


def _run(
    ctrl: Controller, namespace: str | None, name: str | None, source: str, version: str | None = None
) -> None:
    if namespace and name:
        ctrl.enqueue(namespace, name, source, version)  # returns at once: the Controller's workers reconcile


@kopf.on.event(GROUP, VERSION, PLURAL)
def modeldeployment_changed(
    type: str | None, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **_
) -> None:
    if namespace is not None and memo.controller.md_event(type, namespace, name, body):
        _run(
            memo.controller,
            namespace,
            name,
            "modeldeployment",
            body.get("metadata", {}).get("resourceVersion"),
        )


@kopf.on.event("apps", "v1", "deployments", labels=CHILD)
@kopf.on.event("", "v1", "services", labels=CHILD)
@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=CHILD)  # spec.network: edits revert
def child_changed(type: str | None, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_) -> None:
    owner = memo.controller.child_event(type, body)
    if owner is not None:
        _run(memo.controller, namespace, owner, "child")


async def _resync_forever(ctrl: Controller) -> None:
    """Re-reconcile every known object each RESYNC_S: node changes, missed events.

    A plain task rather than a kopf timer, because kopf timers put a finalizer on every
    object, which would block deleting a ModelDeployment while the operator is down.
    """
    while True:
        await asyncio.sleep(RESYNC_S)
        for namespace, name in sorted(ctrl.known):
            if not ctrl.due((namespace, name), RESYNC_S):
                continue  # reconciled recently through an event
            try:  # one at a time, on a thread of its own: a sweep never queues ahead of watch events
                await asyncio.to_thread(ctrl.request, namespace, name, "resync")
            except Exception as e:  # one object's failure must not stop the others' resync
                metrics.ERRORS.labels(type(e).__name__).inc()
                log.warning("resync %s/%s: %s", namespace, name, e)


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_) -> None:
    memo.resync.cancel()


@kopf.on.probe(id="reconciles")
def reconciles_probe(memo: kopf.Memo, **_) -> float:
    ctrl = memo.get("controller")  # None until the startup handler ran
    return float(ctrl.reconciles) if ctrl is not None else 0.0
