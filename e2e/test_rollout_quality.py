# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""The quality gate on the local cluster, on the real model.

Stable serves SmolLM2-135M-Instruct on the process node. A canary whose weights are re-quantized to
3 bits (round-to-nearest per group of 32, written by modeldeploy_dev.model_variants: a new model
digest, pinned like any revision) is neither slower nor failing, only worse: the gate, after
conformance and before any traffic weight, rolls it back with reason QualityFailed, and the figures
and thresholds show in status.lastQuality, an Event and `modeldeploy rollout status`. Then a
harmless bundle (the same weights, another maxNumSeqs) passes the same gate and is promoted. Last, a
config regression (rope_theta 10x low through bundle.config.hfOverrides, the same weights) and a
tokenizer revision whose chat template drops the system turn are each rolled back by the same gate:
the three kinds of bad bundle, none slower and none failing a request.

The evaluation set is 8 items of the built-in set, inline and pinned by digest (the system-turn
facts and the ~1.1k-token recall item among them), so each gate takes seconds, not a minute.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
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
from modeldeploy_dev.real_model import MODEL_DIGEST, REVISION, bundle_config, cache_root, cached_real_model
from modeldeploy_dev.rollout_scenario import models_pv, stable_and_ready

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


def models_volume(cluster: E2ECluster, ns: str, tmp: Path) -> tuple[str, str, str]:
    """PV+PVC `models` holding `real` (the imported model), `rtn3` (its 3-bit re-quantization) and
    `nosys` (its tokenizer files with a chat template that drops the system turn); returns the three
    digests."""
    real = cached_real_model()
    assert dir_digest(real) == MODEL_DIGEST
    rtn3 = variant(real, "smollm2-rtn3-g32", lambda o: model_variants.requantize(real, o, bits=3, group=32))
    nosys = variant(real, "smollm2-no-system-turn", lambda out: model_variants.drop_system_turn(real, out))
    vol = tmp / "models"
    vol.mkdir()
    for sub, target in (("real", real), ("rtn3", rtn3), ("nosys", nosys)):
        (vol / sub).symlink_to(target, target_is_directory=True)
    models_pv(cluster.core, ns, vol, size="2Gi")
    return MODEL_DIGEST, dir_digest(rtn3), dir_digest(nosys)


def variant(real: Path, name: str, make: Callable[[Path], Path]) -> Path:
    """A bad bundle's model directory, made once per machine next to the model cache by test tooling
    (modeldeploy_dev.model_variants), never by a switch in the product."""
    out = cache_root() / "test-models" / name
    if not (out / "config.json").exists():
        part = out.with_name(f".{out.name}-{os.getpid()}")
        make(part)
        part.rename(out)
    return out


def quality_analysis(items: list[EvalItem]) -> dict[str, Any]:
    """rollout.analysis for the real model on 2 shared cores: relaxed SLOs (135M params on CPU) and
    the quality gate on `items`, inline and pinned by digest."""
    return {
        "slo": {"ttftSeconds": 10.0, "interTokenSeconds": 2.0},
        "quality": {
            "evalSet": {
                "inline": [i.model_dump(mode="json", by_alias=True, exclude_none=True) for i in items],
                "digest": eval_set_digest(items),
            },
            "timeoutSeconds": 300,
        },
    }


