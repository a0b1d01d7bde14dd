"""A real Argo CD (v3.2.5, built by devtools/modeldeploy_dev/cluster/build-argocd.sh) beside a local
cluster, for the GitOps e2e.

Redis, the repo server, the application controller and the API server run as processes on this
machine, the way Argo CD's own local development runs them (one `argocd` binary, named per
component by ARGOCD_BINARY_NAME; ARGOCD_FAKE_IN_CLUSTER with a kubeconfig whose namespace is
`argocd`). Their state lives where a real install keeps it: the Application and AppProject CRDs,
the `argocd-cm`, `argocd-rbac-cm` and `argocd-secret` objects in the `argocd` namespace. The
"remote" is a bare git repository on this machine, which Argo CD reads over `file://`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modeldeploy_dev.cluster.local import Binaries, cache_root, pinned_versions
from modeldeploy_dev.serve_process import free_port
from modeldeploy_dev.wait import wait_until

NAMESPACE = "argocd"
ROOT = Path(__file__).resolve().parents[2]
ARGOCD_DIR = ROOT / "charts/modeldeploy-operator/argocd"
PART_OF = {"app.kubernetes.io/part-of": "argocd"}  # Argo CD's settings informers select on this label


def argocd_dir() -> Path:
    return cache_root() / f"argocd-{pinned_versions()['ARGOCD_VERSION']}"


def available() -> str | None:
    """None when Argo CD can run here, else what is missing (a test skips with it)."""
    if not (argocd_dir() / "argocd").exists():
        return f"{argocd_dir() / 'argocd'} is not built: make argocd-build"
    for tool in ("redis-server", "git"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install {tool.split('-')[0]})"
    return None


def argocd_cm_data() -> dict[str, str]:
    """The ModelDeployment customizations of argocd-cm, as the chart ships them (argocd-cm-snippet.yaml)."""
    snippet = yaml.safe_load((ARGOCD_DIR / "argocd-cm-snippet.yaml").read_text())
    return dict(snippet["data"])


@dataclass
class GitRemote:
    """A bare repository (the remote Argo CD reads) and a working clone the test commits in."""

    root: Path
    bare: Path = field(init=False)
    work: Path = field(init=False)

    def __post_init__(self) -> None:
        self.bare, self.work = self.root / "remote.git", self.root / "work"
        self.root.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "--bare", "-b", "main", str(self.bare), cwd=self.root)
        self.git("clone", "-q", str(self.bare), str(self.work), cwd=self.root)

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def git(self, *args: str, cwd: Path | None = None) -> str:
        env = os.environ | {
            "GIT_AUTHOR_NAME": "modeldeploy e2e",
            "GIT_AUTHOR_EMAIL": "e2e@modeldeploy.invalid",
            "GIT_COMMITTER_NAME": "modeldeploy e2e",
            "GIT_COMMITTER_EMAIL": "e2e@modeldeploy.invalid",
        }
        r = subprocess.run(
            ["git", *args], cwd=cwd or self.work, env=env, capture_output=True, text=True, timeout=60
        )
        if r.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout.strip()

    def commit(self, files: dict[str, str], message: str) -> str:
        """Write FILES (path -> text) in the clone, commit and push; the new commit's sha."""
        for rel, text in files.items():
            p = self.work / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        self.git("push", "-q", "origin", "HEAD:main")
        return self.git("rev-parse", "HEAD")

    def revert(self, sha: str) -> str:
        self.git("revert", "--no-edit", sha)
        self.git("push", "-q", "origin", "HEAD:main")
        return self.git("rev-parse", "HEAD")


