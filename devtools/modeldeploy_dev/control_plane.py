"""A bare control plane: etcd and kube-apiserver only, for tests and benches that need a real API server
(its OpenAPI and CEL validation, its storage, its watches) and nothing else.

No kube-controller-manager, no scheduler, no nodes: nothing garbage-collects children, finalizes a
namespace or runs a pod. What it buys over the kwokctl cluster (`modeldeploy_dev.cluster.local`) is that it
is private and cheap: its own temp dir, its own free loopback ports, a static token file for
authentication (the simplest honest auth: one user in `system:masters` under RBAC), the API server's
self-signed serving certificate verified by the kubeconfig, and a start of a few seconds. It never
touches the shared `modeldeploy` cluster, its kwokctl workdir or run dir.

    with ControlPlane() as cp:
        config.load_kube_config(str(cp.kubeconfig))

Both processes run in their own process group and are killed by pid on exit (SIGTERM, then SIGKILL);
the temp dir is removed unless `keep=True`. Binaries come from `make cluster-build`
(`modeldeploy_dev.cluster.local.Binaries`); `missing()` says which are absent.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from modeldeploy_dev.cluster.local import Binaries, cache_root, pinned_versions
from modeldeploy_dev.wait import wait_until

START_TIMEOUT_S = 90.0  # etcd and the API server each; a loaded 2-core machine needs ~10-20 s for the latter
STOP_TIMEOUT_S = 15.0


def binaries() -> Binaries:
    return Binaries(cache_root(), pinned_versions())


def missing() -> list[Path]:
    """The binaries this needs that `make cluster-build` has not built (empty when all are there)."""
    b = binaries()
    return [p for p in (b.etcd, b.kube_dir / "kube-apiserver") if not os.access(p, os.X_OK)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ControlPlane:
    """etcd + kube-apiserver on free loopback ports in a temp dir; a context manager."""

    def __init__(self, keep: bool = False, extra_apiserver_args: tuple[str, ...] = ()) -> None:
        self.keep = keep
        self.extra = extra_apiserver_args
        self.dir = Path(tempfile.mkdtemp(prefix="modeldeploy-cp-"))
        self.kubeconfig = self.dir / "kubeconfig"
        self.etcd_port, self.peer_port, self.api_port = _free_port(), _free_port(), _free_port()
        self.token = secrets.token_hex(16)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    # --- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if gone := missing():
            raise FileNotFoundError(f"not built: {', '.join(map(str, gone))} (run `make cluster-build`)")
        b = binaries()
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                str(b.etcd),
                "--name=fuzz",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{self.peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{self.peer_port}",
                f"--initial-cluster=fuzz=http://127.0.0.1:{self.peer_port}",
                "--unsafe-no-fsync",  # a throwaway store: fsync only slows a shared disk down
                "--quota-backend-bytes=4294967296",
            ],
        )
        wait_until(
            lambda: self._get(f"{etcd_url}/health", tls=False), START_TIMEOUT_S, 0.2, "etcd /health",
            ignore=(OSError,),
        )  # fmt: skip
        self._apiserver(etcd_url)
        self._write_kubeconfig()
        wait_until(
            lambda: self._get(f"{self.server}/readyz"), START_TIMEOUT_S, 0.3, "kube-apiserver /readyz",
            ignore=(OSError,),
        )  # fmt: skip

    def _apiserver(self, etcd_url: str) -> None:
        sa_key = self.dir / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True, timeout=60
        )
        tokens = self.dir / "tokens.csv"
        tokens.write_text(f'{self.token},fuzz-admin,fuzz-admin,"system:masters"\n')
        tokens.chmod(0o600)
        self._spawn(
            "kube-apiserver",
            [
                str(binaries().kube_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={self.dir / 'certs'}",  # a self-signed serving certificate is generated here
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--disable-admission-plugins=ServiceAccount",  # no token controller runs to back it
                "--enable-priority-and-fairness=false",  # one client; APF only queues it on a busy host
                *self.extra,
            ],
        )

    def _write_kubeconfig(self) -> None:
        # the generated certificate file holds the serving certificate and the CA that signed it
        crt = self.dir / "certs" / "apiserver.crt"
        wait_until(crt.exists, START_TIMEOUT_S, 0.2, f"{crt}")
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: fuzz\n  cluster:\n    server: {self.server}\n"
            f"    certificate-authority: {crt}\n"
            f"users:\n- name: fuzz-admin\n  user:\n    token: {self.token}\n"
            "contexts:\n- name: fuzz\n  context: {cluster: fuzz, user: fuzz-admin}\n"
            "current-context: fuzz\n"
        )
        self.kubeconfig.chmod(0o600)

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._check_alive()
        with open(self.dir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True
            )

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log_tail(name)}")

    def _get(self, url: str, tls: bool = True) -> bool:
        self._check_alive()
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        ctx = None
        if tls:
            ctx = ssl.create_default_context(cafile=str(self.dir / "certs" / "apiserver.crt"))
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False

    def log_tail(self, name: str, n: int = 30) -> str:
        path = self.dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs.values())

    def stop(self) -> None:
        """Kill the API server, then etcd (each by its process group), then remove the temp dir."""
        for name in ("kube-apiserver", "etcd"):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=STOP_TIMEOUT_S)
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":  # a smoke check: up, one request, down
    t0 = time.monotonic()
    with ControlPlane() as cp:
        print(f"up in {time.monotonic() - t0:.1f}s at {cp.server}, kubeconfig {cp.kubeconfig}")
