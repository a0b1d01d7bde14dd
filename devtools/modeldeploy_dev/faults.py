"""Faults for chaos runs on the local cluster: control-plane processes SIGKILLed and restarted, a
pod's serving process SIGKILLed, a Prometheus frozen, a whole node lost, a network path cut.

Test infrastructure only: the product has no fault switch. Every fault here is what an operator
meets in a real cluster (a crashed kube-apiserver or etcd that its supervisor restarts, a container
killed by the OOM killer, a metrics backend that stops answering, a node that loses power), made
with signals on the processes kwokctl and the process nodes started, or (a partition) with an
iptables rule that drops one process's packets to the pods.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.cluster.local import LocalCluster
from modeldeploy_dev.cluster.nodes import node_ready
from modeldeploy_dev.e2e_cluster import E2ECluster
from modeldeploy_dev.procnode.net import Network
from modeldeploy_dev.procnode.pids import kill_leftovers
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


def container_pid(local: LocalCluster, container_id: str) -> int:
    """The host pid of a real-node container's main process (`containerd://<id>`), from `ctr tasks ls`."""
    cid = container_id.split("://", 1)[1]
    out = local.real_node().ctr("tasks", "ls").stdout
    for line in out.splitlines()[1:]:
        f = line.split()
        if f and f[0] == cid:
            return int(f[1])
    raise AssertionError(f"container {cid} not in `ctr tasks ls`:\n{out}")


def kill_pod_process(cluster: E2ECluster, ns: str, pod: str) -> int:
    """SIGKILL a pod's first container as the OOM killer would; its node restarts it per
    restartPolicy. On the process node (container ID `process://<pid>`) the process group; on the
    real node (`containerd://<id>`) the container's main process, so the runtime sees its task exit.
    Returns the pid killed."""
    p = cluster.core.read_namespaced_pod(pod, ns)
    cid = (K.pod_status(p).container_statuses or [None])[0]
    ref = (cid.container_id or "") if cid is not None else ""
    if ref.startswith("process://"):
        pid = int(ref.removeprefix("process://"))
        os.killpg(pid, signal.SIGKILL)
        return pid
    if ref.startswith("containerd://") and cluster.local is not None and cluster.local.s.real_node:
        pid = container_pid(cluster.local, ref)
        os.kill(pid, signal.SIGKILL)
        return pid
    raise ValueError(f"pod {ns}/{pod}: no running container of this machine's nodes ({cid})")


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


