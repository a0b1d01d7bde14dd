"""The operator's own copy of what its watches delivered: ModelDeployments and the children they own.

Why: a reconcile's GET of its ModelDeployment and LISTs of its Deployments and Services are a
large share of the API server's requests at scale (bench/results/operator.md), and a label-selected
LIST makes the API server filter every object of the namespace, so its cost grows with the
namespace, per reconcile. controller-runtime reads from informer caches for the same reason.

What keeps a read from here as good as a fresh one:
- Newer wins: a copy replaces the kept one only if its resourceVersion is higher (etcd's revisions
  are integers). Watch events and the responses to our own writes arrive in either order.
- Our own writes go in with the API server's response (create, patch, status, annotations), so a
  pass never reads a copy older than what an earlier pass wrote. Our deletes leave a tombstone, so
  a late watch event of the deleted object does not bring it back.
- An owner's children are served from here only once they are known complete: the owner was first
  seen through a watch ADDED event (created while we watched, so every child of it came through
  this process or the watch), or a fresh LIST of them was stored since (`replace`).
- The caller reads fresh when it has reason to doubt the copy: the periodic resync (a watch that
  relists after a gap delivers no DELETED for what vanished in the gap), and after a create that
  met 409 or a write that met 404.

Copies are handed out deep-copied: plan() may build on them, and must not change what is kept.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from modeldeploy.operator.rollout.bundle import INSTANCE_LABEL, MANAGED_BY

# the children served from here (HTTPRoutes and Pods are listed fresh)
KINDS = ("Deployment", "Service", "NetworkPolicy")
MD = "ModelDeployment"
MAX_TOMBSTONES = 10_000  # deletes whose DELETED event has not come yet (a watch restart may lose it)
Ref = tuple[str, str, str]  # (kind, namespace, name)


def _version(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


def _owner(obj: Mapping[str, Any]) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller") and r.get("kind") == MD), None)


def _slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without managedFields (a few KB each, never read)."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    return {**obj, "metadata": meta}


class Store:
    """ModelDeployments by (namespace, name); Deployments, Services and NetworkPolicies by owner uid."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._objects: dict[Ref, dict[str, Any]] = {}
        self._owned: dict[str, set[Ref]] = {}  # owner uid -> its children's refs
        self._complete: set[str] = set()  # owner uids whose children are all here
        self._tombstones: dict[str, None] = {}  # uids we deleted (insertion-ordered, bounded)

    def put(self, obj: Mapping[str, Any], kind: str | None = None) -> None:
        """Keep `obj` (a watch event's object or a write's response) unless a newer copy is kept."""
        kind = kind or obj.get("kind")
        meta = obj.get("metadata") or {}
        if kind not in (MD, *KINDS) or not meta.get("name"):
            return
        ref = (kind, meta.get("namespace", ""), meta["name"])
        with self._guard:
            if meta.get("uid") in self._tombstones:
                return
            kept = self._objects.get(ref)
            if kept is not None and kept["metadata"].get("uid") == meta.get("uid"):
                old, new = _version(kept), _version(obj)
                if old is not None and new is not None and new <= old:
                    return
            if kept is not None:
                self._unown(ref, kept)
            self._objects[ref] = {**_slim(obj), "kind": kind}
            if kind != MD and (owner := _owner(obj)) is not None:
                self._owned.setdefault(owner, set()).add(ref)

    def drop(self, kind: str, namespace: str, name: str, uid: str | None = None) -> None:
        """Forget an object. `uid` given: its watch DELETED event (a copy of a newer object of the same
        name stays). None: our own delete succeeded; a late watch event of it is ignored (tombstone)."""
        ref = (kind, namespace, name)
        with self._guard:
            if uid is not None:
                self._tombstones.pop(uid, None)  # its last event came: nothing later can
            kept = self._objects.get(ref)
            if kept is None or (uid is not None and kept["metadata"].get("uid") != uid):
                return
            del self._objects[ref]
            self._unown(ref, kept)
            if uid is None and (gone := kept["metadata"].get("uid")):
                self._tombstones[gone] = None
                while len(self._tombstones) > MAX_TOMBSTONES:
                    del self._tombstones[next(iter(self._tombstones))]

    def _unown(self, ref: Ref, kept: Mapping[str, Any]) -> None:
        owner = _owner(kept) if ref[0] != MD else None
        if owner is not None and (refs := self._owned.get(owner)) is not None:
            refs.discard(ref)
            if not refs:
                del self._owned[owner]

    def md(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._guard:
            kept = self._objects.get((MD, namespace, name))
            return copy.deepcopy(kept) if kept is not None else None

    def complete(self, owner: str) -> None:
        """Every child of `owner` is known here: it was created while the watches ran."""
        with self._guard:
            self._complete.add(owner)

    def children(self, kind: str, owner: str, name: str) -> list[dict[str, Any]] | None:
        """`owner`'s children of `kind` as the operator's LIST would find them (labelled for `name`,
        sorted by name), or None when they are not known complete (read them fresh)."""
        with self._guard:
            if owner not in self._complete:
                return None
            found = [self._objects[r] for r in sorted(self._owned.get(owner, ())) if r[0] == kind]
            return [
                copy.deepcopy(o)
                for o in found
                if (labels := o["metadata"].get("labels") or {}).get(INSTANCE_LABEL) == name
                and labels.get("app.kubernetes.io/managed-by") == MANAGED_BY
            ]

    def replace(self, owner: str, namespace: str, listed: Mapping[str, list[dict[str, Any]]]) -> None:
        """A fresh LIST of `owner`'s children (kind -> items): kept ones it lacks are ghosts."""
        found = {(kind, namespace, o["metadata"]["name"]) for kind, items in listed.items() for o in items}
        with self._guard:
            for ref in list(self._owned.get(owner, ())):
                if ref[0] in listed and ref not in found:
                    self._unown(ref, self._objects.pop(ref))
        for kind, items in listed.items():
            for o in items:
                self.put(o, kind)
        self.complete(owner)

    def forget(self, namespace: str, name: str, owner: str | None) -> None:
        """The ModelDeployment is gone: drop it and whatever of its children is kept."""
        with self._guard:
            self._objects.pop((MD, namespace, name), None)
            if owner is not None:
                for ref in self._owned.pop(owner, ()):
                    self._objects.pop(ref, None)
                self._complete.discard(owner)

    def holds(self, namespace: str, name: str, owner: str) -> bool:
        """Whether anything of this ModelDeployment is kept (for tests: none once it is forgotten)."""
        with self._guard:
            return (MD, namespace, name) in self._objects or owner in self._owned or owner in self._complete
