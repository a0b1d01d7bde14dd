"""One pod on the process node: its network namespace, its container processes, probes, status.

Runs as a thread. Containers are started with `ip netns exec <pod netns>` in their own process
group; output goes to <state>/pods/<uid>/<container>.log. Stopping follows kubelet: SIGTERM to
the group, wait the grace period, then SIGKILL. Exits are restarted per restartPolicy with a
capped exponential back-off (1 s doubling to 20 s; kubelet uses 10 s to 5 min, too slow for tests).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from modeldeploy.operator.rollout.progression import RFC3339
from modeldeploy_dev.procnode.net import Network
from modeldeploy_dev.procnode.pids import proc_start_time
from modeldeploy_dev.procnode.podstatus import pod_status
from modeldeploy_dev.procnode.probes import ProbeState, now, probe_once
from modeldeploy_dev.procnode.spec import UnsupportedPod, build_launch

log = logging.getLogger("procnode")


def ts() -> str:
    return dt.datetime.now(dt.UTC).strftime(RFC3339)


class Container:
    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.started_at = ""
        self.waiting: tuple[str, str] = ("ContainerCreating", "")
        self.terminated: dict[str, Any] | None = None
        self.last_state: dict[str, Any] | None = None
        self.next_start = 0.0
        self.ready = False
        self.startup_ok = spec.startup_probe is None
        self.probes: dict[str, ProbeState] = {}
        self.done = False  # terminated and not to be restarted

    def state(self) -> dict[str, Any]:
        if self.proc is not None:
            return {"running": {"startedAt": self.started_at}}
        if self.terminated is not None and (self.done or self.waiting[0] != "CrashLoopBackOff"):
            return {"terminated": self.terminated}
        return {"waiting": {"reason": self.waiting[0], "message": self.waiting[1]}}


class PodWorker(threading.Thread):
    def __init__(self, pod: Any, core: client.CoreV1Api, net: Network, state: Path, node_ip: str) -> None:
        super().__init__(name=f"pod-{pod.metadata.namespace}/{pod.metadata.name}", daemon=True)
        self.pod = pod
        self.core = core
        self.net = net
        self.node_ip = node_ip
        self.uid: str = pod.metadata.uid
        self.dir = state / "pods" / self.uid
        self.state_root = state
        self.stop_grace: float | None = None
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.pod_ip = ""
        self.netns = ""
        self.start_time = ts()
        self.containers = [Container(c) for c in pod.spec.containers]
        self.inits = [Container(c) for c in pod.spec.init_containers or []]
        self.init_failed = False
        self.transitions: dict[str, tuple[str, str]] = {}
        self.last_status: str = ""
        self.unsupported = ""

    # --- control from the node loop ----------------------------------------------------------
    def request_stop(self, grace: float) -> None:
        with self.lock:
            self.stop_grace = grace if self.stop_grace is None else min(grace, self.stop_grace)

    def update(self, pod: Any) -> None:
        self.pod = pod

    # --- thread ----------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # keep the node alive; say why in the pod's status and the node log
            log.exception("pod worker %s failed", self.name)
            self.unsupported = f"process node error: {e}"
            for c in self.containers:
                c.waiting = ("ProcessNodeError", self.unsupported)
            self._publish()
        finally:
            self._kill_all(self.stop_grace or 0)
            self.net.remove_pod(self.uid)
            self.stopped.set()

    def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.netns, self.pod_ip = self.net.add_pod(self.uid)
        log.info("%s: netns %s ip %s", self.name, self.netns, self.pod_ip)
        terminal = False
        while self.stop_grace is None:
            t = now()
            if not terminal:
                if self.inits_done():
                    for c in self.containers:
                        self._step(c, t)
                else:
                    self._step_init(t)
                terminal = self.init_failed or all(c.done for c in self.containers)
                if terminal:
                    self.net.remove_pod(self.uid)  # like kubelet tearing down the sandbox
            self._publish()
            self.stopped.wait(0.25)
        self._kill_all(self.stop_grace)
        self._publish()

    def inits_done(self) -> bool:
        return all(c.done and (c.terminated or {}).get("exitCode") == 0 for c in self.inits)

    def _step_init(self, t: float) -> None:
        """Init containers run one at a time, in order, each to exit 0 (kubelet semantics)."""
        c = next(c for c in self.inits if not c.done)
        if c.proc is None:
            if not self.unsupported and t >= c.next_start:
                self._start(c)
            return
        rc = c.proc.poll()
        if rc is None:
            return
        c.terminated = {
            "exitCode": rc if rc >= 0 else 128 - rc,
            "reason": "Completed" if rc == 0 else "Error",
            "startedAt": c.started_at,
            "finishedAt": ts(),
        }
        c.proc = None
        if rc == 0:
            c.done = True
        elif (self.pod.spec.restart_policy or "Always") == "Never":
            c.done = True
            self.init_failed = True
        else:
            c.last_state = {"terminated": c.terminated}
            c.restarts += 1
            c.next_start = now() + min(20.0, 2.0 ** (c.restarts - 1))
            c.waiting = ("CrashLoopBackOff", f"back-off restarting init container {c.spec.name} (exit {rc})")

    def _step(self, c: Container, t: float) -> None:
        if c.done:
            return
        if c.proc is None:
            if self.unsupported or t < c.next_start:
                return
            self._start(c)
            return
        rc = c.proc.poll()
        if rc is not None:
            self._exited(c, rc, "Completed" if rc == 0 else "Error")
            return
        self._probe(c, t)

    def _start(self, c: Container) -> None:
        try:
            launch = build_launch(self.pod, c.spec, self.core, self.pod_ip, self.state_root)
        except (UnsupportedPod, ApiException) as e:
            reason = (
                "ProcessNodeUnsupported" if isinstance(e, UnsupportedPod) else "CreateContainerConfigError"
            )
            self.unsupported = str(e)
            c.waiting = (reason, str(e))
            return
        logf = open(self.dir / f"{c.spec.name}.log", "ab")  # noqa: SIM115 - owned by the child
        logf.write(f"--- {ts()} start #{c.restarts}: {' '.join(launch.argv)}\n".encode())
        logf.flush()
        c.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, *launch.argv],
            env=launch.env,
            cwd=launch.cwd,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        logf.close()
        with contextlib.suppress(OSError):  # for kill_leftovers() after a crash of the node
            (self.dir / f"{c.spec.name}.pid").write_text(f"{c.proc.pid} {proc_start_time(c.proc.pid)}")
        c.started_at = ts()
        c.ready = False
        c.startup_ok = c.spec.startup_probe is None
        t = now()
        c.probes = {
            k: ProbeState(p, t)
            for k, p in (
                ("startup", c.spec.startup_probe),
                ("readiness", c.spec.readiness_probe),
                ("liveness", c.spec.liveness_probe),
            )
            if p is not None
        }
        log.info("%s/%s started pid %d", self.name, c.spec.name, c.proc.pid)

    def _probe(self, c: Container, t: float) -> None:
        order = ["startup"] if not c.startup_ok else ["liveness", "readiness"]
        for kind in order:
            ps = c.probes.get(kind)
            if ps is None or not ps.due(t):
                continue
            ok, msg = probe_once(ps.probe, c.spec, self.pod_ip)
            ps.record(ok, msg, now())
            if kind == "startup" and ps.result is not None:
                if ps.result:
                    c.startup_ok = True
                    for k in ("liveness", "readiness"):
                        if k in c.probes:
                            c.probes[k].next_at = now()
                else:
                    self._restart_for(c, f"Startup probe failed: {msg}")
            elif kind == "liveness" and ps.result is False:
                self._restart_for(c, f"Liveness probe failed: {msg}")
                return
            elif kind == "readiness" and ps.result is not None:
                c.ready = ps.result
        if "readiness" not in c.probes and c.startup_ok:
            c.ready = True

    def _restart_for(self, c: Container, why: str) -> None:
        log.info("%s/%s: %s", self.name, c.spec.name, why)
        rc = self._kill(c, self._grace())
        self._exited(c, rc, "Error", message=why)

    def _exited(self, c: Container, rc: int, reason: str, message: str = "") -> None:
        c.terminated = {
            "exitCode": rc if rc >= 0 else 128 - rc,
            "reason": reason,
            "message": message,
            "startedAt": c.started_at,
            "finishedAt": ts(),
        }
        if rc < 0:
            c.terminated["signal"] = -rc
        c.proc = None
        c.ready = False
        policy = self.pod.spec.restart_policy or "Always"
        if policy == "Always" or (policy == "OnFailure" and rc != 0):
            c.last_state = {"terminated": c.terminated}
            c.restarts += 1
            c.next_start = now() + min(20.0, 2.0 ** (c.restarts - 1))
            c.waiting = ("CrashLoopBackOff", f"back-off restarting container {c.spec.name} (exit {rc})")
        else:
            c.done = True

    # --- stopping --------------------------------------------------------------------------
    def _grace(self) -> float:
        g = self.pod.spec.termination_grace_period_seconds
        return float(30 if g is None else g)

    def _kill(self, c: Container, grace: float) -> int:
        p = c.proc
        if p is None:
            return 0
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            return p.wait(timeout=max(grace, 0.1))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            return p.wait(timeout=10)

    def _pre_stop(self, c: Container, grace: float) -> None:
        """lifecycle.preStop: `sleep` and `httpGet` hooks; their time counts against the grace period."""
        hook = c.spec.lifecycle.pre_stop if c.spec.lifecycle else None
        if hook is None or c.proc is None:
            return
        if hook.sleep is not None:
            self.stopped.wait(min(float(hook.sleep.seconds), grace))
        elif hook.http_get is not None:
            probe_once(
                type(
                    "Hook",
                    (),
                    {"http_get": hook.http_get, "tcp_socket": None, "timeout_seconds": max(1, int(grace))},
                )(),
                c.spec,
                self.pod_ip,
            )

    def _kill_all(self, grace: float) -> None:
        t0 = now()
        for c in self.containers:
            self._pre_stop(c, grace)
        grace = max(0.0, grace - (now() - t0))
        for c in [*self.inits, *self.containers]:
            if c.proc is not None:
                rc = self._kill(c, grace)
                c.terminated = {
                    "exitCode": rc if rc >= 0 else 128 - rc,
                    "reason": "Completed" if rc == 0 else "Error",
                    "startedAt": c.started_at,
                    "finishedAt": ts(),
                }
                c.proc = None
                c.done = True
                c.ready = False
                with open(self.dir / f"{c.spec.name}.log", "ab") as f:
                    f.write(f"--- {ts()} stopped (grace {grace:.0f}s) exit {rc}\n".encode())

    # --- status ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return pod_status(self)

    def _publish(self) -> None:
        st = self.status()
        key = json.dumps(st, sort_keys=True)
        if key == self.last_status:
            return
        try:
            self.core.patch_namespaced_pod_status(
                self.pod.metadata.name,
                self.pod.metadata.namespace,
                {"status": st},
                _content_type="application/merge-patch+json",
            )
            self.last_status = key
        except ApiException as e:
            if e.status != 404:
                log.warning("%s: status patch failed: %s", self.name, e.reason)
        except (TransportError, OSError) as e:  # the API server down: the containers run on, retry later
            log.warning("%s: status patch failed: %s", self.name, e)
