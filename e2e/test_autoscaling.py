# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""examples/autoscaling against the real API server (issue 18, item 4): the HPA and, with KEDA's CRD from its
pinned module installed, the ScaledObject pass server-side validation with unknown fields refused.

tests/test_autoscaling_examples.py checks what they aim at. The scale subresource both autoscalers write
is exercised by e2e/test_rollout_capacity.py's `kubectl scale` test; this file does not run an
autoscaler (no prometheus-adapter or KEDA in the local cluster).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import E2ECluster
from .test_operator import crd_installed  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples" / "autoscaling"


def dry_run(cluster: E2ECluster, ns: str, path: Path) -> str:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for d in docs:
        d["metadata"]["namespace"] = ns
    r = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", ns, "-f", "-",
        input=yaml.safe_dump_all(docs), check=False,
    )  # fmt: skip
    assert r.returncode == 0, f"{path.name}: {r.stdout}\n{r.stderr}"
    return r.stdout


def test_hpa_example_passes_the_api_server(cluster: E2ECluster, namespace: str, crd_installed: None) -> None:
    out = dry_run(cluster, namespace, EX / "hpa-requests-waiting.yaml")
    assert "horizontalpodautoscaler.autoscaling/tiny created (server dry run)" in out, out


def test_keda_scaled_object_example_passes_the_api_server_with_kedas_crd(
    cluster: E2ECluster, namespace: str, crd_installed: None
) -> None:
    upstream = pytest.importorskip("modeldeploy_dev.upstream_crds")
    if upstream.go() is None:
        pytest.skip("Go is needed to read the pinned KEDA CRDs (see .ci/run)")
    crd = upstream.keda_scaledobject_crd_file()
    name = yaml.safe_load(crd.read_text())["metadata"]["name"]
    cluster.kubectl("apply", "--server-side", "-f", str(crd))
    try:
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
        out = dry_run(cluster, namespace, EX / "keda-scaledobject.yaml")
        assert "scaledobject.keda.sh/tiny created (server dry run)" in out, out
        # the check can fail: the API server refuses a misspelt field
        bad = yaml.safe_load((EX / "keda-scaledobject.yaml").read_text())
        bad["metadata"]["namespace"] = namespace
        bad["spec"]["maxReplicas"] = bad["spec"].pop("maxReplicaCount")
        r = cluster.kubectl(
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
            input=yaml.safe_dump(bad),
            check=False,
        )
        assert r.returncode != 0 and "maxReplicas" in r.stderr, (r.stdout, r.stderr)
    finally:
        cluster.kubectl("delete", f"crd/{name}", "--wait=false", check=False)
