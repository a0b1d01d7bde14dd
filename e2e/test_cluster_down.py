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


def listening_ports(pids: set[int]) -> set[int]:
    """TCP ports in LISTEN owned by any of `pids` (socket inodes from /proc/<pid>/fd)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def port_listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


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
        c.down()
    assert [p for p in pids if alive(p)] == []
    assert [p for p in ports if port_listening(p)] == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{NETNS_PREFIX}{s.bridge}-" not in netns
    assert not Path(f"/sys/class/net/{s.bridge}").exists()
    assert not c.cluster_dir.exists()