def cgroup2_root(mounts: str | None = None) -> Path:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup on a v2-only host,
    /sys/fs/cgroup/unified on a hybrid one), from /proc/mounts."""
    text = mounts if mounts is not None else Path("/proc/mounts").read_text()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    raise RuntimeError("no cgroup2 hierarchy is mounted (see /proc/mounts): iptables' cgroup match needs one")


class Partition:
    """A process whose packets to chosen addresses can be dropped while everyone else still reaches
    them. The process moves into a cgroup v2 of its own when this is made; `cut(ips)` adds one
    iptables OUTPUT rule per address dropping what that cgroup sends (`-m cgroup --path`): connects
    and established connections time out, as across a partitioned link, and the pods keep serving
    the load. `heal()` removes the rules; `close()` (or leaving the `with`) also returns the process
    to its cgroup and removes this one.

    Make it right after the process starts, before it opens the connections to cut: a socket keeps
    the cgroup it was created in, so a keep-alive connection opened before the move (Prometheus'
    scrapes) would never match. Found by the first partition-prometheus run, whose analyses kept
    passing on scrapes that went on over such connections."""

    def __init__(self, pid: int, name: str = "") -> None:
        self.pid = pid
        self.name = name or f"modeldeploy-partition-{pid}"
        self.cgroup = cgroup2_root() / self.name
        self._rules: list[list[str]] = []
        # "0::/path" is the process's cgroup v2 membership
        home = (Path("/proc") / str(pid) / "cgroup").read_text().splitlines()
        self._was = next((line[3:] for line in home if line.startswith("0::")), "/")
        self.cgroup.mkdir(exist_ok=True)
        (self.cgroup / "cgroup.procs").write_text(str(pid))

    def _rule(self, ip: str) -> list[str]:
        return ["OUTPUT", "-d", ip, "-m", "cgroup", "--path", self.name, "-j", "DROP"]

    def cut(self, ips: Iterable[str]) -> float:
        """Drop what the process sends to `ips` from now on; returns the time of the cut."""
        todo = sorted(set(ips))
        if not todo:
            raise ValueError("Partition.cut: no addresses to cut off")
        for ip in todo:
            subprocess.run(["iptables", "-I", *self._rule(ip)], check=True, capture_output=True, timeout=30)
            self._rules.append(self._rule(ip))
        return time.monotonic()

    def heal(self) -> None:
        for rule in self._rules:
            subprocess.run(["iptables", "-D", *rule], check=False, capture_output=True, timeout=30)
        self._rules.clear()

    def close(self) -> None:
        self.heal()
        home = cgroup2_root() / self._was.lstrip("/")
        with contextlib.suppress(ProcessLookupError, FileNotFoundError, OSError):
            (home / "cgroup.procs").write_text(str(self.pid))
        with contextlib.suppress(OSError):
            self.cgroup.rmdir()

    def __enter__(self) -> Partition:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- a node lost ---------------------------------------------------------------------------------
SPARE_BRIDGE = "mdlost"  # + index: a bridge name no cluster's `up` picks (mdbr*, mdrn*)
SPARE_CIDRS = tuple(f"10.244.{150 + i}.0/24" for i in range(10))


def spare_network(links: Iterable[str], addresses: Iterable[str]) -> tuple[str, str]:
    """A bridge and pod CIDR for a second process node that collide with nothing on this host:
    the first `mdlost<i>` not among `links` whose CIDR holds none of `addresses` (the host's
    IPv4 interface addresses, 'a.b.c.d/len'), so two runs, or a run beside any cluster, never
    share a bridge or route."""
    taken = set(links)
    nets = [ipaddress.ip_interface(a).network for a in addresses]
    for i, cidr in enumerate(SPARE_CIDRS):
        net = ipaddress.ip_network(cidr)
        if f"{SPARE_BRIDGE}{i}" not in taken and not any(net.overlaps(n) for n in nets):
            return f"{SPARE_BRIDGE}{i}", cidr
    raise RuntimeError(f"no free bridge {SPARE_BRIDGE}0-{len(SPARE_CIDRS) - 1} with a free CIDR on this host")


def host_network() -> tuple[list[str], list[str]]:
    """(link names, IPv4 interface addresses) of this host, for spare_network."""
    links = [p.name for p in Path("/sys/class/net").iterdir()]
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], text=True, capture_output=True, check=True)
    return links, [line.split()[3] for line in out.stdout.splitlines() if len(line.split()) > 3]


def cordon(cluster: E2ECluster, node: str, unschedulable: bool = True) -> None:
    """`kubectl cordon` (or uncordon): new pods avoid the node; the pods on it keep running."""
    cluster.core.patch_node(node, {"spec": {"unschedulable": unschedulable}})


def _node_is_ready(cluster: E2ECluster, name: str) -> bool:
    """The Node's Ready condition is True (False while it does not exist)."""
    try:
        return node_ready(cluster.core.read_node(name))
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _absent(cluster: E2ECluster, name: str) -> None:
    """Refuse to start a spare node whose Node exists: another run's, not ours to reuse."""
    try:
        cluster.core.read_node(name)
        raise RuntimeError(f"node {name} exists already: another run's, not ours to reuse")
    except ApiException as e:
        if e.status != 404:
            raise


def _decommission(cluster: E2ECluster, name: str) -> None:
    """Force-delete the node's pods (on a dead node they stay Terminating otherwise), then its Node."""
    core = cluster.core
    with contextlib.suppress(ApiException):
        for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items:
            m = p.metadata
            if m is not None and m.name and m.namespace:
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(m.name, m.namespace, grace_period_seconds=0)
    with contextlib.suppress(ApiException):
        core.delete_node(name)


