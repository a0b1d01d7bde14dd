"""kopf handlers: a few lines each, all of them ending in reconcile.reconcile().

Level-triggered: any change to a ModelDeployment or to a child it controls, plus a
periodic resync (node changes, missed events), runs the same idempotent reconcile.
Only `on.event` is used, so kopf keeps no state and no finalizer of its own in the objects.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import kopf

from modeldeploy.operator import metrics, object_metrics, reconcile
from modeldeploy.operator.api import GROUP, PLURAL, VERSION
from modeldeploy.operator.bundle import MANAGED_BY

RESYNC_S = float(os.environ.get("MODELDEPLOY_RESYNC_SECONDS", "30"))
log = logging.getLogger("modeldeploy.operator")
CHILD = {"app.kubernetes.io/managed-by": MANAGED_BY}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="modeldeploy.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="modeldeploy.dev")
    settings.posting.level = logging.WARNING  # our own Events carry the decisions
    settings.watching.server_timeout = 300
    settings.execution.max_workers = int(os.environ.get("MODELDEPLOY_WORKERS", "16"))
    reconcile.load_config()


def _run(namespace: str | None, name: str | None) -> None:
    if not namespace or not name:
        return
    try:
        reconcile.request(namespace, name)
    except Exception as e:
        metrics.ERRORS.labels(type(e).__name__).inc()
        raise kopf.TemporaryError(f"reconcile {namespace}/{name}: {e}", delay=5) from e


def _owner(body: kopf.Body) -> str | None:
    return next(
        (r["name"] for r in body.metadata.get("ownerReferences", []) if r.get("kind") == "ModelDeployment"),
        None,
    )


_known: set[tuple[str, str]] = set()  # ModelDeployments seen by the watch, for the periodic resync


@kopf.on.event(GROUP, VERSION, PLURAL)
def modeldeployment_changed(type: str | None, body: kopf.Body, namespace: str, name: str, **_) -> None:
    key = (namespace, name)
    if type == "DELETED":
        _known.discard(key)
        reconcile.last_done.pop(key, None)
        reconcile.own_writes.pop(key, None)
        object_metrics.OBJECTS.forget(namespace, name)
        return
    _known.add(key)
    if body.metadata.get("resourceVersion") == reconcile.own_writes.get(key):
        return  # the echo of our own status write: nothing new to act on
    _run(namespace, name)


@kopf.on.event("apps", "v1", "deployments", labels=CHILD)
@kopf.on.event("", "v1", "services", labels=CHILD)
def child_changed(type: str | None, body: kopf.Body, namespace: str, **_) -> None:
    if type in (None, "ADDED"):  # listing or our own create: the ModelDeployment's reconcile covers it
        return
    uid, sig = body.metadata.get("uid"), _signature(body)
    if type != "DELETED" and _child_seen.get(uid) == sig:
        return  # only status fields plan() does not read changed (observedGeneration, availableReplicas, ...)
    _child_seen[uid] = sig
    if type == "DELETED":
        _child_seen.pop(uid, None)
    _run(namespace, _owner(body))


_child_seen: dict[str, tuple] = {}  # child uid -> what plan() reads of it, as last seen


def _signature(body: kopf.Body) -> tuple:
    """What plan() reads of a child: spec (via generation), labels, annotations, readiness, failures."""
    status = body.get("status") or {}
    failure = [
        c.get("message")
        for c in status.get("conditions") or []
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True"
    ]
    spec = body.get("spec") or {}
    return (
        body.metadata.get("generation"),
        repr(spec) if body.get("kind") == "Service" else None,  # Services have no generation
        repr(sorted(body.metadata.get("labels", {}).items())),
        repr(sorted(body.metadata.get("annotations", {}).items())),
        status.get("readyReplicas"),
        tuple(failure),
    )


async def _resync_forever() -> None:
    """Re-reconcile every known object each RESYNC_S: node changes, missed events.

    A plain task rather than a kopf timer, because kopf timers put a finalizer on every
    object, which would block deleting a ModelDeployment while the operator is down.
    """
    while True:
        await asyncio.sleep(RESYNC_S)
        for namespace, name in sorted(_known):
            if time.monotonic() - reconcile.last_done.get((namespace, name), 0.0) < RESYNC_S:
                continue  # reconciled recently through an event
            try:
                await asyncio.to_thread(reconcile.request, namespace, name)
            except Exception as e:  # one object's failure must not stop the others' resync
                metrics.ERRORS.labels(type(e).__name__).inc()
                log.warning("resync %s/%s: %s", namespace, name, e)


@kopf.on.startup()
async def start_resync(memo: kopf.Memo, **_) -> None:
    memo.resync = asyncio.create_task(_resync_forever())


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_) -> None:
    memo.resync.cancel()


@kopf.on.probe(id="reconciles")
def reconciles_probe(**_) -> float:
    return float(reconcile.COUNT["reconciles"])
