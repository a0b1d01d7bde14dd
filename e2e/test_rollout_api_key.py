# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""A ModelDeployment whose pods require an API key, rolled out through the operator's gates.

The key is in a Secret (bundle.config.apiKeySecretRef) that the operator never reads: the pod gets it
through env `secretKeyRef`, resolved on the node. The conformance and quality gates ask the keyed
canary and stable pods with the operator's own token for this object (operator/controller/gatekey.py);
the pods hold only its sha256. The operator's lack of Secret access is the chart e2e's
(e2e/test_operator_chart.py, `kubectl auth can-i` as its ServiceAccount).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx

from modeldeploy.operator.controller.gatekey import GateKey
from modeldeploy_dev.load import Load
from modeldeploy_dev.rollout_scenario import ANALYSIS

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    Operator,
    crd_installed,
    get_md,
    operator,
)
from .test_rollout import change_bundle, events, pod_ips, serve_tiny, wait_md

QUALITY = {
    "evalSet": {"inline": [{"prompt": "The capital of France is", "maxTokens": 8, "contains": "Paris"}]}
}


def test_keyed_canary_passes_both_gates_on_the_operators_token_and_the_load_keeps_its_key(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    key = secrets.token_urlsafe(24)
    cluster.core.create_namespaced_secret(
        namespace, {"metadata": {"name": "chat-key"}, "stringData": {"token": key}}
    )
    ref = {"name": "chat-key", "key": "token"}
    md, old = serve_tiny(
        cluster,
        namespace,
        tmp_path,
        "keyed",
        config={"apiKeySecretRef": ref},
        analysis=ANALYSIS | {"quality": QUALITY},
    )
    meta = md["metadata"]
    token = GateKey(operator.gate_key.encode()).token(namespace, "keyed", meta["uid"])
    digest = GateKey(operator.gate_key.encode()).digest(namespace, "keyed", meta["uid"])

    # the pod spec holds the Secret's reference and the token's digest, neither secret itself
    (pod,) = cluster.core.list_namespaced_pod(namespace, label_selector=f"modeldeploy.dev/bundle={old}").items
    env = {e.name: e for e in pod.spec.containers[0].env}
    assert env["MODELDEPLOY_API_KEY"].value is None
    assert env["MODELDEPLOY_API_KEY"].value_from.secret_key_ref.name == "chat-key"
    assert env["MODELDEPLOY_GATE_KEY_SHA256"].value == digest
    assert key not in str(pod.spec) and token not in str(pod.spec)

    # the stable pod: closed without the key; the key and the operator's token open it, the digest does not
    (ip,) = pod_ips(cluster, namespace, old)
    url = f"http://{ip}:8000/v1/models"
    assert httpx.get(f"http://{ip}:8000/metrics", timeout=10).status_code == 200  # scraped without a key
    for bearer, status in ((None, 401), (key, 200), (token, 200), (digest, 401)):
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        assert httpx.get(url, headers=headers, timeout=10).status_code == status, bearer

    with Load(cluster.api, namespace, "keyed", api_key=key) as load:
        t0 = time.monotonic()
        change_bundle(cluster, namespace, "keyed", lambda b: b["config"].update(maxNumSeqs=6))
        done = wait_md(
            cluster,
            namespace,
            "keyed",
            lambda m: (
                (m.get("status") or {}).get("phase") == "Degraded"
                or bool((m.get("status") or {}).get("failedBundles"))
                or ((m.get("status") or {}).get("stable") or {}).get("bundle") not in (None, old)
            ),
            300,
            "keyed canary promoted or rolled back",
        )
        print(f"[timing] keyed bundle change -> {done['status']['phase']}: {time.monotonic() - t0:.1f}s")
    st = done["status"]
    reasons = [r for r, _ in events(cluster, namespace, "keyed")]
    assert st["phase"] == "Stable" and st["stable"]["bundle"] != old, (st, reasons)
    for r in ("ConformancePassed", "QualityPassed", "Promoted"):
        assert r in reasons, reasons
    assert st["lastQuality"]["verdict"] == "Pass", st["lastQuality"]
    assert st["lastAnalysis"]["verdict"] == "Pass"
    seen = load.by_ip()
    assert not {i: c for i, c in seen.items() if set(c) - {200}}, (seen, load.transport_errors)
    assert sum(sum(c.values()) for c in seen.values()) > 20
    new = get_md(cluster, namespace, "keyed")["status"]["stable"]["bundle"]
    (pod,) = cluster.core.list_namespaced_pod(namespace, label_selector=f"modeldeploy.dev/bundle={new}").items
    assert {e.name: e.value for e in pod.spec.containers[0].env}["MODELDEPLOY_GATE_KEY_SHA256"] == digest
