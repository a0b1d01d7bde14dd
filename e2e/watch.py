"""Polls what a rollout changes, every 0.1 s, keeping when each change was first seen.

For timing figures without timed assertions: the Events of a ModelDeployment (first time
each reason appears), its HTTPRoute's canary weight, and the ready addresses behind its
`<name>` Service, each as a list of (monotonic time, value) at every change. Bounded in time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

ROUTE = ("gateway.networking.k8s.io", "v1", "httproutes")


def weights(route: dict[str, Any]) -> dict[str, int]:
    """Service -> weight in the weighted (last) rule of an HTTPRoute."""
    return {b["name"]: b.get("weight", 1) for b in route["spec"]["rules"][-1]["backendRefs"]}


class Watch:
    def __init__(
        self, api: client.ApiClient, ns: str, name: str, route: bool = False, max_seconds: float = 600.0
    ) -> None:
        self.core, self.custom, self.disc = (
            client.CoreV1Api(api),
            client.CustomObjectsApi(api),
            client.DiscoveryV1Api(api),
        )
        self.ns, self.name, self.route, self.max_seconds = ns, name, route, max_seconds
        self.seen: dict[str, float] = {}  # Event reason -> first seen
        self.weights: list[tuple[float, int]] = []  # (seen at, canary weight in the HTTPRoute)
        self.endpoints: list[tuple[float, frozenset[str]]] = []  # (seen at, ready addresses of <name>)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            now = time.monotonic()
            try:
                self._sample(now)
            except ApiException:
                pass
            self._stop.wait(0.1)

    def _sample(self, now: float) -> None:
        for e in self.core.list_namespaced_event(self.ns).items:
            if e.involved_object.name == self.name:
                self.seen.setdefault(e.reason, now)
        slices = self.disc.list_namespaced_endpoint_slice(
            self.ns, label_selector=f"kubernetes.io/service-name={self.name}"
        )
        ready = frozenset(
            a
            for s in slices.items
            for e in s.endpoints or []
            if e.conditions is None or e.conditions.ready
            for a in e.addresses
        )
        if not self.endpoints or self.endpoints[-1][1] != ready:
            self.endpoints.append((now, ready))
        if self.route:
            r = self.custom.get_namespaced_custom_object(*ROUTE[:2], self.ns, ROUTE[2], self.name)
            w = weights(r).get(f"{self.name}-canary", 0)
            if not self.weights or self.weights[-1][1] != w:
                self.weights.append((now, w))

    def left(self, address: str, after: float) -> float | None:
        """When `address` was first seen gone from the ready endpoints at or after `after`."""
        return next((t for t, eps in self.endpoints if t >= after and address not in eps), None)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
