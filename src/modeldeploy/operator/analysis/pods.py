"""Reaching serving pods over HTTP: which are Ready, their base URL, and a body read with a size bound.

Shared by the load probe (observe.py), the pod scrape (scrape.py) and the Prometheus client
(promql.py), so "Ready" and "too large" mean one thing everywhere in the operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's Ready condition is True (what Services and the rollout count as serving)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_pod_ips(pods: Sequence[dict[str, Any]]) -> list[str]:
    """IPs of Ready pods with an address, by pod name (so the same pods are scraped each time)."""
    ordered = sorted(pods, key=lambda p: p.get("metadata", {}).get("name", ""))
    return [p["status"]["podIP"] for p in ordered if pod_ready(p) and (p.get("status") or {}).get("podIP")]


def pod_url(target: str, port: int = PORT) -> str:
    """Base URL of a pod: a bare IPv4/IPv6 address gets `port`; "host:port" / "[v6]:port" keep theirs."""
    if target.startswith("["):
        host, _, rest = target.partition("]")
        return f"http://{host}]:{rest.removeprefix(':') or port}"
    if target.count(":") > 1:
        return f"http://[{target}]:{port}"
    return f"http://{target}" if ":" in target else f"http://{target}:{port}"


def read_bounded(response: httpx.Response, limit: int, what: str) -> bytes:
    """The streamed body, or ValueError("<what> larger than <limit> bytes") once it passes `limit`."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise ValueError(f"{what} larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