class ArgoCD:
    """Argo CD's components as processes against the cluster of `kubeconfig`; `stop()` ends them."""

    def __init__(self, kubeconfig: str, workdir: Path, kubectl: Path | None = None) -> None:
        self.binary = argocd_dir() / "argocd"
        self.crds = argocd_dir() / "crds"
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.kubectl_bin = kubectl or Binaries(cache_root(), pinned_versions()).kubectl
        self.helm_dir = Binaries(cache_root(), pinned_versions()).helm.parent
        self.kubeconfig = self._namespaced_kubeconfig(kubeconfig)
        self.password = secrets.token_urlsafe(12)
        self.ports = {
            k: free_port()
            for k in ("redis", "repo", "repo_metrics", "ctl_metrics", "server", "server_metrics")
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.cli_config = workdir / "cli-config"

    # ---- set-up ----

    def _namespaced_kubeconfig(self, src: str) -> Path:
        """A copy of the kubeconfig whose current context's namespace is `argocd` (the components
        find their ConfigMaps and Applications in their own namespace)."""
        cfg = yaml.safe_load(Path(src).read_text())
        current = cfg["current-context"]
        for ctx in cfg["contexts"]:
            if ctx["name"] == current:
                ctx["context"]["namespace"] = NAMESPACE
        out = self.workdir / "kubeconfig"
        out.write_text(yaml.safe_dump(cfg))
        return out

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [str(self.kubectl_bin), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r

    def install(self, extra_cm: dict[str, str] | None = None) -> None:
        """The CRDs, the namespace and Argo CD's settings objects (what its install manifests create)."""
        self.kubectl("apply", "--server-side", "-f", str(self.crds))
        crds = ("applications", "applicationsets", "appprojects")

        def established() -> bool:  # `kubectl wait` errors while a new CRD has no conditions yet
            items = json.loads(
                self.kubectl("get", *(f"crd/{c}.argoproj.io" for c in crds), "-o", "json").stdout
            )
            return all(
                any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in i["status"].get("conditions") or []
                )
                for i in items["items"]
            )

        wait_until(established, 60, 0.5, "Argo CD's CRDs Established")
        bcrypt = self.run_cli("account", "bcrypt", "--password", self.password, login=False).strip()
        objs: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "argocd-cm", "namespace": NAMESPACE, "labels": PART_OF},
                # the admin account's login, for the CLI and the API; a short reconciliation period so an
                # unnoticed push shows within the test's bounds (a git webhook refreshes at once)
                "data": {
                    "admin.enabled": "true",
                    "timeout.reconciliation": "30s",
                    **argocd_cm_data(),
                    **(extra_cm or {}),
                },
            },
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "argocd-rbac-cm", "namespace": NAMESPACE, "labels": PART_OF},
                "data": {"policy.default": "role:readonly"},
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "argocd-secret", "namespace": NAMESPACE, "labels": PART_OF},
                "stringData": {
                    "admin.password": bcrypt,
                    "admin.passwordMtime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "server.secretkey": secrets.token_urlsafe(32),
                },
            },
            {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "AppProject",
                "metadata": {"name": "default", "namespace": NAMESPACE},
                "spec": {
                    "sourceRepos": ["*"],
                    "destinations": [{"server": "*", "namespace": "*"}],
                    "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
                },
            },
        ]
        for obj in objs:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(obj))

    # ---- processes ----

    def _env(self, component: str) -> dict[str, str]:
        data = self.workdir / "data"
        for d in ("tls", "ssh", "gpg", "gpg-source"):
            (data / d).mkdir(parents=True, exist_ok=True)
        return os.environ | {
            "ARGOCD_BINARY_NAME": component,
            "ARGOCD_FAKE_IN_CLUSTER": "true",
            "KUBECONFIG": str(self.kubeconfig),
            "ARGOCD_TLS_DATA_PATH": str(data / "tls"),
            "ARGOCD_SSH_DATA_PATH": str(data / "ssh"),
            "ARGOCD_GNUPGHOME": str(data / "gpg"),
            "ARGOCD_GPG_DATA_PATH": str(data / "gpg-source"),
            "ARGOCD_GPG_ENABLED": "false",
            "HOME": str(self.workdir),
            "PATH": f"{self.helm_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def start(self) -> None:
        p = self.ports
        redis = f"127.0.0.1:{p['redis']}"
        repo = f"127.0.0.1:{p['repo']}"
        self._spawn(
            "redis",
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(p["redis"]),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        )
        common = ["--loglevel", "info", "--logformat", "text", "--redis", redis]
        self._spawn(
            "repo-server",
            [str(self.binary), "--address", "127.0.0.1", "--port", str(p["repo"]), "--metrics-address",
             "127.0.0.1", "--metrics-port", str(p["repo_metrics"]), "--disable-tls", *common],
            self._env("argocd-repo-server"),
        )  # fmt: skip
        self._spawn(
            "application-controller",
            [str(self.binary), "--metrics-port", str(p["ctl_metrics"]), "--repo-server", repo,
             "--repo-server-plaintext", "--app-resync", "30", *common],
            self._env("argocd-application-controller"),
        )  # fmt: skip
        self._spawn(
            "server",
            [str(self.binary), "--insecure", "--address", "127.0.0.1", "--port", str(p["server"]),
             "--metrics-address", "127.0.0.1", "--metrics-port", str(p["server_metrics"]),
             "--repo-server", repo, "--repo-server-plaintext", "--dex-server", "", *common],
            self._env("argocd-server"),
        )  # fmt: skip
        wait_until(self._listening, 120, 0.5, "Argo CD's components to listen")
        self.run_cli(
            "login", f"127.0.0.1:{p['server']}", "--plaintext", "--username", "admin",
            "--password", self.password, login=False,
        )  # fmt: skip

    def _listening(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"argocd {name} exited {proc.returncode}: {self.log(name)[-3000:]}")
        for k in ("redis", "repo", "server", "ctl_metrics"):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.ports[k])) != 0:
                    return False
        return True

    def log(self, name: str) -> str:
        p = self.workdir / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def run_cli(self, *args: str, login: bool = True, check: bool = True) -> str:
        """The `argocd` CLI against this API server (after start(): logged in as admin)."""
        argv = [str(self.binary), "--config", str(self.cli_config), *args]
        env = self._env("argocd")
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        if check and r.returncode != 0:
            raise RuntimeError(f"argocd {' '.join(args)}: {(r.stderr or r.stdout).strip()}")
        return r.stdout if r.returncode == 0 else r.stderr + r.stdout

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    # ---- Applications ----

    def application(self, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "applications.argoproj.io", name, "-o", "json").stdout)

    def refresh(self, name: str) -> None:
        """What a git webhook does on push: ask the controller to compare against git now."""
        self.kubectl(
            "annotate", "--overwrite", "applications.argoproj.io", name, "argocd.argoproj.io/refresh=normal"
        )
