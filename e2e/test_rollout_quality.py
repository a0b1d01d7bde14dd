# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""The quality gate on the local cluster, on the real model (issue 36).

Stable serves SmolLM2-135M-Instruct on the process node. A canary whose weights are re-quantized to
3 bits (round-to-nearest per group of 32, written by modeldeploy_dev.model_variants: a new model
digest, pinned like any revision) is neither slower nor failing, only worse: the gate, after
conformance and before any traffic weight, rolls it back with reason QualityFailed, and the figures
and thresholds show in status.lastQuality, an Event and `modeldeploy rollout status`. Then a
harmless bundle (the same weights, another maxNumSeqs) passes the same gate and is promoted.

The evaluation set is 8 items of the built-in set, inline and pinned by digest (the system-turn
facts and the ~1.1k-token recall item among them), so each gate takes seconds, not a minute.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from modeldeploy.cli import main as cli_main
from modeldeploy.digest import dir_digest
from modeldeploy.operator.analysis.quality_set import DEFAULT_ITEMS
from modeldeploy.operator.api.v1alpha1.quality import EvalItem, eval_set_digest
from modeldeploy_dev import model_variants
from modeldeploy_dev.demo import EVAL_PICK
from modeldeploy_dev.load import Load
from modeldeploy_dev.real_model import MODEL_DIGEST, REVISION, cache_root, cached_real_model
from modeldeploy_dev.rollout_scenario import stable_and_ready

from .conftest import E2ECluster
from .test_operator import (  # noqa: F401  (fixtures)
    Operator,
    condition,
    crd_installed,
    create,
    get_md,
    manifest,
    operator,
)
from .test_rollout import ANALYSIS, change_bundle, events, pod_ips, rolled_back, wait_md, wait_phase

SERVED = "smollm2"
# The built-in items this test asks: the demo's pick (QA, arithmetic, JSON, two system-turn facts,
# the ~1.1k-token recall), so the e2e and the demo judge bundles on the same pinned set.
PICK = EVAL_PICK


def eval_items() -> list[EvalItem]:
    def key(i: EvalItem) -> str:
        return i.prompt if i.prompt is not None else (i.messages or [])[0].content

    items = [i for p in PICK for i in DEFAULT_ITEMS if key(i).startswith(p)]
    assert len(items) == len(PICK), [key(i) for i in items]
    return items


def models_volume(cluster: E2ECluster, ns: str, tmp: Path) -> tuple[str, str]:
    """PV+PVC `models` holding `real` (the imported model) and `rtn3` (its 3-bit re-quantization,
    made once per machine next to the model cache); returns (real digest, rtn3 digest)."""
    real = cached_real_model()
    assert dir_digest(real) == MODEL_DIGEST
    rtn3 = cache_root() / "test-models" / "smollm2-rtn3-g32"
    if not (rtn3 / "model.safetensors").exists():
        part = rtn3.with_name(f".{rtn3.name}-{os.getpid()}")
        model_variants.requantize(real, part, bits=3, group=32)
        part.rename(rtn3)
    vol = tmp / "models"
    vol.mkdir()
    (vol / "real").symlink_to(real, target_is_directory=True)
    (vol / "rtn3").symlink_to(rtn3, target_is_directory=True)
    pv = f"{ns}-models"
    cluster.core.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "2Gi"},
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(vol), "type": "Directory"},
                "claimRef": {"namespace": ns, "name": "models"},
            },
        }
    )
    cluster.core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": "models"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "2Gi"}},
            },
        },
    )
    return MODEL_DIGEST, dir_digest(rtn3)


