"""A custom metrics API (custom.metrics.k8s.io) for the local cluster, so a real HPA can scale on pod metrics.

Test infrastructure, not product. prometheus-adapter is not served by the Go module proxy this project
builds from; the custom-metrics-apiserver library's own sample adapter is
(`sigs.k8s.io/custom-metrics-apiserver/test-adapter`, built by cluster/build.sh at
CUSTOM_METRICS_APISERVER_VERSION). It is a real aggregated API server (the library prometheus-adapter
and KEDA's metrics server are built on) whose values are written over HTTP
(`POST :8080/write-metrics/namespaces/NS/pods/POD/METRIC`). `Relay` plays prometheus-adapter's part:
it reads each Ready pod's own `/metrics` and writes the metric's value for that pod, so the HPA
controller in kube-controller-manager sees the runtime's figure through the aggregation layer.

Registration: kwokctl's kube-apiserver runs on this machine without kube-proxy, so the APIService
points at an ExternalName Service `localhost`, which the aggregator dials directly (https, the
adapter's self-signed certificate: insecureSkipTLSVerify).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.cluster.local import cache_root, pinned_versions

ADAPTER = (
    cache_root()
    / f"custom-metrics-apiserver-{pinned_versions()['CUSTOM_METRICS_APISERVER_VERSION']}"
    / "test-adapter"
)
WRITE_PORT = 8080  # the sample adapter's plain-HTTP write endpoint (fixed in its main.go)
GROUP = "custom.metrics.k8s.io"
VERSIONS = ("v1beta1", "v1beta2")
NAMESPACE = "kube-system"
SERVICE = "modeldeploy-custom-metrics"


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Adapter:
    """The sample adapter as a local process, registered as custom.metrics.k8s.io; `close()` undoes both."""

    def __init__(self, api: client.ApiClient, kubeconfig: str, workdir: Path) -> None:
        self.api, self.kubeconfig, self.workdir = api, kubeconfig, workdir
        self.port = _free_port()
        self.log = workdir / "custom-metrics-adapter.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        kc = f"={self.kubeconfig}"
        argv = [
            str(ADAPTER),
            f"--secure-port={self.port}",
            "--bind-address=127.0.0.1",
            f"--cert-dir={self.workdir / 'certs'}",
            f"--lister-kubeconfig{kc}",
            f"--authentication-kubeconfig{kc}",
            f"--authorization-kubeconfig{kc}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez",
            "--v=2",
        ]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._register()
        reg = client.ApiregistrationV1Api(self.api)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"adapter exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            conds = {v: reg.read_api_service(f"{v}.{GROUP}").status for v in VERSIONS}
            available = (  # a status not written yet is not Available yet
                (
                    s is not None
                    and any(c.type == "Available" and c.status == "True" for c in s.conditions or [])
                )
                for s in conds.values()
            )
            if all(available):
                return
            time.sleep(0.5)
        raise TimeoutError(
            f"APIService {GROUP} not Available in {timeout}s: {conds}; {self.log.read_text()[-2000:]}"
        )

    def _register(self) -> None:
        core, reg = client.CoreV1Api(self.api), client.ApiregistrationV1Api(self.api)
        svc = {"metadata": {"name": SERVICE}, "spec": {"type": "ExternalName", "externalName": "localhost"}}
        _create_or_replace(
            lambda: core.create_namespaced_service(NAMESPACE, K.body(svc)),
            lambda: core.delete_namespaced_service(SERVICE, NAMESPACE),
        )
        for i, v in enumerate(VERSIONS):
            body = {
                "metadata": {"name": f"{v}.{GROUP}"},
                "spec": {
                    "group": GROUP,
                    "version": v,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100 + i,
                    "insecureSkipTLSVerify": True,
                    "service": {"namespace": NAMESPACE, "name": SERVICE, "port": self.port},
                },
            }
            _create_or_replace(
                lambda b=body: reg.create_api_service(b),
                lambda b=body: reg.delete_api_service(b["metadata"]["name"]),
            )

    def close(self) -> None:
        reg, core = client.ApiregistrationV1Api(self.api), client.CoreV1Api(self.api)
        for v in VERSIONS:
            _ignore_404(lambda v=v: reg.delete_api_service(f"{v}.{GROUP}"))
        _ignore_404(lambda: core.delete_namespaced_service(SERVICE, NAMESPACE))
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)


def _ignore_404(fn: Any) -> None:
    try:
        fn()
    except ApiException as e:
        if e.status != 404:
            raise


def _create_or_replace(create: Any, delete: Any) -> None:
    try:
        create()
    except ApiException as e:
        if e.status != 409:
            raise
        delete()  # left by an interrupted run
        create()


def metric_value(text: str, name: str) -> float | None:
    """The sum of `name`'s samples in a Prometheus text exposition (None when absent)."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ")
    ]
    return sum(values) if values else None


class Relay:
    """Every `period_s`, each Ready pod matching `selector` in `ns`: its `/metrics` value of `metric`
    written to the adapter for that pod. Bounded: at most `max_rounds` rounds; `seen` keeps what
    was written."""

    def __init__(
        self,
        api: client.ApiClient,
        ns: str,
        selector: str,
        metric: str,
        port: int = 8000,
        period_s: float = 1.0,
        max_rounds: int = 900,
    ) -> None:
        self.core, self.ns, self.selector, self.metric, self.port = (
            client.CoreV1Api(api),
            ns,
            selector,
            metric,
            port,
        )
        self.period_s, self.max_rounds = period_s, max_rounds
        self.seen: list[tuple[float, str, float]] = []  # (monotonic time, pod, value written)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=3.0) as http:
            for _ in range(self.max_rounds):
                if self._stop.is_set():
                    return
                try:
                    self._round(http)
                except (ApiException, httpx.HTTPError, ValueError) as e:
                    self.errors.append(f"{type(e).__name__}: {e}"[:300])
                self._stop.wait(self.period_s)

    def _round(self, http: httpx.Client) -> None:
        for p in self.core.list_namespaced_pod(self.ns, label_selector=self.selector).items:
            st, pod = K.pod_status(p), K.name(p)
            ready = any(c.type == "Ready" and c.status == "True" for c in st.conditions or [])
            if not ready or not st.pod_ip or K.meta(p).deletion_timestamp is not None:
                continue
            value = metric_value(http.get(f"http://{st.pod_ip}:{self.port}/metrics").text, self.metric)
            if value is None:
                continue
            url = f"http://127.0.0.1:{WRITE_PORT}/write-metrics/namespaces/{self.ns}/pods/{pod}/{self.metric}"
            r = http.post(url, json=f"{value:g}")
            r.raise_for_status()
            self.seen.append((time.monotonic(), pod, value))

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
