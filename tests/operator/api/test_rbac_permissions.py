"""The operator's permissions are a reviewed list: the chart grants exactly what it names.

tests/data/operator_permissions.txt is that list. A new API call the operator makes needs a rule in
api/rbac.py, `make crds`, and a line in the reviewed list; each is a visible diff. The e2e
(e2e/test_operator_chart.py) holds the API server's own answer (`kubectl auth can-i --list` as the
ServiceAccount) against the same list.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.chart import CHART, helm

from modeldeploy.operator.api.rbac import permissions, rules

REVIEWED = Path(__file__).resolve().parents[2] / "data" / "operator_permissions.txt"
# verbs and resources that would let the operator read credentials or grant itself more
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate"}
FORBIDDEN_RESOURCES = {
    "*",
    "secrets",
    "serviceaccounts",
    "roles",
    "rolebindings",
    "clusterroles",
    "clusterrolebindings",
}


def reviewed() -> list[str]:
    return [ln for ln in REVIEWED.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_reviewed_list_is_sorted_unique_and_well_formed() -> None:
    lines = reviewed()
    assert lines == sorted(set(lines)), "keep tests/data/operator_permissions.txt sorted, one line each"
    for ln in lines:
        verb, resource = ln.split(" ")  # exactly two fields
        assert verb and resource and verb not in FORBIDDEN_VERBS, ln


def test_generated_rules_are_the_reviewed_list() -> None:
    assert permissions(rules()) == reviewed(), (
        "the operator's RBAC changed: review the difference and update tests/data/operator_permissions.txt"
    )


def test_chart_rule_file_is_the_reviewed_list() -> None:
    """What the ClusterRole template includes (files/rbac-rules.yaml), not only what the code declares."""
    chart_rules = yaml.safe_load((CHART / "files" / "rbac-rules.yaml").read_text())
    assert permissions(chart_rules) == reviewed()


def test_no_secret_access_of_any_verb_and_nothing_that_grants_more() -> None:
    for ln in reviewed():
        resource = ln.split(" ")[1]
        base = resource.split("/")[0].split(".")[0]  # `secrets`, `roles.rbac...`, `serviceaccounts/token`
        assert base not in FORBIDDEN_RESOURCES, ln
    assert not any("secrets" in r["resources"] for r in rules())


def test_permissions_spelling_matches_kubectl() -> None:
    """`kubectl auth can-i --list` writes resource.group, the subresource after the group, core bare."""
    got = permissions(
        [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": ["g.io"], "resources": ["things", "things/status"], "verbs": ["patch", "get"]},
        ]
    )
    assert got == [
        "get pods",
        "get things.g.io",
        "get things.g.io/status",
        "patch things.g.io",
        "patch things.g.io/status",
    ]
    with pytest.raises(ValueError, match="resourceNames"):
        permissions([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["a"]}])


needs_helm = pytest.mark.skipif(
    helm() is None, reason="helm not built yet (`make cluster-build` builds it under ~/.cache/modeldeploy)"
)


@needs_helm
@pytest.mark.parametrize(
    "extra", [[], ["--set", "watchNamespaces={team-a,team-b}"]], ids=["cluster", "namespaces"]
)
def test_rendered_chart_binds_the_serviceaccount_to_exactly_the_reviewed_list(extra: list[str]) -> None:
    """Every RBAC object the chart renders: one ClusterRole, bound to the chart's ServiceAccount, with the
    reviewed rules; no Role, RoleBinding or second binding that could widen it out of sight."""
    r = subprocess.run(
        [
            helm(),
            "template",
            "md",
            str(CHART),
            "-n",
            "modeldeploy-system",
            "--kube-version",
            "1.36.3",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    rbac = [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io/")]
    assert sorted(d["kind"] for d in rbac) == ["ClusterRole", "ClusterRoleBinding"]
    role = next(d for d in rbac if d["kind"] == "ClusterRole")
    binding = next(d for d in rbac if d["kind"] == "ClusterRoleBinding")
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "modeldeploy-system"}
    ]
    assert permissions(role["rules"]) == reviewed()
