# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""`modeldeploy rollout` against a real kube-apiserver (the e2e session's cluster), with a status
written through the status subresource and no operator running.

Proves the commands change metadata only (generation stays: spec untouched), pick the newest
history entry from a real status subresource, and name the problem on bad input.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from modeldeploy.cli import main as cli_main
from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, PLURAL, VERSION
from modeldeploy.operator.api.v1alpha1.status import CohortStatus, HistoryEntry, ModelDeploymentStatus
from modeldeploy.operator.rollout.commands import ABORT, PROMOTE, ROLLBACK_TO

from .conftest import E2ECluster
from .test_operator import crd_installed  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]

HISTORY = [
    HistoryEntry(bundle="aaaaaaaaaaaaaaaa", revision="r1", replaced_at="2026-01-02T00:00:00Z"),
    HistoryEntry(bundle="bbbbbbbbbbbbbbbb", revision="r2", replaced_at="2026-01-03T00:00:00Z"),
]


def test_commands_annotate_only_and_rollback_uses_history(
    cluster: E2ECluster, namespace: str, crd_installed: None, capsys: pytest.CaptureFixture[str]
) -> None:
    kc, ns, custom = cluster.kubeconfig, namespace, cluster.custom
    md = yaml.safe_load((ROOT / "examples/modeldeployment-tiny.yaml").read_text())
    md["metadata"] = {"name": "chat", "namespace": ns}
    created = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, md)
    st = ModelDeploymentStatus(
        phase="Canary",
        observed_generation=created["metadata"]["generation"],
        canary_weight=10,
        current_step=0,
        history=HISTORY,
        stable=CohortStatus(bundle="cccccccccccccccc", replicas=1, ready_replicas=1),
    )
    custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        "chat",
        {"status": st.model_dump(mode="json", by_alias=True, exclude_none=True)},
        _content_type="application/merge-patch+json",
    )
    base = ["--kubeconfig", kc, "-n", ns]

    def get() -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat")

    assert cli_main(["rollout", "promote", "chat", *base]) == 0
    assert cli_main(["rollout", "abort", "chat", *base]) == 0
    assert cli_main(["rollout", "rollback", "chat", *base]) == 0
    out = capsys.readouterr().out
    assert "newest history entry bbbbbbbbbbbbbbbb" in out and f"annotated {ns}/chat" in out
    now = get()
    ann = now["metadata"]["annotations"]
    assert ann[ROLLBACK_TO] == "bbbbbbbbbbbbbbbb" and ann[PROMOTE] and ann[ABORT]
    assert now["metadata"]["generation"] == created["metadata"]["generation"]  # spec never written
    assert now["spec"] == created["spec"]

    assert cli_main(["rollout", "rollback", "chat", "--to", "aaaaaaaaaaaaaaaa", *base]) == 0
    assert get()["metadata"]["annotations"][ROLLBACK_TO] == "aaaaaaaaaaaaaaaa"
    capsys.readouterr()
    assert cli_main(["rollout", "rollback", "chat", "--to", "ffff", *base]) == 1
    err = capsys.readouterr().err
    assert "--to ffff: not in status.history" in err and "aaaaaaaaaaaaaaaa (r1), bbbbbbbbbbbbbbbb (r2)" in err
    assert get()["metadata"]["annotations"][ROLLBACK_TO] == "aaaaaaaaaaaaaaaa"  # nothing written

    assert cli_main(["rollout", "status", "chat", *base]) == 0
    out = capsys.readouterr().out
    for want in (
        "Canary",
        "cccccccccccccccc",
        "10%",
        "bbbbbbbbbbbbbbbb",
        "modeldeploy.dev/rollback-to=aaaaaaaa",
    ):
        assert want in out, want


def test_unknown_model_deployment_is_a_clear_error(
    cluster: E2ECluster, namespace: str, crd_installed: None, capsys: pytest.CaptureFixture[str]
) -> None:
    kc, ns = cluster.kubeconfig, namespace
    assert cli_main(["rollout", "status", "nope", "--kubeconfig", kc, "-n", ns]) == 1
    assert f"ModelDeployment {ns}/nope not found" in capsys.readouterr().err
