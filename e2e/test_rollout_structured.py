# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""The structured-output gate on the local cluster: a bundle that declares
`config.structuredOutput: true` is canaried through the conformance gate with its
`structured_output` check (constrained requests really reach the canary pod) and promoted; then an
engine image whose constrained decoding is broken (it serves response_format unconstrained; the
process node maps that image to the runtime's test hook) is held at Verifying and rolled back, the
check named in the reason, before it gets any traffic weight.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from modeldeploy_dev.load import Load

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    Operator,
    condition,
    crd_installed,
    get_md,
    operator,
)
from .test_rollout import change_bundle, events, pod_ips, rolled_back, serve_tiny, wait_md, wait_phase

BROKEN_IMAGE = "registry.local/modeldeploy-runtime-ignores-response-format@sha256:" + "6" * 64


def _grammar_compiles(ip: str) -> float:
    text = httpx.get(f"http://{ip}:8000/metrics", timeout=10).text
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("modeldeploy_grammar_compile_seconds_count")
    )


def _past_gate(md: dict, old: str) -> dict | None:
    """The object once a bundle other than `old` is canaried after its gate, or already promoted."""
    st = md.get("status", {})
    canary = (st.get("canary") or {}).get("bundle")
    if st.get("stable", {}).get("bundle") not in (None, old):
        return md
    if canary not in (None, old) and st.get("phase") in ("Canary", "Promoting", "RollingBack"):
        return md
    return None


def test_structured_bundle_passes_the_gate_and_a_broken_engine_is_rolled_back(
    cluster: E2ECluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    ns, name = namespace, "so"
    _, old = serve_tiny(cluster, ns, tmp_path, name)

    with Load(cluster.api, ns, name) as load:  # the canary step's analysis needs samples
        change_bundle(cluster, ns, name, lambda b: b["config"].update(structuredOutput=True))
        md = cluster.wait(
            lambda: _past_gate(get_md(cluster, ns, name), old), 300, "the new bundle past its gate"
        )
        st = md["status"]
        good = (st.get("canary") or {}).get("bundle") or st["stable"]["bundle"]
        assert good != old and not st.get("failedBundles"), st
        passed = [m for r, m in events(cluster, ns, name) if r == "ConformancePassed"]
        assert passed, events(cluster, ns, name)
        # the gate's structured_output check sent constrained requests to the canary: grammars compiled
        ips = pod_ips(cluster, ns, good)
        assert ips and sum(_grammar_compiles(ip) for ip in ips) >= 1
        md = wait_md(
            cluster,
            ns,
            name,
            lambda m: m["status"].get("stable", {}).get("bundle") == good,
            300,
            "the structured-output bundle promoted",
        )
        assert md["status"]["phase"] == "Stable" and not md["status"].get("failedBundles"), md["status"]

        change_bundle(cluster, ns, name, lambda b: b["engine"].update(image=BROKEN_IMAGE))
        md = wait_phase(cluster, ns, name, ("Verifying", "RollingBack"), 240)
        broken = md["status"]["canary"]["bundle"]
        broken_ips = pod_ips(cluster, ns, broken)
        done = wait_md(cluster, ns, name, rolled_back, 300, "broken structured output rolled back")
    st = done["status"]
    assert st["stable"]["bundle"] == good and st["failedBundles"] == [broken], st
    assert st.get("canaryWeight", 0) == 0, st
    deg = condition(done, "Degraded")
    assert deg["status"] == "True" and deg["reason"] == "ConformanceFailed", deg
    assert "structured_output" in deg["message"], deg
    failed = [m for r, m in events(cluster, ns, name) if r == "ConformanceFailed" or r == "RolledBack"]
    assert any("structured_output" in m for m in failed), failed
    seen = load.by_ip()
    assert broken_ips and not broken_ips & set(seen), ("the broken bundle got traffic before its gate", seen)
    assert sum(seen.get(ip, {}).get(200, 0) for ip in ips) > 0, seen  # the good canary served traffic
