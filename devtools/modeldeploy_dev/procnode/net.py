"""Pod networking of the process node: one host-local bridge, one network namespace per pod.

Like the CNI bridge plugin: the bridge holds the first address of a private CIDR (the host side),
each pod gets a veth pair with `eth0` in its own namespace and the next free address. No default
route, no NAT, no forwarding rules: pods reach only the bridge subnet and the host, and nothing
is routed off the machine. The host reaches every pod at podIP:containerPort directly.
"""

from __future__ import annotations

import ipaddress
import subprocess
import threading
from pathlib import Path

NETNS_PREFIX = "mdpod-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], text=True, capture_output=True, check=check, timeout=30)


class Network:
    def __init__(self, bridge: str, cidr: str) -> None:
        self.bridge = bridge
        self.net = ipaddress.ip_network(cidr)
        if not self.net.is_private:
            raise ValueError(f"--pod-cidr {cidr} is not a private range")
        hosts = list(self.net.hosts())
        self.gateway = hosts[0]
        self.pool = hosts[1:]
        # namespaces are tagged with the bridge so two clusters on one machine never touch each other's
        self.prefix = f"{NETNS_PREFIX}{bridge}-"
        self._alloc = threading.Lock()  # pod workers start concurrently; one address each

    def ensure_bridge(self) -> None:
        if _ip("link", "show", self.bridge, check=False).returncode != 0:
            _ip("link", "add", self.bridge, "type", "bridge")
        addr = f"{self.gateway}/{self.net.prefixlen}"
        if addr not in _ip("-o", "addr", "show", "dev", self.bridge).stdout:
            _ip("addr", "add", addr, "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def netns_name(self, uid: str) -> str:
        return f"{self.prefix}{uid[:8]}"

    def existing(self) -> list[str]:
        out = _ip("netns", "list", check=False).stdout.split("\n")
        return [line.split()[0] for line in out if line.startswith(self.prefix)]

    def used_ips(self) -> set[str]:
        used: set[str] = set()
        for ns in self.existing():
            out = _ip("-n", ns, "-o", "-4", "addr", "show", "dev", "eth0", check=False).stdout
            for tok in out.split():
                if "/" in tok and tok[0].isdigit():
                    used.add(tok.split("/")[0])
        return used

    def add_pod(self, uid: str) -> tuple[str, str]:
        """Create (or find) the pod's namespace; returns (netns name, pod IP)."""
        with self._alloc:
            return self._add_pod(uid)

    def _add_pod(self, uid: str) -> tuple[str, str]:
        ns = self.netns_name(uid)
        if ns in self.existing():
            out = _ip("-n", ns, "-o", "-4", "addr", "show", "dev", "eth0").stdout
            for tok in out.split():
                if "/" in tok and tok[0].isdigit():
                    return ns, tok.split("/")[0]
            self.remove_pod(uid)
        self.ensure_bridge()  # cheap, and repairs a bridge someone deleted under us
        used = self.used_ips()
        free = next((str(a) for a in self.pool if str(a) not in used), None)
        if free is None:
            raise RuntimeError(f"pod CIDR {self.net} is full")
        host_if = f"mdv{uid[:8]}"[:15]
        _ip("netns", "add", ns)
        try:
            _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", host_if, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{free}/{self.net.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError:
            _ip("netns", "del", ns, check=False)
            _ip("link", "del", host_if, check=False)
            raise
        return ns, free

    def remove_pod(self, uid: str) -> None:
        ns = self.netns_name(uid)
        _ip("netns", "del", ns, check=False)  # deleting the namespace deletes its veth pair
        _ip("link", "del", f"mdv{uid[:8]}"[:15], check=False)

    def destroy_all(self) -> None:
        for ns in self.existing():
            _ip("netns", "del", ns, check=False)
        if Path(f"/sys/class/net/{self.bridge}").exists():
            _ip("link", "del", self.bridge, check=False)
