"""The real node's configuration files (devtools/modeldeploy_dev/cluster/realnode/config.py): the
settings this machine forces are present, every path stays under the node directory, and bad input
is refused by name."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from modeldeploy_dev.cluster.realnode.config import (
    SERVICE_CIDR,
    Layout,
    NodeNet,
    cni_conflist,
    containerd_toml,
    kube_proxy_yaml,
    kubelet_yaml,
    registry_hosts_toml,
)

BASE = Path("/tmp/md-test/realnode")
NET = NodeNet("mdrn7", "10.244.107.0/24")


def test_node_net_addresses() -> None:
    assert NET.gateway == "10.244.107.1"
    assert NET.prefixlen == 24


@pytest.mark.parametrize(
    ("bridge", "cidr", "word"),
    [
        ("mdrn7", "8.8.8.0/24", "private"),
        ("mdrn7", "10.244.107.0/30", "too small"),
        ("a-bridge-name-too-long", "10.244.107.0/24", "15 characters"),
    ],
)
def test_node_net_refuses_bad_input(bridge: str, cidr: str, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        NodeNet(bridge, cidr)


def test_containerd_has_its_own_socket_root_state_and_clamps_oom_score() -> None:
    lay = Layout(BASE)
    cfg = tomllib.loads(containerd_toml(lay, "/usr/sbin/runc", "/usr/lib/cni", "modeldeploy.local/pause:1.0"))
    assert cfg["version"] == 3
    for path in (cfg["root"], cfg["state"], cfg["grpc"]["address"], cfg["ttrpc"]["address"]):
        assert path.startswith(str(BASE) + "/"), path  # never /run/containerd: Debian's 1.6 lives there
    rt = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert rt["restrict_oom_score_adj"] is True
    assert rt["netns_mounts_under_state_dir"] is True  # so `down` finds every netns under BASE
    assert rt["cni"]["conf_dir"] == str(lay.cni_conf_dir)
    runc = rt["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"BinaryName": "/usr/sbin/runc", "SystemdCgroup": False}
    img = cfg["plugins"]["io.containerd.cri.v1.images"]
    assert img["pinned_images"]["sandbox"] == "modeldeploy.local/pause:1.0"
    assert img["registry"]["config_path"] == str(lay.certs_d)
    assert "io.containerd.nri.v1.nri" in cfg["disabled_plugins"]


def test_cni_keeps_pods_on_the_machine() -> None:
    conf = cni_conflist("md-x", NET, BASE / "ipam")
    bridge = conf["plugins"][0]
    assert bridge["bridge"] == "mdrn7" and bridge["ipMasq"] is False
    assert bridge["ipam"]["routes"] == [{"dst": SERVICE_CIDR}]  # no default route off the machine
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.107.0/24", "gateway": "10.244.107.1"}]]
    assert bridge["ipam"]["dataDir"].startswith(str(BASE))
    assert [p["type"] for p in conf["plugins"]] == ["bridge", "portmap"]


def test_kubelet_config_for_cgroup_v1_and_authenticated_api() -> None:
    lay = Layout(BASE)
    k = yaml.safe_load(kubelet_yaml(lay, NET, 10311, BASE / "ca.crt"))
    assert k["kind"] == "KubeletConfiguration"
    assert k["failCgroupV1"] is False and k["cgroupDriver"] == "cgroupfs"
    assert k["address"] == "10.244.107.1" and k["port"] == 10311 and k["readOnlyPort"] == 0
    assert k["authentication"]["anonymous"]["enabled"] is False
    assert k["authentication"]["x509"]["clientCAFile"] == str(BASE / "ca.crt")
    assert k["authorization"]["mode"] == "Webhook"
    assert k["containerRuntimeEndpoint"] == f"unix://{lay.containerd_sock}"
    assert k["podLogsDir"] == str(lay.pod_logs)
    assert k["cgroupRoot"] == "/"
    second = yaml.safe_load(kubelet_yaml(lay, NET, 10311, BASE / "ca.crt", "/modeldeploy-x-real-1"))
    assert second["cgroupRoot"] == "/modeldeploy-x-real-1"  # the spare node's pods: its own cgroups


def test_a_second_node_sweeps_its_own_cgroups_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two kubelets on one machine: the spare's sweep and leftovers see its cgroup root, never the
    first node's kubepods (a fake cgroup tree: real directories, no cgroupfs)."""
    from modeldeploy_dev.cluster.realnode import cleanup
    from modeldeploy_dev.cluster.realnode.node import NodeBinaries, RealNode

    for ctrl in ("cpu", "memory"):
        (tmp_path / ctrl / "kubepods" / "pod-a").mkdir(parents=True)
        (tmp_path / ctrl / "spare" / "kubepods" / "pod-b").mkdir(parents=True)
    monkeypatch.setattr(cleanup, "CGROUP_ROOT", tmp_path)
    first = {p.relative_to(tmp_path).as_posix() for p in cleanup.kubepods_cgroups()}
    spare = {p.relative_to(tmp_path).as_posix() for p in cleanup.kubepods_cgroups("spare")}
    assert first == {"cpu/kubepods", "cpu/kubepods/pod-a", "memory/kubepods", "memory/kubepods/pod-a"}
    assert spare == {
        "cpu/spare",
        "cpu/spare/kubepods",
        "cpu/spare/kubepods/pod-b",
        "memory/spare",
        "memory/spare/kubepods",
        "memory/spare/kubepods/pod-b",
    }
    node = RealNode("real-1", "c", NET, tmp_path / "n", NodeBinaries(tmp_path, {}), tmp_path / "claim", True)
    assert node.second and node.cgroup_parent == "modeldeploy-c-real-1"


