"""A real Prometheus (built from its Go module by devtools/modeldeploy_dev/cluster/build.sh) for
analysis tests.

Static targets with a `namespace` label, and optionally a file-discovered job whose target
file a test rewrites as pods come and go (there is no Kubernetes discovery in this build).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT
from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.cluster.local import Binaries, cache_root, pinned_versions
from modeldeploy_dev.wait import wait_until

if TYPE_CHECKING:
    from modeldeploy_dev.e2e_cluster import E2ECluster

PROMETHEUS = Binaries(cache_root(), pinned_versions()).prometheus


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_targets(path: Path, targets: list[str], labels: dict[str, str]) -> None:
    """Prometheus file_sd format, replaced atomically so a reload never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": sorted(targets), "labels": labels}]))
    os.replace(tmp, path)


class Prom:
    """A real Prometheus on 127.0.0.1 with a generated config; `stop()` kills it."""

    def __init__(
        self,
        tmp: Path,
        targets: dict[str, tuple[str, str]],
        file_sd: Path | None = None,
        labels: dict[str, dict[str, str]] | None = None,
        honor_labels: tuple[str, ...] = (),
    ) -> None:
        """`targets`: job -> (host:port, namespace label); `file_sd`: a target file to watch (job "pods");
        `labels`: job -> more target labels (what a PodMonitor's relabelings would add);
        `honor_labels`: jobs whose own labels win over target labels (as the chart's ServiceMonitor sets)."""
        extra = labels or {}
        jobs = "".join(
            f"  - job_name: {job}\n    honor_labels: {str(job in honor_labels).lower()}\n"
            f"    static_configs:\n      - targets: ['{t}']\n"
            f"        labels: {json.dumps({'namespace': ns, **extra.get(job, {})})}\n"
            for job, (t, ns) in targets.items()
        )
        if file_sd is not None:
            jobs += (
                f"  - job_name: pods\n    file_sd_configs:\n"
                f"      - files: ['{file_sd}']\n        refresh_interval: 1s\n"
            )
        cfg = tmp / "prometheus.yml"
        cfg.write_text(f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{jobs}")
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
                "--log.level=warn",
            ],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:

        def ready() -> bool:
            assert self.proc.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
            return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200

        wait_until(ready, timeout_s, 0.2, f"prometheus {self.url} ready", ignore=(httpx.TransportError,))

    def scraped_after(self, t: float, jobs: int, timeout_s: float = 20.0) -> None:
        """Wait until every job's target was scraped successfully at a time after `t` (epoch seconds)."""
        q = f"(timestamp(up) > {t:.3f}) and on (job, instance) up == 1"  # timestamp() of the selector itself

        def scraped() -> bool:
            r = httpx.get(self.url + "/api/v1/query", params={"query": q}, timeout=5).json()
            return len(r["data"]["result"]) >= jobs

        wait_until(scraped, timeout_s, 0.2, f"Prometheus to scrape all {jobs} targets after {t}")

    def queries_served(self) -> float:
        """How many /api/v1/query requests this Prometheus answered (its own /metrics counter)."""
        text = httpx.get(self.url + "/metrics", timeout=5).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


class PodTargets:
    """Rewrites Prometheus' target file from the object's pods twice a second (bounded; what
    kubernetes_sd would do, which this build lacks). API errors keep the last list."""

    def __init__(self, cluster: E2ECluster, ns: str, name: str, path: Path) -> None:
        self.cluster, self.ns, self.name, self.path = cluster, ns, name, path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        write_targets(path, [], {"namespace": ns})

    def _run(self) -> None:
        for _ in range(2400):  # at most 20 minutes
            if self._stop.is_set():
                return
            try:
                pods = self.cluster.core.list_namespaced_pod(
                    self.ns, label_selector=f"app.kubernetes.io/instance={self.name}", _request_timeout=5
                )
            except Exception:  # noqa: BLE001 - the API server down (a chaos run): keep the targets
                self._stop.wait(0.5)
                continue
            write_targets(
                self.path,
                [f"{ip}:{PORT}" for ip in (K.pod_status(p).pod_ip for p in pods.items) if ip],
                {"namespace": self.ns},
            )
            self._stop.wait(0.5)

    def __enter__(self) -> PodTargets:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
