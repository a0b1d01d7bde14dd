# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""LoRA adapters as pinned parts of the bundle, on the process node.

A ModelDeployment serves the tiny model with two PEFT adapters (made here with `peft`, on
the same PersistentVolume as the model); chat answers under each adapter's name. Changing
adapter B's revision is a new bundle: canaried (conformance gate, which runs the adapters
check, then analysis on adapter-B traffic) and promoted. A broken adapter B (wrong digest)
never becomes ready: the runtime refuses to start, and the operator rolls back with the reason.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

from modeldeploy_dev.load import Load

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    G,
    Operator,
    P,
    V,
    condition,
    crd_installed,
    create,
    get_md,
    manifest,
    operator,
)
from .test_rollout import ANALYSIS, change_bundle, events, pod_ips, serve_tiny, stable_errors, wait_phase

MESSAGES = [{"role": "user", "content": "Which tenant are you?"}]


def make_adapters(tmp: Path) -> dict[str, dict[str, str]]:
    """tenant-a, tenant-b and tenant-b's next revision, under <tmp>/models/adapters (the PV)."""
    from modeldeploy.digest import dir_digest
    from modeldeploy.runtime.tiny_model import make_tiny_model
    from modeldeploy_dev.lora_fixtures import ADAPTERS, make_adapter

    base = make_tiny_model(tmp / "base")  # seed 0: the same weights the PV's model gets
    out = {}
    for key, name, seed in (("a", "tenant-a", 1), ("b1", "tenant-b", 2), ("b2", "tenant-b", 3)):
        d = make_adapter(base, tmp / "models" / "adapters" / key, seed, **ADAPTERS[name])
        out[key] = {
            "name": name,
            "uri": f"pvc://models/adapters/{key}",
            "revision": key,
            "digest": dir_digest(d),
        }
    return out


def chat(ip: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"http://{ip}:8000/v1/chat/completions", json=body, timeout=60)


def answers(ips: set[str]) -> dict[str, str]:
    """model -> answer, the same on every pod of the bundle."""
    out: dict[str, str] = {}
    for ip in ips:
        for model in ("tiny-llama", "tenant-a", "tenant-b"):
            r = chat(ip, model)
            assert r.status_code == 200 and r.json()["model"] == model, (ip, model, r.text)
            text = r.json()["choices"][0]["message"]["content"]
            assert out.setdefault(model, text) == text, (ip, model)
        r = chat(ip, "tenant-c")
        assert r.status_code == 404 and "'tenant-a', 'tenant-b'" in r.json()["error"]["message"]
    return out


