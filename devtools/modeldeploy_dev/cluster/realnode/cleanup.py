"""What the real node leaves on the host, found and removed.

`leftovers()` is what `down` and the test assert is empty: processes whose command line names the
node's directory (kubelet, kube-proxy, containerd, every shim), container processes in the
kubepods cgroups, mounts and network namespaces under the directory, the bridge and its veths,
iptables/nftables rules kube-proxy or we wrote, the kubepods cgroups, kubelet's symlinks in
/var/log/containers. Only one real node runs per machine (node.py claims it), so KUBE-* chains
and kubepods cgroups are ours by construction.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
LOG_LINKS = Path("/var/log/containers")
RULE_TAG = "modeldeploy-realnode"


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    """Run a host tool; a tool that is not installed (nft, ip6tables) reads as empty output."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(list(cmd), 127, "", f"{cmd[0]}: not installed")


def processes(base: Path) -> list[int]:
    """Pids whose command line mentions the node directory (not this process)."""
    needle = str(base).encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (d / "cmdline").read_bytes():
                out.append(int(d.name))
    return sorted(out)


def kubepods_cgroups(parent: str = "") -> list[Path]:
    """Every kubepods cgroup directory, deepest first (the order rmdir needs). `parent`: the kubelet's
    cgroupRoot below each controller ("" for "/"; a second node on the machine has its own), whose
    own directory is listed too (last) when it is not the root."""
    dirs: list[Path] = []
    with contextlib.suppress(OSError):
        for ctrl in CGROUP_ROOT.iterdir():
            top = ctrl / parent / KUBEPODS if parent else ctrl / KUBEPODS
            if top.is_dir():
                dirs.extend(p for p in top.rglob("*") if p.is_dir())
                dirs.append(top)
            if parent and (ctrl / parent).is_dir():
                dirs.append(ctrl / parent)
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(parent: str = "") -> list[int]:
    pids: set[int] = set()
    for d in kubepods_cgroups(parent):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    return sorted(pids)


def mounts(base: Path) -> list[str]:
    """Mount points under base (overlay rootfs, tmpfs volumes, netns bind mounts), deepest first."""
    prefix = str(base).rstrip("/") + "/"
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if mp.startswith(prefix) or mp == prefix.rstrip("/"):
            out.append(mp)
    return sorted(set(out), key=lambda p: p.count("/"), reverse=True)


def links(bridge: str) -> list[str]:
    out = []
    if _run("ip", "link", "show", bridge).returncode == 0:
        out.append(bridge)
        for line in _run("ip", "-o", "link", "show", "master", bridge).stdout.splitlines():
            out.append(line.split(":")[1].strip().split("@")[0])
    return out


def iptables_rules() -> list[str]:
    """Rules and chains kube-proxy (KUBE-*) or the node (comment RULE_TAG) wrote, in any table."""
    found = []
    for tool in ("iptables-save", "ip6tables-save"):
        r = _run(tool)
        found += [f"{tool}: {ln}" for ln in r.stdout.splitlines() if "KUBE-" in ln or RULE_TAG in ln]
    r = _run("nft", "list", "tables")
    found += [f"nft: {ln}" for ln in r.stdout.splitlines() if "kube-proxy" in ln]
    return found


def log_links(base: Path) -> list[Path]:
    out = []
    with contextlib.suppress(OSError):
        for p in LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if p.is_symlink() and str(os.readlink(p)).startswith(str(base)):
                    out.append(p)
    return out


def leftovers(base: Path, bridge: str, parent: str = "", rules: bool = True) -> list[str]:
    """Human-readable list of everything of the node still on the host; [] when clean. A second node
    (`parent`: its cgroupRoot; `rules` False: it runs no kube-proxy) leaves the machine-wide iptables
    chains to the first."""
    left = [f"process {p}: {_cmd(p)}" for p in processes(base)]
    left += [f"container process {p}: {_cmd(p)}" for p in cgroup_pids(parent)]
    left += [f"mount {m}" for m in mounts(base)]
    left += [f"link {n}" for n in links(bridge)]
    left += [f"iptables {r}" for r in iptables_rules()] if rules else []
    left += [f"cgroup {d}" for d in kubepods_cgroups(parent)]
    left += [f"log link {p}" for p in log_links(base)]
    return left


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def kill_all(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def kill_node_processes(base: Path, parent: str = "", log=print, pause: float = 0.5) -> None:  # noqa: ANN001
    """SIGKILL the node's processes (command lines naming `base`: its daemons and runc shims) and its
    containers (the cgroups below `parent`), three rounds at most (a shim may start one meanwhile)."""
    for _ in range(3):
        pids = processes(base) + cgroup_pids(parent)
        if not pids:
            break
        log(f"[real-node] killing leftover processes {pids}")
        kill_all(pids)
        time.sleep(pause)


def sweep(base: Path, bridge: str, log=print, parent: str = "", rules: bool = True) -> None:  # noqa: ANN001
    """Remove whatever the orderly stop left (a crashed node, SIGKILLed shims): kill, unmount,
    delete links, rules (`rules`: the machine's one kube-proxy node only) and cgroups (below
    `parent`, the kubelet's cgroupRoot). Safe to run when nothing is left."""
    kill_node_processes(base, parent, log)
    for mp in mounts(base):
        if _run("umount", mp).returncode != 0:
            _run("umount", "-l", mp)
    for name in reversed(links(bridge)):  # veths first, the bridge last
        _run("ip", "link", "del", name)
    if rules:
        _flush_kube_chains()
    for d in kubepods_cgroups(parent):
        for _ in range(20):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # busy for a moment after its last process exits
                time.sleep(0.1)
    for p in log_links(base):
        p.unlink(missing_ok=True)


def _flush_kube_chains() -> None:
    """Delete rules tagged RULE_TAG and every KUBE-* chain (kube-proxy --cleanup ran before; this
    covers a kube-proxy killed mid-sync and kubelet's own KUBE-* canary chains)."""
    for save, cmd in (("iptables-save", "iptables"), ("ip6tables-save", "ip6tables")):
        table = None
        chains: list[tuple[str, str]] = []
        rules: list[tuple[str, str]] = []
        for ln in _run(save).stdout.splitlines():
            if ln.startswith("*"):
                table = ln[1:]
            elif ln.startswith(":KUBE-") and table:
                chains.append((table, ln[1:].split()[0]))
            elif ln.startswith("-A ") and table and ("KUBE-" in ln or RULE_TAG in ln):
                rules.append((table, ln))
        for table, rule in rules:
            if not rule.split()[1].startswith("KUBE-"):  # a jump from a built-in chain, or our tag
                _run(cmd, "-t", table, *_split_rule(rule.replace("-A ", "-D ", 1)))
        for table, chain in chains:
            _run(cmd, "-t", table, "-F", chain)
        for table, chain in chains:
            _run(cmd, "-t", table, "-X", chain)
    if "kube-proxy" in _run("nft", "list", "tables").stdout:
        for fam in ("ip", "ip6"):
            _run("nft", "delete", "table", fam, "kube-proxy")


def _split_rule(rule: str) -> list[str]:
    import shlex

    return shlex.split(rule)