def serve_real(cluster: E2ECluster, ns: str, name: str, digest: str) -> str:
    items = eval_items()
    spec = manifest(name)["spec"]
    spec["bundle"]["model"] = {"uri": "pvc://models/real", "revision": REVISION, "digest": digest}
    spec["bundle"]["tokenizer"] = {"revision": REVISION, "digest": digest}
    spec["bundle"]["config"] = bundle_config(SERVED)
    spec["topology"]["nodeSelector"] = {"modeldeploy.dev/node-kind": "process"}
    spec["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "4Gi"}}
    spec["readiness"] = {"loadTimeoutSeconds": 300}
    spec["rollout"] = {
        "steps": [{"weight": 50, "pauseSeconds": 5}],
        "analysis": ANALYSIS | quality_analysis(items),
        "progressDeadlineSeconds": 900,
        "keepPrevious": {"replicas": 1, "seconds": 900},
    }
    create(cluster, ns, manifest(name, **spec))
    md = wait_md(cluster, ns, name, stable_and_ready, 420, f"{name} Stable and Ready on the real model")
    return md["status"]["stable"]["bundle"]


def figures(q: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["metric"]: m for m in q.get("metrics") or []}


def rolled_back_new(m: dict[str, Any], before: list[str]) -> bool:
    """Stable again with a bundle recorded as failed that was not failed `before` (a new canary
    forgets older failures, so the list holds the latest only)."""
    st = m.get("status", {})
    return bool(set(st.get("failedBundles") or []) - set(before)) and st.get("phase") == "Stable"


def assert_quality_rollback(md: dict[str, Any], stable: str) -> dict[str, Any]:
    """The canary was rolled back by the quality gate (not conformance, not latency) to `stable`, with
    the log-probability figure below its threshold and the diverging items named; returns
    status.lastQuality."""
    st = md["status"]
    assert st["stable"]["bundle"] == stable and st.get("canaryWeight", 0) == 0, st
    assert len(st["failedBundles"]) == 1, st
    deg = condition(md, "Degraded")
    assert deg["status"] == "True" and deg["reason"] == "QualityFailed", deg
    q = st["lastQuality"]
    assert q["verdict"] == "Fail" and q["stable"] == stable and q["canary"] in st["failedBundles"], q
    lp = figures(q)["mean_logprob"]
    assert lp["verdict"] == "Fail" and lp["canary"] < lp["threshold"] < lp["stable"], q
    # the evidence: the items that diverged, where the answers part, in the status and the decision
    assert q.get("divergent") and q["divergent"][0]["prompt"], q
    assert "diverged: item" in deg["message"], deg
    return q


def test_quality_gate_rolls_back_three_bad_bundles_and_promotes_a_harmless_one(
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
    real_digest, rtn3_digest, nosys_digest = models_volume(cluster, ns, tmp_path)
    assert len({real_digest, rtn3_digest, nosys_digest}) == 3
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

    # A config regression: the same weights, rope_theta 10x low through bundle.config.hfOverrides. It
    # is a new bundle (the id hashes the config); the answers drift and the log-probabilities drop.
    t = time.monotonic()
    change_bundle(cluster, ns, name, lambda b: b["config"].update(hfOverrides={"rope_theta": 10000.0}))
    md = wait_md(
        cluster,
        ns,
        name,
        lambda m: rolled_back_new(m, []),
        600,
        "the rope_theta-override bundle rolled back",
    )
    print(f"[timing] config regression -> rolled back: {time.monotonic() - t:.1f}s")
    assert_quality_rollback(md, good)

    # A tokenizer revision whose chat template drops the system turn: the same weights and config, the
    # conformance gate passes it, and only answers that depend on the system message change.
    t = time.monotonic()
    change_bundle(
        cluster,
        ns,
        name,
        lambda b: (
            b["config"].pop("hfOverrides"),
            b["model"].update(uri="pvc://models/nosys", digest=nosys_digest),
            b["tokenizer"].update(revision="no-system-turn", digest=nosys_digest),
        ),
    )
    cfg_failed = md["status"]["failedBundles"]
    md = wait_md(
        cluster, ns, name, lambda m: rolled_back_new(m, cfg_failed), 600, "template regression rolled back"
    )
    print(f"[timing] tokenizer-template regression -> rolled back: {time.monotonic() - t:.1f}s")
    q = assert_quality_rollback(md, good)
    acc = figures(q)["accuracy"]
    assert acc["canary"] < acc["stable"], q  # the system-turn facts are lost
    print(f"[timing] whole test: {time.monotonic() - t0:.1f}s")
