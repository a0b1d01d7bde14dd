"""Closed-loop load on a Service's ready endpoints, for the rollout e2e and `modeldeploy demo`.

There is no kube-proxy in the local cluster, so the load reads the Service's real
EndpointSlices twice a second and spreads requests round-robin over the ready addresses,
as kube-proxy would. Bounded in requests and in time; results are kept per pod IP so a
test can tell the stable cohort's errors from the canary's.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
from kubernetes import client


class Load:
    """Closed-loop load on the `<name>` Service's endpoints; bounded in requests and time.

    `results` holds (time.monotonic() at the answer, pod ip, HTTP status or 0 for a transport
    error) per finished request.
    """

    def __init__(
        self,
        api: client.ApiClient,
        ns: str,
        service: str,
        workers: int = 4,
        max_requests: int = 50_000,
        max_seconds: float = 400.0,
        model: str = "tiny-llama",
        api_key: str | None = None,
    ) -> None:
        self.api, self.ns, self.service, self.model = api, ns, service, model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.workers, self.max_requests, self.deadline = workers, max_requests, time.monotonic() + max_seconds
        self.results: list[tuple[float, str, int]] = []
        self.transport_errors: Counter[str] = Counter()  # exception class -> count (the 0s in results)
        self.api_errors: Counter[str] = Counter()  # EndpointSlice reads that failed (API server down)
        self.endpoints: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _refresh(self) -> None:
        disc = client.DiscoveryV1Api(self.api)
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            try:
                slices = disc.list_namespaced_endpoint_slice(
                    self.ns, label_selector=f"kubernetes.io/service-name={self.service}", _request_timeout=5
                )
            except Exception as e:  # noqa: BLE001 - the API server down (a chaos run): keep the last list,
                self.api_errors[type(e).__name__] += 1  # as kube-proxy keeps its rules
                self._stop.wait(0.5)
                continue
            self.endpoints = sorted(
                a
                for s in slices.items
                for e in s.endpoints or []
                if (e.conditions is None or e.conditions.ready)
                for a in e.addresses
            )
            self._stop.wait(0.5)

    def _work(self, i: int) -> None:
        n = i
        with httpx.Client(timeout=30.0, headers=self.headers) as http:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                eps = self.endpoints
                with self._lock:
                    if len(self.results) >= self.max_requests:
                        return
                if not eps:
                    time.sleep(0.2)
                    continue
                ip = eps[n % len(eps)]
                n += 1
                try:
                    r = http.post(
                        f"http://{ip}:8000/v1/completions",
                        json={
                            "model": self.model,
                            "prompt": "The quick brown fox",
                            "max_tokens": 12,
                            "temperature": 0,
                        },
                    )
                    code = r.status_code
                except httpx.HTTPError as e:
                    code = 0
                    with self._lock:
                        self.transport_errors[f"{ip}: {type(e).__name__}"] += 1
                with self._lock:
                    self.results.append((time.monotonic(), ip, code))

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self._refresh, daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(self.workers)
        ]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=40)

    def by_ip(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {}
        with self._lock:
            for _, ip, code in self.results:
                out.setdefault(ip, Counter())[code] += 1
        return out
