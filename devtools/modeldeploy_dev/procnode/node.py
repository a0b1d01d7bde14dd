"""The process node: test infrastructure that stands in for kubelet + container runtime.

NOT product code. For every pod the scheduler binds to this node whose container command is the
`modeldeploy` CLI, it runs that command as a local process in a network namespace of its own on
a host-local bridge (see net.py), writes status.podIP / phase / container states / conditions,
runs the pod's httpGet/tcpSocket readiness, liveness and startup probes, restarts per
restartPolicy, and on deletion sends SIGTERM, waits the grace period, sends SIGKILL, then removes
the pod object (as kubelet does). It registers its Node (GPU labels, capacity and taint like the
kwok nodes) and keeps it Ready with a Lease renewed every 10 s and a status heartbeat every 30 s.

Pods are found by listing `spec.nodeName=<node>` every 0.5 s (simple and robust for a handful of
pods; a watch would add reconnect logic for no gain here). `kubectl logs/exec` do not work: the
container output is in <state-dir>/pods/<uid>/<container>.log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from modeldeploy.operator.rollout.progression import RFC3339
from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.cluster.nodes import gpu_node
from modeldeploy_dev.procnode.net import Network
from modeldeploy_dev.procnode.pids import kill_leftovers
from modeldeploy_dev.procnode.worker import PodWorker

log = logging.getLogger("procnode")
LEASE_SECONDS = 40
SMP = "application/strategic-merge-patch+json"  # the client would default to json-patch


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class ProcessNode:
    def __init__(self, api: client.ApiClient, name: str, net: Network, state: Path) -> None:
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.name = name
        self.net = net
        self.state = state
        self.workers: dict[str, PodWorker] = {}
        self.shutdown = threading.Event()
        self.ip = str(net.gateway)

    # --- node registration and heartbeats --------------------------------------------------
    def _conditions(self) -> list[dict[str, Any]]:
        t = _now().strftime(RFC3339)
        pressure = [
            (k, "False", f"KubeletHas{r}")
            for k, r in (
                ("MemoryPressure", "SufficientMemory"),
                ("DiskPressure", "NoDiskPressure"),
                ("PIDPressure", "SufficientPID"),
            )
        ]
        return [
            {
                "type": k,
                "status": s,
                "reason": r,
                "message": "process node",
                "lastHeartbeatTime": t,
                "lastTransitionTime": t,
            }
            for k, s, r in [*pressure, ("Ready", "True", "KubeletReady")]
        ]

    def register(self) -> None:
        body = gpu_node(self.name, "process")
        try:
            self.core.create_node(K.body(body))
        except ApiException as e:
            if e.status != 409:
                raise
        status = {
            "capacity": body["status"]["capacity"],
            "allocatable": body["status"]["allocatable"],
            "conditions": self._conditions(),
            "addresses": [
                {"type": "InternalIP", "address": self.ip},
                {"type": "Hostname", "address": self.name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "modeldeploy-procnode",
                "containerRuntimeVersion": "process://",
                "kernelVersion": "",
                "osImage": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
        }
        self.core.patch_node_status(self.name, {"status": status}, _content_type=SMP)
        self.renew_lease()

    def renew_lease(self) -> None:
        now = _now()
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now}
        try:
            self.coord.patch_namespaced_lease(
                self.name, "kube-node-lease", {"spec": spec}, _content_type="application/merge-patch+json"
            )
        except ApiException as e:
            if e.status != 404:
                raise
            node = self.core.read_node(self.name)
            owner = {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": K.uid(node)}
            self.coord.create_namespaced_lease(
                "kube-node-lease",
                K.body({"metadata": {"name": self.name, "ownerReferences": [owner]}, "spec": spec}),
            )

    def _heartbeat(self) -> None:
        last_status = time.monotonic()
        while not self.shutdown.wait(10):
            try:
                self.renew_lease()
                if time.monotonic() - last_status > 30:
                    self.core.patch_node_status(
                        self.name, {"status": {"conditions": self._conditions()}}, _content_type=SMP
                    )
                    last_status = time.monotonic()
            except (ApiException, TransportError, OSError) as e:  # API server down: a kubelet retries
                log.warning("heartbeat failed: %s", e)

    # --- pods ------------------------------------------------------------------------------
    def sync(self) -> None:
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.name}").items
        seen = set()
        for pod in pods:
            uid, meta = K.uid(pod), K.meta(pod)
            seen.add(uid)
            w = self.workers.get(uid)
            if meta.deletion_timestamp is not None:
                if w is None:
                    self._finalize(pod)
                    continue
                g = meta.deletion_grace_period_seconds
                w.request_stop(float(30 if g is None else g))
                if w.stopped.is_set():
                    self._finalize(pod)
                    del self.workers[uid]
                continue
            if w is None:
                if K.pod_status(pod).phase in ("Succeeded", "Failed"):
                    continue
                w = PodWorker(pod, self.core, self.net, self.state, self.ip)
                self.workers[uid] = w
                w.start()
            else:
                w.update(pod)
        for uid in list(self.workers):
            if uid not in seen:  # force-deleted: stop now
                self.workers[uid].request_stop(0)
                if self.workers[uid].stopped.wait(0):
                    del self.workers[uid]

    def _finalize(self, pod: Any) -> None:
        """The containers are gone: remove the pod object for good, as kubelet does."""
        self.net.remove_pod(pod.metadata.uid)
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
                ),
            )

    # --- main ------------------------------------------------------------------------------
    def run(self) -> None:
        kill_leftovers(self.state)  # a node that was SIGKILLed leaves its pods' processes behind
        self.net.ensure_bridge()
        self.register()
        hb = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        hb.start()
        signal.signal(signal.SIGTERM, lambda *_: self.shutdown.set())
        signal.signal(signal.SIGINT, lambda *_: self.shutdown.set())
        log.info("process node %s ready (bridge %s, pods on %s)", self.name, self.net.bridge, self.net.net)
        while not self.shutdown.is_set():
            try:
                self.sync()
            except (ApiException, TransportError, OSError) as e:  # API server down: keep the pods, retry
                log.warning("sync failed: %s", e)
            self.shutdown.wait(0.5)
        self.stop()

    def stop(self) -> None:
        """Node shutdown: stop every pod (SIGTERM, grace capped at 30 s, SIGKILL), then the network."""
        log.info("stopping %d pod(s)", len(self.workers))
        for w in self.workers.values():
            g = w.pod.spec.termination_grace_period_seconds
            w.request_stop(min(30.0, float(30 if g is None else g)))
        for w in self.workers.values():
            w.stopped.wait(45)
        self.net.destroy_all()
        log.info("process node stopped")
