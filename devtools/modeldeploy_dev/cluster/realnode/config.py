"""Configuration files of the real node: containerd, CNI, kubelet, kube-proxy, registry hosts.

Pure functions of a `Layout` (paths) and a `NodeNet` (addresses), so they can be read and tested
without starting anything. The choices that this machine forces (cgroup v1, no CAP_SYS_RESOURCE,
Debian's containerd 1.6 beside ours) are explained where they are made.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

# kube-apiserver's default, passed explicitly when the real node is on (local.py) so kube-proxy,
# the pod routes and the apiserver agree on it.
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service: the first address of SERVICE_CIDR
PAUSE_IMAGE = "modeldeploy.local/pause"


@dataclass(frozen=True)
class NodeNet:
    """Addresses of the node: a private pod CIDR on a host-local bridge whose first address is the
    host side (node IP, kubelet, and the apiserver's bind address). Nothing is routed off the
    machine: pods get routes to their subnet and the Service CIDR only, and no NAT to the outside."""

    bridge: str
    pod_cidr: str
    service_cidr: str = SERVICE_CIDR

    def __post_init__(self) -> None:
        net = ipaddress.ip_network(self.pod_cidr)
        if not net.is_private or net.version != 4:
            raise ValueError(f"real node pod CIDR {self.pod_cidr} must be a private IPv4 range")
        if net.prefixlen > 28:
            raise ValueError(f"real node pod CIDR {self.pod_cidr} is too small (at most /28)")
        if len(self.bridge) > 15:
            raise ValueError(f"bridge name {self.bridge!r} is longer than 15 characters (Linux IFNAMSIZ)")

    @property
    def gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.pod_cidr).prefixlen


@dataclass(frozen=True)
class Layout:
    """Every path the node writes. All under one directory (removed by `down`), except what
    upstream hard-codes: /run/containerd/s (shim sockets) and /var/log/containers (kubelet's
    symlinks into podLogsDir); `down` removes ours from both."""

    base: Path

    @property
    def containerd_root(self) -> Path:
        return self.base / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.base / "containerd" / "state"

    @property
    def containerd_config(self) -> Path:
        return self.base / "containerd" / "config.toml"

    @property
    def containerd_sock(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def certs_d(self) -> Path:
        return self.base / "containerd" / "certs.d"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.base / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.base / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.base / "kubelet.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.base / "pod-logs"

    @property
    def kube_proxy_config(self) -> Path:
        return self.base / "kube-proxy.yaml"

    @property
    def pki(self) -> Path:
        return self.base / "pki"

    def kubeconfig(self, user: str) -> Path:
        return self.base / f"{user}.kubeconfig"

    def pidfile(self, component: str) -> Path:
        return self.base / f"{component}.pid"

    def log(self, component: str) -> Path:
        return self.base / f"{component}.log"


def _toml_str(s: str | Path) -> str:
    return json.dumps(str(s))  # a TOML basic string is a JSON string for these paths


def containerd_toml(lay: Layout, runc: str, cni_bin_dir: str, pause_ref: str) -> str:
    """containerd v2 (config version 3) with its own socket, root and state, so it never meets the
    containerd 1.6 that Debian's docker.io runs. cgroupfs (no systemd here), and
    `restrict_oom_score_adj`: without CAP_SYS_RESOURCE a negative oom_score_adj (which kubelet
    asks for Guaranteed pods) is refused, so containerd clamps it to its own. NRI and tracing are
    off: they would open sockets in /var/run/nri and talk to collectors."""
    return f"""version = 3
root = {_toml_str(lay.containerd_root)}
state = {_toml_str(lay.containerd_state)}
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = {_toml_str(lay.containerd_sock)}

[ttrpc]
  address = {_toml_str(str(lay.containerd_sock) + ".ttrpc")}

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {_toml_str(lay.base / "containerd" / "opt")}

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{_toml_str(cni_bin_dir)}]
    conf_dir = {_toml_str(lay.cni_conf_dir)}
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {_toml_str(runc)}
        SystemdCgroup = false

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {_toml_str(pause_ref)}
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = {_toml_str(lay.certs_d)}

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def registry_hosts_toml(host_port: str) -> str:
    """certs.d/<host:port>/hosts.toml: the loopback registry speaks plain HTTP."""
    return (
        f'server = "http://{host_port}"\n\n'
        f'[host."http://{host_port}"]\n  capabilities = ["pull", "resolve"]\n'
    )


