"""The real worker node: containerd v2 + runc + CNI bridge, kubelet and kube-proxy as processes.

Started by `modeldeploy cluster up --real-node` after the control plane, stopped by `down` before
it. Each component is a background process with a pid file and a log under the node directory
(`<run>/<cluster>/realnode/`). The node joins with a client certificate signed by the cluster CA.
One real node per machine: kube-proxy's KUBE-* chains and kubelet's /kubepods cgroups are
machine-wide names, so `start` claims the machine (`realnode.owner`) and refuses a second one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.cluster.realnode import cleanup
from modeldeploy_dev.cluster.realnode.config import (
    PAUSE_IMAGE,
    Layout,
    NodeNet,
    cni_conflist,
    containerd_toml,
    kube_proxy_yaml,
    kubeconfig_yaml,
    kubelet_yaml,
    registry_hosts_toml,
)
from modeldeploy_dev.cluster.realnode.pki import sign_client_cert
from modeldeploy_dev.wait import wait_until

NODE_KIND_LABEL = "modeldeploy.dev/node-kind=real"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins


@dataclass(frozen=True)
class NodeBinaries:
    """The cached binaries of build-node.sh, keyed by component version (versions.env)."""

    root: Path
    versions: dict[str, str]

    def _p(self, component: str, key: str, name: str) -> Path:
        return self.root / f"{component}-{self.versions[key]}" / name

    @property
    def kubelet(self) -> Path:
        return self._p("kubernetes", "K8S_VERSION", "kubelet")

    @property
    def kube_proxy(self) -> Path:
        return self._p("kubernetes", "K8S_VERSION", "kube-proxy")

    @property
    def containerd_dir(self) -> Path:
        return self._p("containerd", "CONTAINERD_VERSION", "")

    @property
    def containerd(self) -> Path:
        return self.containerd_dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.containerd_dir / "ctr"

    @property
    def registry(self) -> Path:
        return self._p("distribution", "DISTRIBUTION_VERSION", "registry")

    @property
    def pause_tar(self) -> Path:
        return self._p("pause", "PAUSE_VERSION", "pause.tar")

    @property
    def probe_tar(self) -> Path:
        """The test workload image, cached by a hash of its source (build-node.sh build_probe)."""
        src = Path(__file__).resolve().parent / "probe" / "main.go"
        return self.root / f"probe-{hashlib.sha256(src.read_bytes()).hexdigest()[:12]}" / "probe.tar"

    @property
    def pause_ref(self) -> str:
        return f"{PAUSE_IMAGE}:{self.versions['PAUSE_VERSION']}"

    def missing(self) -> list[str]:
        """Built binaries that are absent, and the Debian packages the node needs."""
        out = [
            str(p)
            for p in (
                self.kubelet,
                self.kube_proxy,
                self.containerd,
                self.containerd_dir / "containerd-shim-runc-v2",
                self.ctr,
                self.registry,
            )
            if not os.access(p, os.X_OK)
        ]
        out += [str(t) for t in (self.pause_tar, self.probe_tar) if not t.is_file()]
        for tool, pkg in (("runc", "runc"), ("iptables-restore", "iptables")):
            if shutil.which(tool) is None:
                out.append(f"{tool} (apt-get install {pkg})")
        # loopback: containerd's CRI runs it on every pod's lo (not in the conflist's chain)
        for plugin in ("bridge", "host-local", "portmap", "loopback"):
            if not (Path(CNI_BIN_DIR) / plugin).exists():
                out.append(f"{CNI_BIN_DIR}/{plugin} (apt-get install containernetworking-plugins)")
        return out


class RealNode:
    """kubelet, containerd and (on the first node) kube-proxy on this machine's network namespace.

    A second node of the same cluster (`second=True`: a chaos case's spare) shares the host with the
    first: its pods live below a cgroup root of their own (`cgroup_parent`), it runs no kube-proxy
    (the first one's rules serve every pod of the host network namespace) and takes no machine claim
    (the first node's cluster holds it)."""

    def __init__(
        self,
        name: str,
        cluster: str,
        net: NodeNet,
        base: Path,
        bins: NodeBinaries,
        claim: Path,
        second: bool = False,
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.net = net
        self.lay = Layout(base)
        self.bins = bins
        self.claim = claim  # machine-wide: which cluster owns the one real node
        self.second = second
        self.cgroup_parent = f"modeldeploy-{cluster}-{name}" if second else ""

    # --- host network -------------------------------------------------------------------------
    def ensure_bridge(self) -> None:
        """The bridge exists before the control plane does: kube-apiserver binds its address, so
        pods reach the API at the gateway (through the `kubernetes` Service) and nothing listens
        beyond loopback and this bridge. The CNI bridge plugin adopts it. Forwarding is enabled on
        this interface only (a pod's call to a Service is DNATed and routed back to the bridge)."""
        ip = self._ip
        if ip("link", "show", self.net.bridge, check=False).returncode != 0:
            ip("link", "add", self.net.bridge, "type", "bridge")
        addr = f"{self.net.gateway}/{self.net.prefixlen}"
        if addr not in ip("-o", "addr", "show", "dev", self.net.bridge).stdout:
            ip("addr", "add", addr, "dev", self.net.bridge)
        ip("link", "set", self.net.bridge, "up")
        Path(f"/proc/sys/net/ipv4/conf/{self.net.bridge}/forwarding").write_text("1\n")
        # Docker sets the FORWARD policy to DROP; bridged pod-to-pod frames pass iptables
        # (br_netfilter), so accept what stays on this bridge. Tagged for `down`.
        rule = self.forward_rule()
        if subprocess.run(["iptables", "-C", *rule], capture_output=True).returncode != 0:
            subprocess.run(["iptables", "-I", *rule], check=True, capture_output=True)

    def forward_rule(self) -> list[str]:
        """The FORWARD rule accepting what stays on this node's bridge (tagged for `down`)."""
        tag = f"{cleanup.RULE_TAG}:{self.cluster}"
        return [
            *("FORWARD", "-i", self.net.bridge, "-o", self.net.bridge),
            *("-m", "comment", "--comment", tag, "-j", "ACCEPT"),
        ]

    def guard_api_port(self, port: int) -> None:
        """kube-apiserver listens on all addresses (see LocalCluster._config_file): accept its
        port from loopback and this bridge only, drop it from every other interface."""
        tag = ["-m", "comment", "--comment", f"{cleanup.RULE_TAG}:{self.cluster}"]
        tcp = ["-p", "tcp", "--dport", str(port)]
        for cmd in ("iptables", "ip6tables"):
            if shutil.which(cmd) is None:
                continue
            for pos, rule in (
                ("1", [*tcp, "-i", self.net.bridge, *tag, "-j", "ACCEPT"]),
                ("2", [*tcp, "!", "-i", "lo", *tag, "-j", "DROP"]),
            ):
                if subprocess.run([cmd, "-C", "INPUT", *rule], capture_output=True).returncode != 0:
                    subprocess.run([cmd, "-I", "INPUT", pos, *rule], check=True, capture_output=True)

    @staticmethod
    def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", *args], text=True, capture_output=True, check=check, timeout=30)

    # --- machine claim -------------------------------------------------------------------------
    def claim_machine(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            owner = json.loads(self.claim.read_text())
            if owner["cluster"] != self.cluster and cleanup.processes(Path(owner["base"])):
                raise RuntimeError(
                    f"cluster {owner['cluster']!r} runs the real node of this machine "
                    f"({owner['base']}); one real node per machine (kube-proxy's KUBE-* chains and "
                    "kubelet's /kubepods cgroups are machine-wide): `modeldeploy cluster down` it first"
                )
        self.claim.parent.mkdir(parents=True, exist_ok=True)
        self.claim.write_text(json.dumps({"cluster": self.cluster, "base": str(self.lay.base)}))

    def owns_claim(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(self.claim.read_text())["cluster"] == self.cluster
        return False

    # --- up -----------------------------------------------------------------------------------
    def start(self, admin_kubeconfig: Path, pki_dir: Path, server: str, log=print) -> float:  # noqa: ANN001
        """Start containerd, kubelet and kube-proxy (each unless it runs); return the seconds from
        kubelet's start to the Node being Ready (the join time)."""
        if missing := self.bins.missing():
            raise RuntimeError(f"real node: missing {missing}; run `make real-node-build`")
        if not self.second:
            self.claim_machine()
        self.ensure_bridge()
        lay = self.lay
        for d in (lay.base, lay.pki, lay.cni_conf_dir, lay.cni_data_dir, lay.kubelet_root, lay.pod_logs):
            d.mkdir(parents=True, exist_ok=True)
        ca = pki_dir / "ca.crt"
        for user, cn, org in (
            ("kubelet", f"system:node:{self.name}", "system:nodes"),
            ("kube-proxy", "system:kube-proxy", None),
        ):
            crt, key = sign_client_cert(ca, pki_dir / "ca.key", lay.pki, user, cn, org)
            lay.kubeconfig(user).write_text(kubeconfig_yaml(server, ca, crt, key, user))
        self._start_containerd(log)
        t0 = time.monotonic()
        self._start_kubelet(ca, log)
        self.wait_ready(admin_kubeconfig, timeout=180)
        join = time.monotonic() - t0
        if not self.second:
            self._start_kube_proxy(log)
        return join

    def _start_containerd(self, log) -> None:  # noqa: ANN001
        lay = self.lay
        if self.pid("containerd"):
            return
        lay.containerd_config.parent.mkdir(parents=True, exist_ok=True)
        lay.containerd_config.write_text(
            containerd_toml(lay, shutil.which("runc") or "runc", CNI_BIN_DIR, self.bins.pause_ref)
        )
        conflist = cni_conflist(f"md-{self.cluster}", self.net, lay.cni_data_dir)
        (lay.cni_conf_dir / "10-modeldeploy.conflist").write_text(json.dumps(conflist, indent=1))
        log(f"[real-node] starting containerd ({lay.containerd_sock})")
        # the shim is found on PATH: ours first, never Debian's 1.6 one
        env = {**os.environ, "PATH": f"{self.bins.containerd_dir}:{os.environ.get('PATH', '')}"}
        self._spawn("containerd", [str(self.bins.containerd), "--config", str(lay.containerd_config)], env)
        failed = f"containerd did not start; see {lay.log('containerd')}"

        def started() -> bool:
            if self.ctr("version", check=False).returncode == 0:
                return True
            if not self.pid("containerd"):
                raise RuntimeError(failed)
            return False

        try:
            wait_until(started, 60, 0.3, "containerd to answer `ctr version`")
        except TimeoutError as e:
            raise RuntimeError(failed) from e
        r = self.ctr("images", "import", "--local", str(self.bins.pause_tar), check=False)
        if r.returncode != 0 or self.bins.pause_ref not in self.ctr("images", "ls", "-q").stdout:
            raise RuntimeError(f"importing {self.bins.pause_tar} failed: {r.stdout}{r.stderr}")

    def trust_registry(self, host_port: str) -> None:
        """Let containerd pull from the loopback registry over plain HTTP (read per pull)."""
        d = self.lay.certs_d / host_port
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(registry_hosts_toml(host_port))

    def _start_kubelet(self, ca: Path, log) -> None:  # noqa: ANN001
        lay = self.lay
        if self.pid("kubelet"):
            return
        if self.cgroup_parent:  # kubelet refuses a cgroupRoot that does not exist (cgroup v1 here)
            for ctrl in cleanup.CGROUP_ROOT.iterdir():
                if (ctrl / "cgroup.procs").exists():
                    (ctrl / self.cgroup_parent).mkdir(exist_ok=True)
                for f in ("cpuset.cpus", "cpuset.mems"):  # a new v1 cpuset starts empty: no task may join
                    if (ctrl / f).exists() and not (ctrl / self.cgroup_parent / f).read_text().strip():
                        (ctrl / self.cgroup_parent / f).write_text((ctrl / f).read_text())
        cgroup_root = f"/{self.cgroup_parent}" if self.cgroup_parent else "/"
        port = _free_port(self.net.gateway)
        lay.kubelet_config.write_text(kubelet_yaml(lay, self.net, port, ca, cgroup_root))
        log(f"[real-node] starting kubelet {self.name} ({self.net.gateway}, pods {self.net.pod_cidr})")
        self._spawn(
            "kubelet",
            [
                str(self.bins.kubelet),
                "--config",
                str(lay.kubelet_config),
                "--kubeconfig",
                str(lay.kubeconfig("kubelet")),
                "--root-dir",
                str(lay.kubelet_root),
                "--hostname-override",
                self.name,
                "--node-ip",
                self.net.gateway,
                "--node-labels",
                NODE_KIND_LABEL,
                "--v",
                "2",
            ],
        )

    def _start_kube_proxy(self, log) -> None:  # noqa: ANN001
        lay = self.lay
        if self.pid("kube-proxy"):
            return
        lay.kube_proxy_config.write_text(
            kube_proxy_yaml(
                lay.kubeconfig("kube-proxy"),
                self.net,
                self.name,
                _free_port("127.0.0.1"),
                _free_port("127.0.0.1"),
            )
        )
        log("[real-node] starting kube-proxy (iptables)")
        self._spawn(
            "kube-proxy", [str(self.bins.kube_proxy), "--config", str(lay.kube_proxy_config), "--v", "2"]
        )
        failed = f"kube-proxy did not program Services; see {lay.log('kube-proxy')}"

        def synced() -> bool:  # once the `kubernetes` Service has its chain in the nat table
            nat = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True).stdout
            if "KUBE-SVC-" in nat:
                return True
            if not self.pid("kube-proxy"):
                raise RuntimeError(failed)
            return False

        try:
            wait_until(synced, 60, 0.3, "kube-proxy to program Services")
        except TimeoutError as e:
            raise RuntimeError(failed) from e

    def wait_ready(self, kubeconfig: Path, timeout: float) -> None:
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))

        def ready() -> bool:
            with contextlib.suppress(Exception):
                n = core.read_node(self.name)
                if any(c.type == "Ready" and c.status == "True" for c in K.node_status(n).conditions or []):
                    return True
            if not self.pid("kubelet"):
                raise RuntimeError(f"kubelet exited; see {self.lay.log('kubelet')}")
            return False

        try:
            wait_until(ready, timeout, 0.5, f"node {self.name} Ready")
        except TimeoutError as e:
            raise TimeoutError(
                f"node {self.name} not Ready after {timeout}s; see {self.lay.log('kubelet')}"
            ) from e

    # --- processes ----------------------------------------------------------------------------
    def _spawn(self, component: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.lay.log(component), "ab") as logf:
            p = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        self.lay.pidfile(component).write_text(str(p.pid))

    def pid(self, component: str) -> int | None:
        try:
            pid = int(self.lay.pidfile(component).read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        with contextlib.suppress(ChildProcessError):  # our own child that exited: reap it
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return None
        return pid

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bins.ctr), "--address", str(self.lay.containerd_sock), "--namespace", "k8s.io", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)

    # --- down ---------------------------------------------------------------------------------
    def stop(self, admin_kubeconfig: Path | None, log=print) -> list[str]:  # noqa: ANN001
        """Drain (cordon, delete the node's pods through the kubelet so CNI DEL and unmounts run),
        stop kube-proxy and remove its rules, stop kubelet and containerd, then sweep whatever a
        crash left. Returns cleanup.leftovers(): [] when the host is clean."""
        if admin_kubeconfig and admin_kubeconfig.exists() and self.pid("kubelet"):
            with contextlib.suppress(Exception):
                self._drain(admin_kubeconfig, log)
        if not self.second:
            self._terminate("kube-proxy", log)
            if os.access(self.bins.kube_proxy, os.X_OK):
                subprocess.run([str(self.bins.kube_proxy), "--cleanup"], capture_output=True, timeout=120)
        self._terminate("kubelet", log)
        if self.pid("containerd"):
            for cid in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False)
        self._terminate("containerd", log)
        scope = {"parent": self.cgroup_parent, "rules": not self.second}
        cleanup.sweep(self.lay.base, self.net.bridge, log, **scope)
        if self.second:  # the first node's sweep flushes every tagged rule; a second one removes its own
            subprocess.run(["iptables", "-D", *self.forward_rule()], capture_output=True, check=False)
        left = cleanup.leftovers(self.lay.base, self.net.bridge, **scope)
        if not left:
            shutil.rmtree(self.lay.base, ignore_errors=True)
            if not self.second and self.owns_claim():
                self.claim.unlink(missing_ok=True)
        return left

    def _drain(self, kubeconfig: Path, log) -> None:  # noqa: ANN001
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        core.patch_node(self.name, {"spec": {"unschedulable": True}})
        sel = f"spec.nodeName={self.name}"
        pods = core.list_pod_for_all_namespaces(field_selector=sel).items
        if pods:
            log(f"[real-node] deleting {len(pods)} pods on {self.name}")
        for p in pods:
            with contextlib.suppress(Exception):
                core.delete_namespaced_pod(K.name(p), K.namespace(p), grace_period_seconds=5)
        with contextlib.suppress(TimeoutError):  # best effort: the node is deleted either way
            wait_until(
                lambda: not core.list_pod_for_all_namespaces(field_selector=sel).items,
                90,
                0.5,
                f"the pods on {self.name} to go",
            )
        with contextlib.suppress(Exception):
            core.delete_node(self.name)

    def _terminate(self, component: str, log) -> None:  # noqa: ANN001
        pid = self.pid(component)
        if pid is None:
            return
        log(f"[real-node] stopping {component} (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):  # then SIGKILL
            wait_until(lambda: not self.pid(component), 30, 0.2, f"{component} to exit")
        if self.pid(component):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.lay.pidfile(component).unlink(missing_ok=True)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