def test_two_adapters_served_then_b_revision_canaried_then_broken_b_rolled_back(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    if cluster.process_node is None:
        pytest.skip("external $KUBECONFIG cluster: no process node")
    pins = make_adapters(tmp_path)
    # Latency ratios are loose here: this test is about an adapter change being a canaried bundle
    # change; catching a slow canary is test_rollout's. Two CPU pods on a shared 2-core machine
    # differed 3.4x (TTFT) and 18x (ITL) in p95 with identical code in the first run.
    analysis = ANALYSIS | {"maxTtftP95Ratio": 30.0, "maxInterTokenP95Ratio": 50.0}
    md, first = serve_tiny(
        cluster, namespace, tmp_path, "lora", adapters=[pins["a"], pins["b1"]], analysis=analysis
    )
    before = answers(pod_ips(cluster, namespace, first))
    assert len(set(before.values())) == 3, before  # base, A and B answer differently
    bundle = httpx.get(f"http://{next(iter(pod_ips(cluster, namespace, first)))}:8000/v1/bundle").json()
    assert [(a["name"], a["revision"], a["digest"]) for a in bundle["adapters"]] == [
        ("tenant-a", "a", pins["a"]["digest"]),
        ("tenant-b", "b1", pins["b1"]["digest"]),
    ]

    # adapter B's next revision: a new bundle, canaried on B's traffic and promoted
    def set_b(pin: dict[str, str]):
        def edit(b: dict[str, Any]) -> None:
            b["adapters"] = [pins["a"], copy.deepcopy(pin)]

        return edit

    old_ips = pod_ips(cluster, namespace, first)
    with Load(cluster.api, namespace, "lora", model="tenant-b") as load:
        change_bundle(cluster, namespace, "lora", set_b(pins["b2"]))
        canary = wait_phase(cluster, namespace, "lora", ("Canary",), 240)
        assert canary["status"]["canary"]["bundle"] != first
        done = wait_phase(cluster, namespace, "lora", ("Stable", "Degraded"), 300)
    st = done["status"]
    assert st["phase"] == "Stable" and st["stable"]["bundle"] != first, (
        st,
        events(cluster, namespace, "lora"),
    )
    second = st["stable"]["bundle"]
    reasons = [r for r, _ in events(cluster, namespace, "lora")]
    for r in ("NewBundle", "CanaryReady", "ConformancePassed", "Promoted"):
        assert r in reasons, reasons
    assert not stable_errors(load, old_ips), (load.by_ip(), load.transport_errors)
    after = answers(pod_ips(cluster, namespace, second))
    assert after["tiny-llama"] == before["tiny-llama"] and after["tenant-a"] == before["tenant-a"]
    assert after["tenant-b"] != before["tenant-b"]  # the new revision is what answers now

    # a broken adapter B (its digest does not match its files): never ready, rolled back with the reason
    change_bundle(
        cluster, namespace, "lora", set_b(pins["b2"] | {"revision": "b3", "digest": "sha256:" + "0" * 64})
    )
    done = cluster.wait(
        lambda: (lambda m: m if m["status"].get("failedBundles") else None)(
            get_md(cluster, namespace, "lora")
        ),
        240,
        "broken adapter bundle rolled back",
    )
    deg = condition(done, "Degraded")
    assert done["status"]["stable"]["bundle"] == second and deg["status"] == "True", done["status"]
    assert deg["reason"] in ("CanaryFailed", "LoadTimeout"), deg
    assert "digest" in deg["message"].lower() and "adapters/b2" in deg["message"], deg
    assert condition(done, "Ready")["status"] == "True"  # the stable bundle kept serving
    assert answers(pod_ips(cluster, namespace, second)) == after


PIN = {"name": "tenant-a", "uri": "pvc://models/adapters/a", "revision": "a", "digest": "sha256:" + "c" * 64}


@pytest.mark.parametrize(
    ("adapters", "message"),
    [
        ([PIN, dict(PIN)], "every adapter name must be unique"),
        ([PIN | {"name": "Tenant_A"}], "must be a DNS label"),
        ([{k: v for k, v in PIN.items() if k != "digest"}], "digest: Required value"),
        ([PIN | {"digest": "sha256:00"}], "64 lowercase hex"),
        ([PIN | {"name": f"t{i}"} for i in range(17)], "must have at most 16 items"),
        ([PIN | {"name": "model"}], "must differ from the served model name"),
    ],
    ids=["duplicate-names", "not-dns", "no-digest", "bad-digest", "too-many", "served-model-name"],
)
def test_api_server_rejects_invalid_adapters_with_cel_message(
    cluster: E2ECluster, namespace: str, crd_installed: None, adapters, message: str
) -> None:
    obj = manifest("bad")
    obj["spec"]["bundle"]["adapters"] = adapters
    with pytest.raises(ApiException) as e:
        create(cluster, namespace, obj)
    assert e.value.status == 422 and message in e.value.body, e.value.body
    ok = manifest("good")
    ok["spec"]["bundle"]["adapters"] = [PIN, PIN | {"name": "tenant-b"}]
    cluster.custom.create_namespaced_custom_object(G, V, namespace, P, ok, dry_run="All")