def cni_conflist(name: str, net: NodeNet, data_dir: Path) -> dict:
    """bridge + host-local (+ portmap for hostPort). No ipMasq and no default route: pods reach
    their bridge subnet, the host (gateway) and the Service CIDR (kube-proxy DNATs it), nothing
    else. hairpinMode lets a pod reach itself through its own Service.

    No `loopback` in this chain on purpose: every plugin of a chain gets the same interface
    (eth0), and loopback would act on that one. containerd's CRI runs loopback itself, as a
    network of its own on `lo` (go-cni `WithLoNetwork`, unless `use_internal_loopback`), from
    the same bin_dirs: so /usr/lib/cni/loopback is a prerequisite, and the e2e checks `lo` is UP."""
    return {
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(data_dir),
                    "ranges": [[{"subnet": net.pod_cidr, "gateway": net.gateway}]],
                    "routes": [{"dst": net.service_cidr}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_yaml(lay: Layout, net: NodeNet, port: int, ca_file: Path, cgroup_root: str = "/") -> str:
    """KubeletConfiguration for cgroup v1 without systemd: `failCgroupV1: false` (v1.35+ refuses
    cgroup v1 otherwise), `cgroupDriver: cgroupfs`. `cgroup_root`: a second node on the machine
    keeps its pods below a cgroup of its own, or each kubelet would remove the other's pod cgroups
    as orphans. It listens on the bridge address only; its
    API needs a client certificate from the cluster CA and is authorized by the apiserver
    (Webhook). No cluster DNS: pods use Service addresses (see README "Real node"). oomScoreAdj 0
    for kubelet itself: a negative one needs CAP_SYS_RESOURCE, which these machines lack."""
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {net.gateway}
port: {port}
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca_file}}}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{lay.containerd_sock}
imageServiceEndpoint: unix://{lay.containerd_sock}
podLogsDir: {lay.pod_logs}
resolvConf: ""
podCIDR: {net.pod_cidr}
serializeImagePulls: false
imageGCHighThresholdPercent: 95
imageGCLowThresholdPercent: 90
evictionHard: {{"memory.available": "200Mi", "nodefs.available": "5%", "imagefs.available": "5%"}}
registerNode: true
enableServer: true
shutdownGracePeriod: 0s
oomScoreAdj: 0
"""


def kube_proxy_yaml(kubeconfig: Path, net: NodeNet, node: str, healthz_port: int, metrics_port: int) -> str:
    """iptables mode. `masqueradeAll`: the pod bridge is bridged, not routed, so a pod calling a
    Service backed by a pod on the same bridge would get the reply straight from that pod
    (un-DNATed) unless the call is SNATed to the gateway. conntrack sizing is left to the host
    (maxPerCore 0): the node must not retune a shared machine. Metrics and health on loopback
    (free ports: kube-proxy refuses port 0). oomScoreAdj 0: a negative one needs CAP_SYS_RESOURCE."""
    return f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {node}
bindAddress: {net.gateway}
clusterCIDR: {net.pod_cidr}
healthzBindAddress: 127.0.0.1:{healthz_port}
metricsBindAddress: 127.0.0.1:{metrics_port}
oomScoreAdj: 0
nodePortAddresses: ["{net.gateway}/32"]
iptables:
  masqueradeAll: true
conntrack:
  maxPerCore: 0
"""


def kubeconfig_yaml(server: str, ca: Path, cert: Path, key: Path, user: str) -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {{server: "{server}", certificate-authority: {ca}}}
users:
- name: {user}
  user: {{client-certificate: {cert}, client-key: {key}}}
contexts:
- name: {user}
  context: {{cluster: local, user: {user}}}
current-context: {user}
"""
