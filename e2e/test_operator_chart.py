"""The operator's Helm chart installs into the real API server with least privilege (issue 6)."""

from __future__ import annotations

from pathlib import Path

from .conftest import E2ECluster

CHART = Path(__file__).resolve().parents[1] / "charts" / "modeldeploy-operator"


def test_helm_lint_template_install_and_no_secret_access(cluster: E2ECluster, namespace: str) -> None:
    lint = cluster.helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in lint.stdout
    release = f"mdop-{namespace[-6:]}"
    rendered = cluster.helm(
        "template", release, str(CHART), "-n", namespace, "--kube-version", "1.36.3"
    ).stdout
    # the chart's CRDs first (as helm does), then the rendered manifests must pass the real API server
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=60s"
    )
    cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=rendered)
    cluster.helm("install", release, str(CHART), "-n", namespace, "--wait=false")
    try:
        sa = f"system:serviceaccount:{namespace}:{release}-modeldeploy-operator"
        can = lambda *a: cluster.kubectl("auth", "can-i", *a, f"--as={sa}", check=False).stdout.strip()  # noqa: E731
        assert can("get", "secrets", "-A") == "no"
        assert can("list", "secrets", "-n", namespace) == "no"
        assert can("delete", "nodes") == "no"
        # positive controls: what the operator needs, it has
        assert can("create", "deployments.apps", "-n", "default") == "yes"
        assert can("patch", "modeldeployments.serving.modeldeploy.dev/status", "-n", "default") == "yes"
        assert can("list", "nodes") == "yes"
        # the operator pod is admitted under Pod Security `restricted` (the ReplicaSet created it)
        pods = cluster.wait(
            lambda: (
                cluster.core.list_namespaced_pod(
                    namespace, label_selector="app.kubernetes.io/name=modeldeploy-operator"
                ).items
            ),
            60,
            "operator pod created",
        )
        assert pods[0].spec.security_context.run_as_non_root is True
        crds = cluster.kubectl("get", "crd", "-o", "name").stdout
        assert "modeldeployments.serving.modeldeploy.dev" in crds and "clusterkopfpeerings.kopf.dev" in crds
    finally:
        cluster.helm("uninstall", release, "-n", namespace, check=False)
