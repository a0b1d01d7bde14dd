"""Faults for chaos runs on the local cluster: control-plane processes SIGKILLed and restarted, a
pod's serving process SIGKILLed, a Prometheus frozen.

Test infrastructure only: the product has no fault switch. Every fault here is what an operator
meets in a real cluster (a crashed kube-apiserver or etcd that its supervisor restarts, a container
killed by the OOM killer, a metrics backend that stops answering), made with signals on the
processes kwokctl and the process node started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from modeldeploy_dev.cluster.local import LocalCluster
from modeldeploy_dev.e2e_cluster import E2ECluster
from modeldeploy_dev.wait import wait_until

CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok-controller")


def component_pid(local: LocalCluster, component: str) -> int:
    """The pid kwokctl recorded for `component` (binary runtime: <cluster>/pids/<component>.pid)."""
    if component not in CONTROL_PLANE:
        raise ValueError(f"component: {component!r} is not one of {CONTROL_PLANE}")
    return int((local.cluster_dir / "pids" / f"{component}.pid").read_text().split()[0])


def kill_component(local: LocalCluster, component: str) -> float:
    """SIGKILL one control-plane process (no graceful shutdown: what a crash or an OOM kill does);
    returns the time.monotonic() of the kill."""
    pid = component_pid(local, component)
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # not our child in practice; kwokctl detached it
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10, 0.05, f"{component} pid {pid} gone")
    return time.monotonic()


def restart_control_plane(cluster: E2ECluster, timeout: float = 120) -> float:
    """`kwokctl start cluster` starts the components that are not running (the supervisor's job
    in a real cluster); returns the time.monotonic() when the API server answers /readyz again."""
    assert cluster.local is not None, "an external cluster: its control plane is not ours to restart"
    r = cluster.local.kwokctl("start", "cluster", check=False, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"kwokctl start cluster failed:\n{r.stdout}\n{r.stderr}")
    wait_until(
        lambda: cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=10).stdout.strip() == "ok",
        timeout,
        0.2,
        "kube-apiserver /readyz ok after the restart",
        ignore=(subprocess.TimeoutExpired,),
    )
    return time.monotonic()


def alive(local: LocalCluster, component: str) -> bool:
    try:
        return Path(f"/proc/{component_pid(local, component)}").exists()
    except (OSError, ValueError):
        return False


class Supervisor:
    """What the kubelet does for a static-pod control plane: starts again a control-plane process
    that exited. kube-controller-manager and kube-scheduler exit on purpose when they cannot renew
    their leader lease (the API server or etcd down for more than ~10 s), and a real node brings
    them back; without this, a chaos run would test kwokctl, not the operator. While `held` (the
    fault itself), nothing is restarted; `restarts` records (time.monotonic(), components)."""

    def __init__(self, cluster: E2ECluster, interval: float = 1.0) -> None:
        assert cluster.local is not None, "an external cluster: its control plane is not ours to supervise"
        self.cluster, self.local, self.interval = cluster, cluster.local, interval
        self.held = threading.Event()
        self.restarts: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.held.is_set():
                continue
            dead = [c for c in CONTROL_PLANE if not alive(self.local, c)]
            if dead:
                restart_control_plane(self.cluster)
                self.restarts.append((time.monotonic(), dead))

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)


def api_down(cluster: E2ECluster) -> bool:
    """The API server refuses or times out (what the operator sees while it is down)."""
    r = cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
    return r.stdout.strip() != "ok"


def kill_pod_process(cluster: E2ECluster, ns: str, pod: str) -> int:
    """SIGKILL the process group of a process-node pod's first container (its container ID is
    `process://<pid>`), as the OOM killer would; the node restarts it per restartPolicy. Returns
    the pid killed."""
    p = cluster.core.read_namespaced_pod(pod, ns)
    cid = (p.status.container_statuses or [None])[0]
    if cid is None or not (cid.container_id or "").startswith("process://"):
        raise ValueError(f"pod {ns}/{pod}: not a running process-node container ({cid})")
    pid = int(cid.container_id.removeprefix("process://"))
    os.killpg(pid, signal.SIGKILL)
    return pid


class Frozen:
    """A process stopped with SIGSTOP (it keeps its sockets: clients connect and then time out,
    the worst kind of unreachable), resumed with SIGCONT on exit."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> Frozen:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
