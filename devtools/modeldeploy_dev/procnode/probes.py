"""Kubelet-style probes (httpGet, tcpSocket) against a pod IP, with thresholds and periods."""

from __future__ import annotations

import http.client
import socket
import time
from dataclasses import dataclass
from typing import Any


def resolve_port(port: Any, container: Any) -> int:
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    for p in container.ports or []:
        if p.name == port:
            return int(p.container_port)
    raise ValueError(f"probe port {port!r} is not a container port of {container.name}")


def probe_once(probe: Any, container: Any, pod_ip: str) -> tuple[bool, str]:
    """One attempt; returns (success, message). Only addresses on this machine are contacted."""
    timeout = float(probe.timeout_seconds or 1)
    try:
        if probe.http_get is not None:
            g = probe.http_get
            port = resolve_port(g.port, container)
            host = g.host or pod_ip
            cls = (
                http.client.HTTPSConnection
                if (g.scheme or "HTTP").upper() == "HTTPS"
                else http.client.HTTPConnection
            )
            conn = cls(host, port, timeout=timeout)
            try:
                headers = {h.name: h.value for h in g.http_headers or []}
                conn.request("GET", g.path or "/", headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            ok = 200 <= status < 400
            return ok, f"HTTP probe {g.path or '/'} on port {port}: status {status}"
        if probe.tcp_socket is not None:
            port = resolve_port(probe.tcp_socket.port, container)
            with socket.create_connection((probe.tcp_socket.host or pod_ip, port), timeout=timeout):
                return True, f"TCP probe port {port}: connected"
        return False, "unsupported probe type on the process node (only httpGet and tcpSocket)"
    except (OSError, http.client.HTTPException, ValueError) as e:
        return False, f"probe failed: {e}"


@dataclass
class ProbeState:
    """Counts consecutive results the way kubelet does; `result` is None until decided."""

    probe: Any
    started_at: float
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0
    result: bool | None = None
    message: str = ""

    def __post_init__(self) -> None:
        self.next_at = self.started_at + float(self.probe.initial_delay_seconds or 0)

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, ok: bool, message: str, now: float) -> None:
        self.message = message
        self.next_at = now + float(self.probe.period_seconds or 10)
        if ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= int(self.probe.success_threshold or 1):
                self.result = True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.probe.failure_threshold or 3):
                self.result = False


def now() -> float:
    return time.monotonic()
