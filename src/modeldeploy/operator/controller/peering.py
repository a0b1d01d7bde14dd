"""One active operator among replicas: kopf peering, with a priority rule and a gate of our own.

kopf pauses a replica's watch streams while the peering object (ClusterKopfPeering, or
KopfPeering per watched namespace) shows a live peer of a higher priority, and pauses EVERY
replica while two live peers share one priority. So each replica gets a priority of its own:
the older process wins (`start_priority`), so a replica that starts later, a restarted
container included, stands by instead of taking over, and a tie is broken by a random tail.

kopf's pause stops kopf's handlers only. The Controller's rollout ticks and the periodic resync
are threads and tasks of ours, and a standby that once saw an object would go on reconciling
it: `Peering.active(namespace)` applies kopf's own rule to the peering object, and the
Controller asks it before every reconcile. The active replica gone (deleted: it removes its
entry; killed: the entry expires after its lifetime), the next-oldest live replica resumes.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

PEERING_GROUP, PEERING_VERSION = "kopf.dev", "v1"
CACHE_S = 1.0  # one read of the peering object per second at most, whatever the reconcile rate


def start_priority(now_s: float | None = None, tail: int | None = None) -> int:
    """Falls with the start time (ms), so the oldest live replica has the highest; the random
    tail (0-999) separates replicas started in the same millisecond (equal priorities pause all).
    Magnitude ~1.8e15: an exact JSON number."""
    now_s = time.time() if now_s is None else now_s
    tail = random.randint(0, 999) if tail is None else tail
    return -(int(now_s * 1000) * 1000 + tail)


def own_identity() -> str:
    """kopf's convention: $POD_ID (the chart sets it to the pod name, so a restarted container
    takes over its own stale entry), else user@host and a random suffix."""
    return os.environ.get("POD_ID") or f"{getpass.getuser()}@{socket.gethostname()}/{os.urandom(3).hex()}"


def is_active(peers: Mapping[str, Any], identity: str, priority: int, now: dt.datetime) -> bool:
    """kopf's rule (process_peering_event): active unless another live peer's priority is >= ours."""
    for peer, info in peers.items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        try:
            seen = dt.datetime.fromisoformat(str(info["lastseen"]))
        except (KeyError, ValueError):
            seen = now  # kopf takes a peer without lastseen as seen now
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=dt.UTC)
        if seen + dt.timedelta(seconds=int(info.get("lifetime", 60))) <= now:
            continue  # dead: kopf cleans it up
        if int(info.get("priority", 0)) >= priority:
            return False
    return True


@dataclass(frozen=True)
class PeeringConfig:
    name: str
    identity: str
    priority: int
    clusterwide: bool


class Peering:
    """`active(namespace)` from the peering object, read at most once per CACHE_S per scope."""

    def __init__(
        self,
        custom: Any,  # kubernetes CustomObjectsApi
        cfg: PeeringConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.custom, self.cfg, self.clock = custom, cfg, clock
        self._guard = threading.Lock()
        self._cache: dict[str | None, tuple[float, bool]] = {}

    def active(self, namespace: str) -> bool:
        scope = None if self.cfg.clusterwide else namespace
        with self._guard:
            hit = self._cache.get(scope)
            if hit is not None and self.clock() - hit[0] < CACHE_S:
                return hit[1]
        result = is_active(self._peers(scope), self.cfg.identity, self.cfg.priority, dt.datetime.now(dt.UTC))
        with self._guard:
            self._cache[scope] = (self.clock(), result)
        return result

    def _peers(self, scope: str | None) -> Mapping[str, Any]:
        try:
            if scope is None:
                body = self.custom.get_cluster_custom_object(
                    PEERING_GROUP, PEERING_VERSION, "clusterkopfpeerings", self.cfg.name
                )
            else:
                body = self.custom.get_namespaced_custom_object(
                    PEERING_GROUP, PEERING_VERSION, scope, "kopfpeerings", self.cfg.name
                )
        except ApiException as e:
            if e.status == 404:  # mandatory peering without its object: kopf stays paused too
                return {"(no peering object)": {"priority": self.cfg.priority, "lifetime": 1 << 30}}
            raise
        return body.get("status") or {}


CONFIG: PeeringConfig | None = None  # set by `modeldeploy operator` when it runs with --peering
