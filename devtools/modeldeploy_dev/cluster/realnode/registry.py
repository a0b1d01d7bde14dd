"""The local OCI registry: distribution's `registry` (build-node.sh) on 127.0.0.1:<port>.

Images are pushed to it (`docker push`, which treats loopback registries as plain HTTP) and the
real node pulls them by digest through containerd, as a cluster pulls from any registry. Its
storage lives in ~/.cache/modeldeploy/registry/ and outlives a cluster: a multi-GB runtime image
is pushed once per content change, not once per `up`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from modeldeploy_dev.wait import wait_until


class Registry:
    def __init__(self, binary: Path, storage: Path, run_dir: Path, port: int) -> None:
        if not 1024 <= port <= 65535:
            raise ValueError(f"registry port {port} must be in 1024..65535")
        self.binary = binary
        self.storage = storage
        self.run_dir = run_dir
        self.port = port

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pidfile(self) -> Path:
        return self.run_dir / "registry.pid"

    def config(self) -> str:
        # no debug listener, no redirect, no auth: loopback only, as a pull-through of this machine
        return (
            "version: 0.1\nlog:\n  level: info\n  accesslog: {disabled: true}\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
        )

    def up(self) -> None:
        if self.pid():
            return
        if self.healthy():
            raise RuntimeError(f"a registry not started here ({self.pidfile}) answers on {self.host}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        cfg = self.run_dir / "registry.yml"
        cfg.write_text(self.config())
        # distribution v3 exports traces over OTLP unless told otherwise: nowhere to send them
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "none"}
        with open(self.run_dir / "registry.log", "ab") as log:
            p = subprocess.Popen(
                [str(self.binary), "serve", str(cfg)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        self.pidfile.write_text(str(p.pid))
        failed = f"registry did not start on {self.host}; see {self.run_dir / 'registry.log'}"

        def up() -> bool:
            if self.healthy() and self.pid():
                return True
            if not self.pid():
                raise RuntimeError(failed)
            return False

        try:
            wait_until(up, 30, 0.2, f"the registry on {self.host}")
        except TimeoutError as e:
            raise RuntimeError(failed) from e

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def has_manifest(self, repo: str, digest: str) -> bool:
        req = urllib.request.Request(
            f"http://{self.host}/v2/{repo}/manifests/{digest}",
            method="HEAD",
            headers={
                "Accept": "application/vnd.oci.image.manifest.v1+json, "
                "application/vnd.docker.distribution.manifest.v2+json, "
                "application/vnd.oci.image.index.v1+json"
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status == 200
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise

    def pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return None
        return pid

    def down(self) -> None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):  # then SIGKILL
                wait_until(lambda: not self.pid(), 20, 0.1, "the registry to exit")
            if self.pid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)
