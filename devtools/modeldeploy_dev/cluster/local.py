"""Bring a local Kubernetes control plane up and down with kwokctl and the locally built binaries.

kwokctl (`create cluster --runtime binary`) owns certificates, ports, component flags, pid files
and process lifecycles of etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the
kwok controller; we only point it at the binaries `build.sh` compiled. What kwokctl cannot do is
run real pods, so the process node (`modeldeploy_dev.procnode`) is started here as one more
background process with its own pid file, and `down` stops it before deleting the cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from modeldeploy_dev.wait import wait_until

HERE = Path(__file__).resolve().parent


def cache_root() -> Path:
    return Path(os.environ.get("MODELDEPLOY_CACHE", Path.home() / ".cache" / "modeldeploy"))


def pinned_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


@dataclass
class Binaries:
    """Paths of the cached binaries, keyed by component and version (see build.sh)."""

    root: Path
    versions: dict[str, str]

    def _p(self, component: str, key: str, name: str) -> Path:
        return self.root / f"{component}-{self.versions[key]}" / name

    @property
    def kube_dir(self) -> Path:
        return self._p("kubernetes", "K8S_VERSION", "")

    @property
    def kubectl(self) -> Path:
        return self._p("kubernetes", "K8S_VERSION", "kubectl")

    @property
    def etcd(self) -> Path:
        return self._p("etcd", "ETCD_VERSION", "etcd")

    @property
    def kwok(self) -> Path:
        return self._p("kwok", "KWOK_VERSION", "kwok")

    @property
    def kwokctl(self) -> Path:
        return self._p("kwok", "KWOK_VERSION", "kwokctl")

    @property
    def helm(self) -> Path:
        return self._p("helm", "HELM_VERSION", "helm")

    @property
    def prometheus(self) -> Path:
        """For the canary-analysis tests only: not part of the cluster, so not in `all()`."""
        return self._p("prometheus", "PROMETHEUS_VERSION", "prometheus")

    @property
    def promtool(self) -> Path:
        """Same module and version as prometheus: checks and unit-tests the chart's rules and queries."""
        return self._p("prometheus", "PROMETHEUS_VERSION", "promtool")

    def all(self) -> list[Path]:
        k = self.kube_dir
        kube = [k / n for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")]
        return [*kube, self.etcd, self.kwok, self.kwokctl, self.helm]

    def missing(self) -> list[Path]:
        return [p for p in self.all() if not os.access(p, os.X_OK)]


# Client-side rate limits of the controllers kwokctl starts without any: kube-controller-manager's
# default, 20 QPS (burst 30) per controller, makes its Deployment and ReplicaSet controllers the floor
# of anything with hundreds of objects (about 5 writes per Deployment each: 1,000 Deployments took
# 243-248 s to be Ready with no operator running, bench/results/operator.md). Clusters of thousands
# of nodes run them higher (the Kubernetes scalability jobs: 100); kwok's own client has no limit.
CLIENT_QPS, CLIENT_BURST = 100, 200
CLIENT_RATE_PATCHES = "".join(
    f"- name: {c}\n  extraArgs:\n"
    f"  - {{key: kube-api-qps, value: '{CLIENT_QPS}'}}\n"
    f"  - {{key: kube-api-burst, value: '{CLIENT_BURST}'}}\n"
    for c in ("kube-controller-manager", "kube-scheduler")
)


@dataclass
class Settings:
    """One local cluster. Two clusters on one machine need different names, bridges and CIDRs."""

    name: str = field(default_factory=lambda: os.environ.get("MODELDEPLOY_CLUSTER_NAME", "modeldeploy"))
    gpu_nodes: int = 2
    ready_delay_ms: int = 1000
    process_node: str = "proc-0"  # "" leaves it out (a real-node-only cluster, e2e/test_real_node.py)
    bridge: str = field(default_factory=lambda: os.environ.get("MODELDEPLOY_CLUSTER_BRIDGE", "mdbr0"))
    pod_cidr: str = field(
        default_factory=lambda: os.environ.get("MODELDEPLOY_CLUSTER_POD_CIDR", "10.244.0.0/24")
    )
    # the real worker node (realnode/): opt-in, because its first build compiles kubelet,
    # kube-proxy, containerd and a registry (minutes on a cold Go cache)
    real_node: bool = False
    real_node_name: str = "real-0"
    node_bridge: str = field(
        default_factory=lambda: os.environ.get("MODELDEPLOY_CLUSTER_NODE_BRIDGE", "mdrn0")
    )
    node_pod_cidr: str = field(
        default_factory=lambda: os.environ.get("MODELDEPLOY_CLUSTER_NODE_POD_CIDR", "10.244.200.0/24")
    )
    api_port: int = 0  # real node only: see LocalCluster.api_port
    registry_port: int = field(
        default_factory=lambda: int(os.environ.get("MODELDEPLOY_CLUSTER_REGISTRY_PORT", "5000"))
    )


def real_node_settings() -> Settings:
    """A cluster of its own with the real node `real-0` only (no process node, no kwok nodes): the
    real-node e2e and `bench/chaos.py --node real`. Its name is the default one plus `-rn`."""
    s = Settings(gpu_nodes=0, process_node="", real_node=True)
    s.name = f"{s.name}-rn"
    s.bridge, s.pod_cidr = s.node_bridge, s.node_pod_cidr  # no process node: its fields are unused
    return s


class LocalCluster:
    def __init__(self, settings: Settings | None = None) -> None:
        self.s = settings or Settings()
        self.bins = Binaries(cache_root(), pinned_versions())
        self.workdir = cache_root() / "kwokctl"  # KWOK_WORKDIR: kwokctl keeps clusters/<name>/ here
        self.run_dir = cache_root() / "run" / self.s.name  # ours: kubeconfig, process node state
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.procnode_dir = self.run_dir / "procnode"
        self.procnode_pidfile = self.run_dir / "procnode.pid"

    @classmethod
    def existing(cls, name: str | None = None) -> LocalCluster:
        """The cluster as `up` recorded it (bridge, CIDR, ...), so `down`/`status` act on the right
        network; defaults when it was never brought up."""
        c = cls(Settings(name=name) if name else Settings())
        with contextlib.suppress(OSError, ValueError, TypeError):
            c.s = Settings(**json.loads(c.settings_file.read_text()))
        return c

    @property
    def settings_file(self) -> Path:
        return self.run_dir / "settings.json"

    # --- helpers ---------------------------------------------------------------------------
    @property
    def cluster_dir(self) -> Path:
        return self.workdir / "clusters" / self.s.name

    @property
    def logs_dir(self) -> Path:
        return self.cluster_dir / "logs"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KWOK_WORKDIR"] = str(self.workdir)
        env["PATH"] = f"{self.bins.kube_dir}:{env.get('PATH', '')}"
        env.pop("KUBECONFIG", None)
        return env

    def kwokctl(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bins.kwokctl), "--name", self.s.name, *args]
        return subprocess.run(
            cmd, env=self._env(), text=True, capture_output=True, check=check, timeout=timeout
        )

    @contextlib.contextmanager
    def _lock(self, name: str | None = None) -> Iterator[None]:
        """Serialise up/down of one cluster name across processes (several engineers, one machine)."""
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir.parent / f"{name or self.s.name}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # --- build -----------------------------------------------------------------------------
    def build(self) -> None:
        """Compile whatever is missing (prints one line per binary); a no-op when all are cached."""
        if self.bins.missing():
            subprocess.run(["bash", str(HERE / "build.sh")], check=True)
            if missing := self.bins.missing():
                raise RuntimeError(f"build.sh finished but these binaries are missing: {missing}")
        if self.s.real_node and self.real_node().bins.missing():
            subprocess.run(["bash", str(HERE / "build-node.sh")], check=True)
            if missing := self.real_node().bins.missing():
                raise RuntimeError(f"build-node.sh finished but the real node lacks: {missing}")

    def real_node(self):  # noqa: ANN201 - RealNode, imported lazily (the CLI loads this module)
        from modeldeploy_dev.cluster.realnode import NodeBinaries, NodeNet, RealNode

        return RealNode(
            self.s.real_node_name,
            self.s.name,
            NodeNet(self.s.node_bridge, self.s.node_pod_cidr),
            self.run_dir / "realnode",
            NodeBinaries(cache_root(), self.bins.versions),
            claim=cache_root() / "run" / "realnode.owner",
        )

    def spare_real_node(self, name: str = "real-1"):  # noqa: ANN201 - RealNode (lazy import)
        """A second real node of this cluster, for the chaos cases that lose a node: its own bridge
        (`<bridge>s`) and pod CIDR (the real node's, 10 higher in its third octet), directory and cgroup
        root; no kube-proxy and no machine claim (RealNode `second`). Started and stopped by the case."""
        import ipaddress

        from modeldeploy_dev.cluster.realnode import NodeBinaries, NodeNet, RealNode

        net = ipaddress.ip_network(self.s.node_pod_cidr)
        cidr = ipaddress.ip_network((int(net.network_address) + (10 << 8), net.prefixlen))
        return RealNode(
            name,
            self.s.name,
            NodeNet(f"{self.s.node_bridge}s", str(cidr)),
            self.run_dir / f"realnode-{name}",
            NodeBinaries(cache_root(), self.bins.versions),
            claim=cache_root() / "run" / "realnode.owner",
            second=True,
        )

    def start_spare_real_node(self, node, log=print) -> float:  # noqa: ANN001 - RealNode, print-like
        """Start `node` (spare_real_node()) against this running cluster; the join time in seconds."""
        node.trust_registry(self.registry().host)
        return node.start(self.kubeconfig, self.cluster_dir / "pki", self.api_server(), log)

    def registry(self):  # noqa: ANN201 - Registry (lazy import, like real_node)
        """The loopback registry the real node pulls from; its storage outlives the cluster."""
        from modeldeploy_dev.cluster.realnode import NodeBinaries
        from modeldeploy_dev.cluster.realnode.registry import Registry

        bins = NodeBinaries(cache_root(), self.bins.versions)
        # one registry per port on this machine, whoever started it (a cluster, `make images`)
        run = cache_root() / "run" / f"registry-{self.s.registry_port}"
        return Registry(bins.registry, cache_root() / "registry", run, self.s.registry_port)

    # --- state -----------------------------------------------------------------------------
    def cluster_running(self) -> bool:
        if not self.cluster_dir.exists() or not self.bins.kwokctl.exists():
            return False
        r = self.kwokctl("get", "components", check=False, timeout=30)
        return (
            r.returncode == 0
            and "kube-apiserver" in r.stdout
            and "Unknown" not in r.stdout
            and "Stopped" not in r.stdout
        )

    def procnode_pid(self) -> int | None:
        try:
            pid = int(self.procnode_pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    # --- up --------------------------------------------------------------------------------
    def _config_file(self) -> Path:
        b = self.bins
        patches, options = "", ""
        if self.s.real_node:
            # Pods reach the API through the `kubernetes` Service, which kube-proxy DNATs to the
            # advertise address: the node's bridge address. kwokctl wires its components over
            # 127.0.0.1, so kube-apiserver listens on all addresses and the node's firewall rules
            # (RealNode.guard_api_port) admit only loopback and the bridge to its port.
            from modeldeploy_dev.cluster.realnode.config import SERVICE_CIDR, SERVICE_IP

            gw, port = self.real_node().net.gateway, self.api_port()
            pki = self.cluster_dir / "pki"
            # in-cluster clients verify https://10.0.0.1 against the ServiceAccount's ca.crt
            options = f"  kubeApiserverPort: {port}\n  kubeApiserverCertSANs: ['{SERVICE_IP}', '{gw}']\n"
            # (override: true replaces a flag kwokctl sets; without it a flag is added)
            patches = (
                "- name: kube-apiserver\n  extraArgs:\n"
                f"  - {{key: service-cluster-ip-range, value: '{SERVICE_CIDR}'}}\n"
                f"  - {{key: advertise-address, value: '{gw}'}}\n"
                "  - {key: bind-address, value: 0.0.0.0, override: true}\n"
                # `kubectl logs/exec` on the real node: the apiserver shows kubelet a client
                # certificate of the cluster CA (kubelet refuses anonymous requests)
                "  - {key: kubelet-preferred-address-types, value: InternalIP}\n"
                f"  - {{key: kubelet-client-certificate, value: '{pki / 'admin.crt'}'}}\n"
                f"  - {{key: kubelet-client-key, value: '{pki / 'admin.key'}'}}\n"
            )
        cfg = (
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokctlConfiguration\noptions:\n"
            f"  runtime: binary\n  bindAddress: 127.0.0.1\n{options}"
            f"  kubeVersion: {b.versions['K8S_VERSION']}\n  kwokVersion: {b.versions['KWOK_VERSION']}\n"
            f"  etcdVersion: {b.versions['ETCD_VERSION'].lstrip('v')}\n"
            f"  kubeBinaryPrefix: {b.kube_dir.as_posix().rstrip('/')}\n  kubectlBinary: {b.kubectl}\n"
            f"  etcdBinary: {b.etcd}\n  kwokControllerBinary: {b.kwok}\n"
            "  kubeAdmission: true\n  kubeAuthorization: true\n  securePort: true\n"
            # kwokctl's binary runtime starts kwok with --manage-all-nodes=true, which would make kwok
            # fake the process node too; restrict it to nodes annotated kwok.x-k8s.io/node=fake.
            "componentsPatches:\n- name: kwok-controller\n  extraArgs:\n"
            "  - {key: manage-all-nodes, value: 'false', override: true}\n"
            "  - {key: manage-nodes-with-annotation-selector, value: kwok.x-k8s.io/node=fake}\n"
            f"{CLIENT_RATE_PATCHES}{patches}"
        )
        stages = (HERE / "stages.yaml").read_text().replace("__READY_DELAY_MS__", str(self.s.ready_delay_ms))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "kwokctl.yaml"
        path.write_text(cfg + "---\n" + stages)
        return path

    def up(self, log=print) -> float:  # noqa: ANN001 - a print-like callable
        """Idempotent: builds what is missing, creates the cluster unless it runs, starts the process
        node unless it runs, and waits until every node is Ready. Returns the seconds it took."""
        t0 = time.monotonic()
        self.build()
        with self._lock():
            if self.s.real_node and self.cluster_running() and not self._recorded().get("real_node"):
                raise RuntimeError(
                    f"cluster {self.s.name} runs without the real node (its API listens on loopback only): "
                    "`modeldeploy cluster down` it, then `up --real-node`"
                )
            if self.s.real_node:
                self.s.api_port = self.s.api_port or self._recorded().get("api_port", 0)
                node = self.real_node()
                node.claim_machine()  # before anything is created: one real node per machine
                node.ensure_bridge()  # the apiserver advertises its address
                node.guard_api_port(self.api_port())
            if not self.cluster_running():
                if self.cluster_dir.exists():  # stopped or half-created: start from scratch
                    self.kwokctl("delete", "cluster", "--kubeconfig", str(self.kubeconfig), check=False)
                self.run_dir.mkdir(parents=True, exist_ok=True)
                log(f"[cluster] creating {self.s.name} (kwokctl, binary runtime)")
                # machine-wide: kwokctl picks free ports at create time, so two clusters created at
                # the same moment could pick the same one (seen: both kwok controllers on one port)
                with self._lock(".create"):
                    r = self.kwokctl(
                        "create",
                        "cluster",
                        "--config",
                        str(self._config_file()),
                        "--kubeconfig",
                        str(self.kubeconfig),
                        "--wait",
                        "2m",
                        "--quiet-pull",
                        check=False,
                    )
                if r.returncode != 0:
                    raise RuntimeError(
                        f"kwokctl create cluster failed:\n{r.stdout}\n{r.stderr}\nlogs: {self.logs_dir}"
                    )
            self._write_kubeconfig()
            self.settings_file.write_text(json.dumps(dataclasses.asdict(self.s)))
            from modeldeploy_dev.cluster.nodes import apply_nodes

            apply_nodes(str(self.kubeconfig), self.s)
            if self.s.process_node and self.procnode_pid() is None:
                self._start_procnode()
            from modeldeploy_dev.cluster.nodes import wait_ready

            wait_ready(str(self.kubeconfig), self.s, timeout=90)
            if self.s.real_node:
                reg = self.registry()
                reg.up()
                self.real_node().trust_registry(reg.host)
                join = self.real_node().start(
                    self.kubeconfig, self.cluster_dir / "pki", self.api_server(), log
                )
                log(f"[cluster] real node {self.s.real_node_name} joined in {join:.1f}s")
        dt = time.monotonic() - t0
        log(f"[cluster] {self.s.name} up in {dt:.1f}s; KUBECONFIG={self.kubeconfig}")
        return dt

    def api_port(self) -> int:
        """The apiserver port of a real-node cluster: chosen before kwokctl runs, so the firewall
        rules that keep it off the network are in place before it listens (kept in settings)."""
        if not self.s.api_port:
            with contextlib.closing(socket.socket()) as sock:
                sock.bind(("127.0.0.1", 0))
                self.s.api_port = sock.getsockname()[1]
        return self.s.api_port

    def _recorded(self) -> dict:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(self.settings_file.read_text())
        return {}

    def api_server(self) -> str:
        import yaml

        return yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]

    def _write_kubeconfig(self) -> None:
        r = self.kwokctl("get", "kubeconfig")
        self.kubeconfig.write_text(r.stdout)
        self.kubeconfig.chmod(0o600)

    def _start_procnode(self) -> None:
        self.procnode_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.procnode_dir / "procnode.log", "ab")  # noqa: SIM115 - handed to the child
        cmd = [
            sys.executable,
            "-m",
            "modeldeploy_dev.procnode",
            "--kubeconfig",
            str(self.kubeconfig),
            "--node",
            self.s.process_node,
            "--bridge",
            self.s.bridge,
            "--pod-cidr",
            self.s.pod_cidr,
            "--state-dir",
            str(self.procnode_dir),
        ]
        p = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=self._env(),
        )
        self.procnode_pidfile.write_text(str(p.pid))

    # --- down ------------------------------------------------------------------------------
    def down(self, log=print) -> None:  # noqa: ANN001
        """Stop the process node (it stops its pods and removes their namespaces and the bridge),
        then let kwokctl stop and delete the control plane. Leaves no process and no port."""
        with self._lock():
            if self.s.real_node:
                spare = self.spare_real_node()
                if spare.lay.base.exists():  # a chaos case that never removed its second node
                    if left := spare.stop(None, log):
                        log(f"[cluster] second real node left behind: {left}")
                node = self.real_node()
                self.registry().down()
                left = node.stop(self.kubeconfig if self.cluster_running() else None, log)
                if left:
                    log(f"[cluster] real node left behind: {left}")
            pid = self.procnode_pid()
            if pid is not None:
                log(f"[cluster] stopping process node (pid {pid})")
                os.kill(pid, signal.SIGTERM)
                if not _wait_gone(pid, 60):
                    os.kill(pid, signal.SIGKILL)
                    _wait_gone(pid, 5)
            from modeldeploy_dev.procnode.net import Network
            from modeldeploy_dev.procnode.pids import kill_leftovers

            if left := kill_leftovers(self.procnode_dir):  # a crashed node leaves pod processes
                log(f"[cluster] killed leftover pod processes {left}")
            # ... and namespaces, but only of a cluster `up` recorded: a name never brought up (or
            # already down) has default settings, whose bridge may be another live cluster's (seen: a
            # manual `down` of a finished test cluster tore down a running CI cluster's pod network)
            if self.settings_file.exists():
                Network(self.s.bridge, self.s.pod_cidr).destroy_all()
            if self.cluster_dir.exists() and self.bins.kwokctl.exists():
                log(f"[cluster] deleting {self.s.name}")
                pids = self.component_pids()
                r = self.kwokctl("delete", "cluster", "--kubeconfig", str(self.kubeconfig), check=False)
                if r.returncode != 0:
                    raise RuntimeError(f"kwokctl delete cluster failed:\n{r.stdout}\n{r.stderr}")
                # kwokctl signals the components and returns at once; wait for them to exit
                for pid in pids:
                    if not _wait_gone(pid, 30):
                        log(f"[cluster] pid {pid} ignored SIGTERM for 30s: SIGKILL")
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                        _wait_gone(pid, 5)
            self.procnode_pidfile.unlink(missing_ok=True)
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def component_pids(self) -> list[int]:
        """Pids of the processes kwokctl started for this cluster (its pid files)."""
        out = []
        for f in (self.cluster_dir / "pids").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                out.append(int(f.read_text().strip()))
        return out

    # --- status ----------------------------------------------------------------------------
    def status(self) -> dict[str, object]:
        running = self.cluster_running()
        out: dict[str, object] = {
            "name": self.s.name,
            "running": running,
            "kubeconfig": str(self.kubeconfig),
            "logs": str(self.logs_dir),
            "procnode_pid": self.procnode_pid(),
            "procnode_logs": str(self.procnode_dir),
            "missing_binaries": [str(p) for p in self.bins.missing()],
        }
        if running:
            out["components"] = self.kwokctl("get", "components", check=False).stdout.strip()
        return out


def _wait_gone(pid: int, timeout: float) -> bool:
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False

    try:
        return wait_until(gone, timeout, 0.1, f"pid {pid} to exit")
    except TimeoutError:
        return False