def test_kube_proxy_config() -> None:
    k = yaml.safe_load(kube_proxy_yaml(BASE / "kp.kubeconfig", NET, "real-0", 10256, 10249))
    assert k["mode"] == "iptables" and k["iptables"]["masqueradeAll"] is True
    assert k["clusterCIDR"] == "10.244.107.0/24" and k["hostnameOverride"] == "real-0"
    assert k["metricsBindAddress"] == "127.0.0.1:10249" and k["healthzBindAddress"] == "127.0.0.1:10256"
    assert k["oomScoreAdj"] == 0
    assert k["conntrack"]["maxPerCore"] == 0


def test_registry_hosts_is_plain_http_on_loopback() -> None:
    cfg = tomllib.loads(registry_hosts_toml("127.0.0.1:5011"))
    assert cfg["server"] == "http://127.0.0.1:5011"
    assert cfg["host"]["http://127.0.0.1:5011"]["capabilities"] == ["pull", "resolve"]


def test_examples_are_pinned_to_the_pushed_images(tmp_path: Path) -> None:
    from modeldeploy_dev.cluster.realnode.images import write_examples

    rt = "127.0.0.1:5011/modeldeploy/runtime@sha256:" + "a" * 64
    op = "127.0.0.1:5011/modeldeploy/operator@sha256:" + "b" * 64
    written = write_examples({"runtime": rt, "operator": op}, tmp_path)
    tiny = yaml.safe_load((tmp_path / "modeldeployment-tiny.yaml").read_text())
    assert tiny["spec"]["bundle"]["engine"]["image"] == rt
    assert "#" in (tmp_path / "modeldeployment-tiny.yaml").read_text()  # comments kept
    values = yaml.safe_load((tmp_path / "operator-values.yaml").read_text())
    assert values["image"] == {"repository": op.split("@")[0], "digest": "sha256:" + "b" * 64}
    assert len(written) >= 3


def _fake_bin(d: Path, name: str, body: str) -> None:
    f = d / name
    f.write_text(f"#!/bin/sh\n{body}\n")
    f.chmod(0o755)


def test_docker_engine_uses_a_running_one_skips_without_one_and_fails_a_broken_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """images.docker_engine with stand-in `docker` and `dockerd` executables on PATH (real processes):
    an engine that answers is used as is; no dockerd installed is a reason (callers skip); a dockerd
    started here that never answers raises (installed but broken must fail, not skip)."""
    from modeldeploy_dev.cluster.realnode import images

    bins = tmp_path / "bin"
    bins.mkdir()
    monkeypatch.setenv("PATH", str(bins))
    dockerd = str(bins / "dockerd")
    _fake_bin(bins, "docker", "exit 0")  # `docker info` answers
    with images.docker_engine(timeout=3, dockerd=dockerd) as why:
        assert why is None
    _fake_bin(bins, "docker", "exit 1")  # no engine answers, and no dockerd installed
    with images.docker_engine(timeout=3, dockerd=dockerd) as why:
        assert why is not None and "docker info" in why
    _fake_bin(bins, "dockerd", "exit 3")  # installed, exits at once
    with pytest.raises(RuntimeError, match="exited with 3"), images.docker_engine(timeout=3, dockerd=dockerd):
        pass
    _fake_bin(bins, "dockerd", "exec /bin/sleep 30")  # installed, never answers: stopped again, then raised
    with pytest.raises(RuntimeError, match="not answering"), images.docker_engine(timeout=2, dockerd=dockerd):
        pass
