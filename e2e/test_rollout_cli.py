"""`modeldeploy rollout` against a real kube-apiserver (the local cluster, or $KUBECONFIG); skipped without one.

Proves the commands change metadata only (generation stays: spec untouched), pick the newest
history entry from a real status subresource, and name the problem on bad input.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from modeldeploy.cli import main as cli_main
from modeldeploy.operator.api import (
    GROUP,
    PLURAL,
    VERSION,
    CohortStatus,
    HistoryEntry,
    ModelDeploymentStatus,
)
from modeldeploy.operator.rollout_cli import ABORT, PROMOTE, ROLLBACK_TO

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


def _kubeconfig() -> str | None:
    kc = os.environ.get("KUBECONFIG") or str(Path.home() / ".cache/modeldeploy/run/modeldeploy/kubeconfig")
    if not Path(kc).is_file():
        return None
    try:
        api = config.new_client_from_config(config_file=kc)
        client.VersionApi(api).get_code(_request_timeout=3)
        client.ApiextensionsV1Api(api).read_custom_resource_definition(f"{PLURAL}.{GROUP}", _request_timeout=3)
    except Exception:  # noqa: BLE001 - any failure means "no usable cluster here": skip, said below
        return None
    return kc


@pytest.fixture(scope="module")
def cluster():
    kc = _kubeconfig()
    if kc is None:
        pytest.skip("no reachable kube-apiserver with the ModelDeployment CRD (`modeldeploy cluster up` or $KUBECONFIG)")
    api = config.new_client_from_config(config_file=kc)
    ns = f"rollout-cli-{secrets.token_hex(3)}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    try:
        yield kc, ns, client.CustomObjectsApi(api)
    finally:
        client.CoreV1Api(api).delete_namespace(ns)


HISTORY = [HistoryEntry(bundle="aaaaaaaaaaaaaaaa", revision="r1", replaced_at="2026-01-02T00:00:00Z"),
           HistoryEntry(bundle="bbbbbbbbbbbbbbbb", revision="r2", replaced_at="2026-01-03T00:00:00Z")]


def test_commands_annotate_only_and_rollback_uses_history(cluster, capsys) -> None:
    kc, ns, custom = cluster
    md = yaml.safe_load((ROOT / "examples/modeldeployment-tiny.yaml").read_text())
    md["metadata"] = {"name": "chat", "namespace": ns}
    created = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, md)
    st = ModelDeploymentStatus(phase="Canary", observed_generation=created["metadata"]["generation"],
                               canary_weight=10, current_step=0, history=HISTORY,
                               stable=CohortStatus(bundle="cccccccccccccccc", replicas=1, ready_replicas=1))
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, "chat", {"status": st.model_dump(mode="json", by_alias=True, exclude_none=True)},
        _content_type="application/merge-patch+json")
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
    assert now["metadata"]["generation"] == created["metadata"]["generation"]     # spec never written
    assert now["spec"] == created["spec"]

    assert cli_main(["rollout", "rollback", "chat", "--to", "aaaaaaaaaaaaaaaa", *base]) == 0
    assert get()["metadata"]["annotations"][ROLLBACK_TO] == "aaaaaaaaaaaaaaaa"
    capsys.readouterr()
    assert cli_main(["rollout", "rollback", "chat", "--to", "ffff", *base]) == 1
    err = capsys.readouterr().err
    assert "--to ffff: not in status.history" in err and "aaaaaaaaaaaaaaaa (r1), bbbbbbbbbbbbbbbb (r2)" in err
    assert get()["metadata"]["annotations"][ROLLBACK_TO] == "aaaaaaaaaaaaaaaa"    # nothing written

    assert cli_main(["rollout", "status", "chat", *base]) == 0
    out = capsys.readouterr().out
    for want in ("Canary", "cccccccccccccccc", "10%", "bbbbbbbbbbbbbbbb", "modeldeploy.dev/rollback-to=aaaaaaaa"):
        assert want in out, want


def test_unknown_model_deployment_is_a_clear_error(cluster, capsys) -> None:
    kc, ns, _ = cluster
    assert cli_main(["rollout", "status", "nope", "--kubeconfig", kc, "-n", ns]) == 1
    assert f"ModelDeployment {ns}/nope not found" in capsys.readouterr().err