class SpareNode:
    """A second process node (its own agent, state dir, bridge and pod CIDR) that a chaos case loses.

    `lose()` is a power loss: the agent (kubelet and container runtime in one) and every pod
    process on it SIGKILLed, and the pods' network namespaces removed while the bridge stays up,
    so their IPs answer nothing (no ARP reply: a client's connect fails after its timeout or with
    EHOSTUNREACH, as for a host that died on a live switch). No one renews the node's Lease: the
    node controller marks it NotReady after --node-monitor-grace-period, taints it unreachable and
    evicts its pods after their toleration; those pods stay Terminating, as on a real dead node.
    `remove()` (on exit) decommissions it: its pods force-deleted, its Node and Lease deleted, the
    agent stopped if still alive, its network removed."""

    def __init__(self, cluster: E2ECluster, state: Path, name: str = "proc-1") -> None:
        self.cluster, self.state, self.name = cluster, state, name
        self.bridge, self.cidr = spare_network(*host_network())
        self.proc: subprocess.Popen[bytes] | None = None
        self.lost = False

    def start(self, timeout: float = 90) -> SpareNode:
        """Start the agent and wait until its Node is Ready."""
        _absent(self.cluster, self.name)
        self.state.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "modeldeploy_dev.procnode", "--kubeconfig", self.cluster.kubeconfig]
        argv += ["--node", self.name, "--bridge", self.bridge, "--pod-cidr", self.cidr]
        argv += ["--state-dir", str(self.state)]
        with open(self.state / "procnode.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        wait_until(self.ready, timeout, 0.5, f"node {self.name} Ready", ignore=(ApiException,))
        return self

    def ready(self) -> bool:
        """The Node's Ready condition is True (a started agent that exited is an error, a lost one not)."""
        if self.proc is not None and self.proc.poll() is not None and not self.lost:
            tail = (self.state / "procnode.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the {self.name} agent exited ({self.proc.returncode}):\n{tail}")
        return _node_is_ready(self.cluster, self.name)

    def lose(self, pods: bool = True) -> float:
        """The power loss (see the class); returns the time.monotonic() when it is complete. With
        `pods=False` only the agent dies (a node cut off from the control plane): the pods' processes,
        in process groups of their own, keep running and answering on their addresses."""
        assert self.proc is not None, "lose() before start()"
        self.lost = True
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        if not pods:
            return time.monotonic()
        kill_leftovers(self.state)  # the pods' processes: their own process groups, not the agent's
        net = Network(self.bridge, self.cidr)
        for ns in net.existing():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False, timeout=30)
        return time.monotonic()

    def remove(self) -> None:
        if self.proc is None:  # never started: the Node, if any, is not ours
            return
        if self.proc.poll() is None:  # a case that failed before lose()
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        kill_leftovers(self.state)
        _decommission(self.cluster, self.name)
        Network(self.bridge, self.cidr).destroy_all()

    def __enter__(self) -> SpareNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()


class RealSpareNode:
    """A second real node (kubelet and containerd, LocalCluster.spare_real_node()) that a chaos case
    loses; the same interface as SpareNode.

    `lose()` is a power loss: kubelet, containerd, the runc shims and every container process of the
    node SIGKILLed, and the pods' veths removed from its bridge, so their IPs answer nothing (as for
    a host that died on a live switch). With `pods=False` only kubelet and containerd die: the shims
    and the containers keep running and serving, cut off from the control plane. `remove()` (on
    exit) force-deletes its pods and its Node, then stops and sweeps it (its own cgroups, directory
    and bridge only: the first node's kube-proxy rules stay)."""

    def __init__(self, local: LocalCluster, cluster: E2ECluster, name: str = "real-1") -> None:
        self.local, self.cluster, self.name = local, cluster, name
        self.node = local.spare_real_node(name)
        self.bridge, self.cidr = self.node.net.bridge, self.node.net.pod_cidr
        self.started = self.lost = False

    def start(self) -> RealSpareNode:
        _absent(self.cluster, self.name)
        self.started = True
        self.local.start_spare_real_node(self.node)
        return self

    def pull(self, ref: str) -> float:
        """Pull `ref` into the node's containerd from the cluster's registry (plain HTTP, as its
        hosts.toml says); the seconds it took. The runtime image is 6.3 GB: a case pulls it before
        the bundle change so the canary's start is not the pull."""
        t0 = time.monotonic()
        self.node.ctr("images", "pull", "--hosts-dir", str(self.node.lay.certs_d), ref, timeout=1800)
        return time.monotonic() - t0

    def ready(self) -> bool:
        if self.started and not self.lost and self.node.pid("kubelet") is None:
            raise RuntimeError(f"the {self.name} kubelet exited; see {self.node.lay.log('kubelet')}")
        return _node_is_ready(self.cluster, self.name)

    def lose(self, pods: bool = True) -> float:
        assert self.started, "lose() before start()"
        self.lost = True
        for component in ("kubelet", "containerd"):
            if (pid := self.node.pid(component)) is not None:
                os.kill(pid, signal.SIGKILL)
        if not pods:
            return time.monotonic()
        from modeldeploy_dev.cluster.realnode import cleanup

        cleanup.kill_node_processes(self.node.lay.base, self.node.cgroup_parent, lambda _: None, pause=0.2)
        for veth in cleanup.links(self.bridge)[1:]:
            subprocess.run(["ip", "link", "del", veth], capture_output=True, check=False, timeout=30)
        return time.monotonic()

    def remove(self) -> None:
        if not self.started:
            return
        _decommission(self.cluster, self.name)
        if left := self.node.stop(None):  # its veths, bridge and FORWARD rule too
            print(f"[chaos] {self.name} left behind: {left}")

    def __enter__(self) -> RealSpareNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()
