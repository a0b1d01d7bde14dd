"""The operator's Helm chart installs into the real API server with least privilege."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from .conftest import E2ECluster

CHART = Path(__file__).resolve().parents[1] / "charts" / "modeldeploy-operator"
REVIEWED = Path(__file__).resolve().parents[1] / "tests" / "data" / "operator_permissions.txt"
# what every authenticated user is granted (system:basic-user): asking about oneself is not a permission
# of the operator's; the non-resource URLs (discovery, /healthz, /version, the issuer's keys) come from
# system:discovery, system:public-info-viewer and system:service-account-issuer-discovery, to everyone
EVERYONE = frozenset({
    "selfsubjectreviews.authentication.k8s.io",
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
})  # fmt: skip
_ROW = re.compile(r"^(\S*)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$")


def reviewed_permissions() -> list[str]:
    """tests/data/operator_permissions.txt: `verb resource.group[/subresource]`, sorted."""
    return [ln for ln in REVIEWED.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def effective_permissions(table: str) -> list[str]:
    """`kubectl auth can-i --list --no-headers` as sorted `verb resource` lines, without the rows every
    user has (EVERYONE, non-resource URLs). A rule limited to resource names is refused, not ignored:
    the reviewed list has no form for it, so it must be reviewed on its own."""
    out: set[str] = set()
    for line in table.splitlines():
        if not line.strip():
            continue
        m = _ROW.match(line)
        assert m is not None, f"unexpected `kubectl auth can-i --list` row: {line!r}"
        resource, urls, names, verbs = m.groups()
        if not resource and urls:
            continue
        if resource in EVERYONE:
            continue
        assert not names, f"a rule limited to resource names: {line!r}"
        out.update(f"{verb} {resource}" for verb in verbs.split())
    return sorted(out)


def test_helm_lint_template_install_and_no_secret_access(cluster: E2ECluster, namespace: str) -> None:
    lint = cluster.helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in lint.stdout
    release = f"mdop-{namespace[-6:]}"
    rendered = cluster.helm(
        "template", release, str(CHART), "-n", namespace, "--kube-version", "1.36.3"
    ).stdout
    # the chart's CRDs first (as helm does), then the rendered manifests must pass the real API server
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    cluster.wait_established("clusterkopfpeerings.kopf.dev")
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
        # the whole effective list, as the API server answers it, is the reviewed one: in the release's
        # namespace and in another (the chart grants one ClusterRole, so both views are the same)
        for ns in (namespace, "default"):
            listed = cluster.kubectl("auth", "can-i", "--list", "--no-headers", f"--as={sa}", "-n", ns).stdout
            assert effective_permissions(listed) == reviewed_permissions(), (
                f"the operator's effective permissions in {ns} differ from {REVIEWED}: review the change"
            )
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
        # the gate key: a Secret the chart made, handed to the operator by the kubelet (secretKeyRef),
        # the same across `helm upgrade` (lookup), or keyed pods would roll on every upgrade
        secret = f"{release}-modeldeploy-operator-gate-key"
        env = {e.name: e for e in pods[0].spec.containers[0].env}
        assert env["MODELDEPLOY_GATE_KEY"].value_from.secret_key_ref.name == secret
        first = cluster.core.read_namespaced_secret(secret, namespace).data["gate-key"]
        assert len(base64.b64decode(first)) == 48
        cluster.helm("upgrade", release, str(CHART), "-n", namespace, "--wait=false")
        assert cluster.core.read_namespaced_secret(secret, namespace).data["gate-key"] == first
        crds = cluster.kubectl("get", "crd", "-o", "name").stdout
        assert "modeldeployments.serving.modeldeploy.dev" in crds and "clusterkopfpeerings.kopf.dev" in crds
    finally:
        cluster.helm("uninstall", release, "-n", namespace, check=False)


def test_monitoring_objects_pass_the_real_prometheus_operator_crds(
    cluster: E2ECluster, namespace: str
) -> None:
    """With monitoring.* on, the API server (holding the pinned prometheus-operator CRDs,
    schema and all) accepts every rendered object under strict field validation (unknown or
    misspelt fields are errors, not pruned)."""
    from modeldeploy_dev.upstream_crds import MONITORING_KINDS, go, monitoring_crd_files

    if go() is None:
        pytest.skip("Go is needed to read the pinned prometheus-operator CRDs (see .ci/run)")
    files = [a for p in monitoring_crd_files().values() for a in ("-f", str(p))]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", *files)
    names = [f"crd/{plural}.monitoring.coreos.com" for plural in MONITORING_KINDS.values()]
    cluster.wait_established(*names)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    sets = [
        "monitoring.podMonitor.enabled=true",
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.dashboard.enabled=true",
    ]
    args = [a for s in sets for a in ("--set", s)]
    rendered = cluster.helm(
        "template", f"mdmon-{namespace[-6:]}", str(CHART), "-n", namespace, "--kube-version", "1.36.3", *args
    ).stdout
    for kind in MONITORING_KINDS:
        assert f"kind: {kind}\n" in rendered, kind
    out = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-", input=rendered
    ).stdout
    for kind in ("podmonitor", "servicemonitor", "prometheusrule"):
        assert f"{kind}.monitoring.coreos.com/" in out, out
    # the negative control: the same API server refuses a misspelt field
    bad = rendered.replace("podMetricsEndpoints:", "podMetricEndpoints:")
    r = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-", input=bad, check=False
    )
    assert r.returncode != 0 and "podMetricEndpoints" in r.stderr, r.stdout + r.stderr
