"""`down` leaves no process and no listening port behind (a separate throwaway cluster)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client, config

from modeldeploy_dev.cluster.local import LocalCluster, Settings
from modeldeploy_dev.procnode.net import NETNS_PREFIX
from modeldeploy_dev.procnode.pids import alive

from .test_process_node import GPU_TOLERATION


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets `pid` holds open (from /proc/<pid>/fd); empty once it has exited."""
    inodes: set[str] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    return inodes


def listen_table() -> list[tuple[int, str]]:
    """(port, socket inode) of every TCP socket in LISTEN in this network namespace."""
    rows: list[tuple[int, str]] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":
                rows.append((int(f[1].rsplit(":", 1)[1], 16), f[9]))
    return rows


def listening_ports(pids: set[int]) -> set[int]:
    """TCP ports in LISTEN owned by any of `pids`."""
    inodes = set().union(*(socket_inodes(p) for p in pids))
    return {port for port, inode in listen_table() if inode in inodes}


def started_at(pid: int) -> float:
    """When `pid` started, in seconds since boot (field 22 of /proc/<pid>/stat); inf once gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("inf")
    return int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def held_since_before(ports: set[int], moment: float) -> list[int]:
    """Those of `ports` still in LISTEN and held by a process that started before `moment`.

    Why not simply "still listening": kwokctl picks its ports by scanning down from 32766 for the
    first free one, in every process, so a cluster another test lane creates just after this
    one's `down` takes the very ports it freed (CI saw 32755-32760 so). A process that started
    after `down` began cannot be this cluster's leftover (down starts none that outlive it), and
    none that started before could have bound those ports while this cluster held them. A port
    still in LISTEN whose holder cannot be found counts as left behind."""
    listening = {(port, inode) for port, inode in listen_table() if port in ports}
    if not listening:
        return []
    holders: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            for inode in socket_inodes(int(entry)):
                holders.setdefault(inode, []).append(int(entry))
    still = set(listen_table())  # read again: a holder may have closed its socket in between
    left = set()
    for port, inode in listening & still:
        owners = holders.get(inode, [])
        if not owners or any(started_at(pid) < moment for pid in owners):
            left.add(port)
    return sorted(left)


@pytest.mark.e2e
def test_down_leaves_no_process_and_no_port() -> None:
    if os.environ.get("KUBECONFIG"):
        pytest.skip("external $KUBECONFIG: `down` is a property of the local cluster")
    s = Settings(name="md-downtest", gpu_nodes=1, bridge="mdbr9", pod_cidr="10.244.9.0/24")
    c = LocalCluster(s)
    c.down()  # a leftover from an interrupted run
    c.up()
    try:
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(c.kubeconfig)))
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": "ts"},
                "spec": {
                    "nodeSelector": {"modeldeploy.dev/node-kind": "process"},
                    "tolerations": [GPU_TOLERATION],
                    "containers": [
                        {
                            "name": "main",
                            "image": "x",
                            "command": ["modeldeploy"],
                            "args": ["cluster", "testserver", "--port", "8080"],
                        }
                    ],
                },
            },
        )
        running_pod = None
        for _ in range(120):
            p = core.read_namespaced_pod("ts", "default")
            if p.status.phase == "Running" and p.status.container_statuses[0].container_id:
                running_pod = p
                break
            time.sleep(0.5)
        assert running_pod is not None, "pod on the process node never ran"
        pod_pid = int(running_pod.status.container_statuses[0].container_id.removeprefix("process://"))
        pids = {int(f.read_text()) for f in (c.cluster_dir / "pids").glob("*.pid")}
        pids |= {c.procnode_pid() or 0, pod_pid}
        pids.discard(0)
        assert len(pids) >= 6, pids  # etcd, apiserver, controller-manager, scheduler, kwok, process node, pod
        assert all(alive(p) for p in pids)
        ports = listening_ports(pids)
        assert ports, "the cluster listens on no port?"
    finally:
        down_began = uptime()
        c.down()
    assert [p for p in pids if alive(p)] == []
    assert held_since_before(ports, down_began) == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{NETNS_PREFIX}{s.bridge}-" not in netns
    assert not Path(f"/sys/class/net/{s.bridge}").exists()
    assert not c.cluster_dir.exists()
