"""Execute plan()'s actions against the API server and post its Events.

Names are deterministic, so a create racing a restarted operator gets 409 and the next event
converges: never duplicates. A refused action does not stop the others (status included);
the refusals become one ApplyFailed Event and an ApplyError for the caller to retry.

Creates and Events that follow one another in the plan do not depend on each other (a new
object's Deployment, its three Services and their Events): they go to the API server together,
on a pool shared by all reconciles, instead of one round trip after another (a ClusterIP Service
create takes seconds on a loaded API server). Every other action (patch, delete, annotation,
status) runs alone, in plan order, after the batch before it has finished.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, VERSION
from modeldeploy.operator.controller import metrics
from modeldeploy.operator.controller.kube import Kube
from modeldeploy.operator.rollout.actions import Action, Annotate, Create, Delete, Event, Patch, PatchStatus
from modeldeploy.operator.rollout.bundle import MANAGED_BY

FAILPOINT_ENV = "MODELDEPLOY_FAILPOINT"
APPLY_THREADS = 16  # creates, Events and observe's LISTs of all reconciles (kube.POOL_SIZE covers them)
Together = Callable[[Callable[[Action], str | None], list[Action]], Iterator[str | None]]


def pool() -> ThreadPoolExecutor:
    """The pool a Controller keeps for `apply(..., together=pool.map)`."""
    return ThreadPoolExecutor(APPLY_THREADS, thread_name_prefix="apply")


class ApplyError(RuntimeError):
    """Some actions of a plan were refused by the API server."""


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class Hooks:
    """What the caller learns as actions land (the Controller's bookkeeping); each does nothing by default.

    status_written(resourceVersion): our status write landed (its watch event is an echo).
    created(obj): a child as the API server stored it on create (the Controller's child signatures).
    stored(kind, obj): any write's response, the object as stored (create, patch, status, annotations).
    removed(kind, name): a delete succeeded.
    raced(): a create met 409 or a write met 404: what the pass read was out of date.
    """

    status_written: Callable[[str], None] = _nothing
    created: Callable[[dict[str, Any]], None] = _nothing
    stored: Callable[[str, dict[str, Any]], None] = _nothing
    removed: Callable[[str, str], None] = _nothing
    raced: Callable[[], None] = _nothing


def apply(
    kube: Kube,
    md: dict[str, Any],
    actions: list[Action],
    now: str,
    hooks: Hooks = Hooks(),
    together: Together = map,
) -> None:
    """Apply every action, telling `hooks` as they land.
    `together(fn, batch)`: how a batch of Creates and Events runs (a pool's map; default one by one)."""
    ns, name = md["metadata"]["namespace"], md["metadata"]["name"]

    def one(a: Action) -> str | None:
        """Apply one action; a refusal's description, None when done (or raced: next event converges)."""
        try:
            if isinstance(a, PatchStatus):
                obj = kube.replace_status(ns, name, a.status)
                hooks.status_written(obj["metadata"]["resourceVersion"])
                hooks.stored("ModelDeployment", obj)
                failpoint(a.status.get("phase"))
            elif isinstance(a, Event):
                post_event(kube, md, a, now)
            else:
                _child(kube, ns, name, a, hooks)
        except ApiException as e:
            if e.status in (404, 409):  # raced with GC, another writer or a restarted operator
                hooks.raced()
                return None
            return f"{_describe(a)}: {_api_message(e)}"
        return None

    failures: list[str] = []
    for batch in batches(actions):
        done = [one(batch[0])] if len(batch) == 1 else list(together(one, batch))
        failures += [f for f in done if f]
    if failures:
        # every other action (status included) was still applied; the failure is an Event and an error
        post_event(kube, md, Event("Warning", "ApplyFailed", "; ".join(failures)), now)
        raise ApplyError("; ".join(failures))


def batches(actions: list[Action]) -> Iterator[list[Action]]:
    """`actions` in plan order, cut into what may run together: runs of consecutive Creates and Events,
    every other action alone."""
    run: list[Action] = []
    for a in actions:
        if isinstance(a, Create | Event):
            run.append(a)
            continue
        if run:
            yield run
            run = []
        yield [a]
    if run:
        yield run


def _child(kube: Kube, ns: str, name: str, a: Action, hooks: Hooks) -> None:
    if isinstance(a, Annotate):
        hooks.stored("ModelDeployment", kube.annotate_md(ns, name, a.annotations))
    elif isinstance(a, Create):
        obj = kube.create(ns, a.obj)
        hooks.created(obj)
        hooks.stored(a.obj["kind"], obj)
        metrics.DECISIONS.labels("create", a.obj["kind"]).inc()
    elif isinstance(a, Patch):
        hooks.stored(a.kind, kube.patch(a.kind, ns, a.name, a.body))
        metrics.DECISIONS.labels("patch", a.kind).inc()
    elif isinstance(a, Delete):
        kube.delete(a.kind, ns, a.name)
        hooks.removed(a.kind, a.name)
        metrics.DECISIONS.labels("delete", a.kind).inc()


def failpoint(phase: str | None) -> None:
    """Crash tests: `MODELDEPLOY_FAILPOINT=kill-after-status:<Phase>` SIGKILLs this process right
    after it persisted a status whose phase is <Phase>, so a test can kill the operator in
    phases that last a single reconcile (Promoting, RollingBack) as surely as in long ones."""
    point = os.environ.get(FAILPOINT_ENV, "")
    if phase and point == f"kill-after-status:{phase}":
        os.kill(os.getpid(), signal.SIGKILL)


def _describe(a: Action) -> str:
    if isinstance(a, Create):
        return f"create {a.obj['kind']} {a.obj['metadata']['name']}"
    if isinstance(a, Patch | Delete):
        return f"{type(a).__name__.lower()} {a.kind} {a.name}"
    return type(a).__name__


def _api_message(e: ApiException) -> str:
    try:
        return json.loads(e.body or "")["message"]  # no body: ValueError, the status line below
    except (TypeError, ValueError, KeyError):
        return f"{e.status} {e.reason}"


def post_event(kube: Kube, md: dict[str, Any], ev: Event, now: str) -> None:
    meta = md["metadata"]
    body = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ModelDeployment",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": ev.type,
        "reason": ev.reason,
        "message": ev.message[:1024],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "source": {"component": MANAGED_BY},
        "reportingComponent": MANAGED_BY,
    }
    kube.create_event(meta["namespace"], body)
    metrics.EVENTS.labels(ev.reason).inc()