def serve_real(cluster: E2ECluster, ns: str, name: str, digest: str) -> str:
    items = eval_items()
    spec = manifest(name)["spec"]
    spec["bundle"]["model"] = {"uri": "pvc://models/real", "revision": REVISION, "digest": digest}
    spec["bundle"]["tokenizer"] = {"revision": REVISION, "digest": digest}
    spec["bundle"]["config"] = {
        "maxNumSeqs": 8,
        "maxQueue": 64,
        "maxModelLen": 2048,  # the recall item is ~1.1k tokens
        "device": "cpu",
        "dtype": "float32",
        "servedModelName": SERVED,
    }
    spec["topology"]["nodeSelector"] = {"modeldeploy.dev/node-kind": "process"}
    spec["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "4Gi"}}
    spec["readiness"] = {"loadTimeoutSeconds": 300}
    spec["rollout"] = {
        "steps": [{"weight": 50, "pauseSeconds": 5}],
        "analysis": ANALYSIS
        | {
            "slo": {"ttftSeconds": 10.0, "interTokenSeconds": 2.0},  # 135M params on 2 shared cores
            "quality": {
                "evalSet": {
                    "inline": [i.model_dump(mode="json", by_alias=True, exclude_none=True) for i in items],
                    "digest": eval_set_digest(items),
                },
                "timeoutSeconds": 300,
            },
        },
        "progressDeadlineSeconds": 900,
        "keepPrevious": {"replicas": 1, "seconds": 900},
    }
    create(cluster, ns, manifest(name, **spec))
    md = wait_md(cluster, ns, name, stable_and_ready, 420, f"{name} Stable and Ready on the real model")
    return md["status"]["stable"]["bundle"]


def figures(q: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["metric"]: m for m in q.get("metrics") or []}


def test_requantized_weights_rolled_back_by_the_quality_gate_then_a_harmless_bundle_promoted(
    cluster: E2ECluster,
    namespace: str,
    operator: Operator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if cluster.process_node is None:
        pytest.skip("external $KUBECONFIG cluster: no process node")
    ns, name = namespace, "q"
    t0 = time.monotonic()
    real_digest, rtn3_digest = models_volume(cluster, ns, tmp_path)
    assert rtn3_digest != real_digest
    old = serve_real(cluster, ns, name, real_digest)
    old_ips = pod_ips(cluster, ns, old)
    print(f"[timing] real model Stable and Ready: {time.monotonic() - t0:.1f}s")

    with Load(cluster.api, ns, name, workers=2, max_seconds=1200, model=SERVED) as load:
        t = time.monotonic()
        change_bundle(
            cluster,
            ns,
            name,
            lambda b: (  # the tokenizer is read from the model directory: its digest moves too
                b["model"].update(uri="pvc://models/rtn3", revision="rtn3-g32", digest=rtn3_digest),
                b["tokenizer"].update(revision="rtn3-g32", digest=rtn3_digest),
            ),
        )
        md = wait_phase(cluster, ns, name, ("Verifying", "RollingBack"), 300)
        bad = md["status"]["canary"]["bundle"]
        bad_ips = pod_ips(cluster, ns, bad)
        done = wait_md(cluster, ns, name, rolled_back, 600, "the re-quantized bundle rolled back")
        print(f"[timing] re-quantized bundle change -> rolled back: {time.monotonic() - t:.1f}s")
        st = done["status"]
        assert st["stable"]["bundle"] == old and st["failedBundles"] == [bad], st
        assert st.get("canaryWeight", 0) == 0, st
        deg = condition(done, "Degraded")
        assert deg["status"] == "True" and deg["reason"] == "QualityFailed", deg
        q = st["lastQuality"]
        assert q["verdict"] == "Fail" and q["reason"] == "QualityFailed", q
        assert q["canary"] == bad and q["stable"] == old and q["items"] == len(PICK), q
        assert q["digest"] == eval_set_digest(eval_items()), q
        f = figures(q)
        acc, lp = f["accuracy"], f["mean_logprob"]
        # the real model answers its own set; 3-bit weights lose items and the log-probability collapses
        assert acc["stable"] >= 0.75 and acc["canary"] < acc["stable"], q
        assert lp["verdict"] == "Fail" and lp["canary"] < lp["threshold"] < lp["stable"], q
        assert all(m["threshold"] is not None for m in f.values()), q
        msgs = [m for r, m in events(cluster, ns, name) if r in ("QualityFailed", "RolledBack")]
        assert any("mean_logprob" in m and "threshold" in m for m in msgs), msgs
        assert cli_main(["rollout", "status", name, "--kubeconfig", cluster.kubeconfig, "-n", ns]) == 0
        out = capsys.readouterr().out
        print(out)
        assert "QualityFailed" in out and "mean_logprob" in out and "accuracy" in out, out
        seen = load.by_ip()
        assert bad_ips and not bad_ips & set(seen), ("the bad bundle got traffic before its gate", seen)
        assert sum(seen.get(ip, {}).get(200, 0) for ip in old_ips) > 0, seen  # stable kept serving

        t = time.monotonic()
        change_bundle(
            cluster,
            ns,
            name,
            lambda b: (
                b["model"].update(uri="pvc://models/real", revision=REVISION, digest=real_digest),
                b["tokenizer"].update(revision=REVISION, digest=real_digest),
                b["config"].update(maxNumSeqs=6),
            ),
        )
        md = wait_md(
            cluster,
            ns,
            name,
            lambda m: m["status"].get("stable", {}).get("bundle") not in (old, None),
            600,
            "the harmless bundle promoted",
        )
        print(f"[timing] harmless bundle change -> promoted: {time.monotonic() - t:.1f}s")
    st = md["status"]
    good = st["stable"]["bundle"]
    assert good not in (old, bad) and st["phase"] == "Stable", st
    q = st["lastQuality"]
    assert q["verdict"] == "Pass" and q["canary"] == good, q
    f = figures(q)
    assert f["accuracy"]["canary"] == f["accuracy"]["stable"] and f["greedy_agreement"]["canary"] >= 0.75, q
    assert [r for r, _ in events(cluster, ns, name)].count("QualityPassed") >= 1
    print(f"[timing] whole test: {time.monotonic() - t0:.1f}s")
