"""Upstream CRDs read from their Go modules at the versions pinned in cluster/versions.env.

The Go module proxy is the one source this project downloads from (no GitHub releases), so a
CRD a test needs comes from the module that publishes it: `go mod download -json` puts the
module in a module cache of the tests' own (`GOMODCACHE`, under the project's cache, read-only) and
names its directory. Not Go's default cache: `.ci/run` drops that one (~/go/pkg/mod) once the Go
builds are done, while the tests run, and a cold run failed when the drop met a test's download
there ("unlinkat ~/go/pkg/mod/github.com: directory not empty").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from modeldeploy_dev.cluster.local import cache_root, pinned_versions

PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator"
KEDA = "github.com/kedacore/keda/v2"
MONITORING_KINDS = {
    "PodMonitor": "podmonitors",
    "ServiceMonitor": "servicemonitors",
    "PrometheusRule": "prometheusrules",
}


def go() -> str | None:
    found = shutil.which("go") or "/usr/local/go/bin/go"
    return found if Path(found).exists() else None


def module_cache() -> Path:
    """The tests' Go module cache (see the module docstring)."""
    return cache_root() / "go-mod-upstream"


def module_dir(module: str, version: str) -> Path:
    """The unpacked module (downloaded through the Go module proxy when not cached)."""
    exe = go()
    if exe is None:
        raise FileNotFoundError("Go is needed to fetch pinned upstream modules (see .ci/run)")
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(
            [exe, "mod", "download", "-json", f"{module}@{version}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "GOFLAGS": "-mod=mod", "GOMODCACHE": str(module_cache())},
        )
    info = json.loads(r.stdout or "{}")
    if r.returncode != 0 or "Dir" not in info:
        raise RuntimeError(f"go mod download {module}@{version}: {info.get('Error') or r.stderr}")
    return Path(info["Dir"])


def monitoring_crd_files() -> dict[str, Path]:
    """kind -> CRD file of prometheus-operator at PROMETHEUS_OPERATOR_VERSION."""
    root = module_dir(PROMETHEUS_OPERATOR, pinned_versions()["PROMETHEUS_OPERATOR_VERSION"])
    base = root / "example" / "prometheus-operator-crd"
    return {kind: base / f"monitoring.coreos.com_{plural}.yaml" for kind, plural in MONITORING_KINDS.items()}


def monitoring_crds() -> dict[str, dict[str, Any]]:
    return {kind: yaml.safe_load(p.read_text()) for kind, p in monitoring_crd_files().items()}


def keda_scaledobject_crd_file() -> Path:
    """KEDA's ScaledObject CRD at KEDA_VERSION."""
    root = module_dir(KEDA, pinned_versions()["KEDA_VERSION"])
    return root / "config" / "crd" / "bases" / "keda.sh_scaledobjects.yaml"
