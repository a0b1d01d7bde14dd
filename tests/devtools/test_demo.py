"""`modeldeploy demo`: the pure parts (manifest, cohort roles, phase line, live view, summary)."""

from __future__ import annotations

import argparse
import copy
import io
from collections import Counter

from rich.console import Console

from modeldeploy.cli import COMMANDS, commands
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.status import (
    AnalysisResult,
    CohortStatus,
    Condition,
    MetricVerdict,
    ModelDeploymentStatus,
    RolloutStatus,
)
from modeldeploy.operator.rollout.bundle import bundle_id
from modeldeploy_dev import demo, demo_cli

DIGEST = "sha256:" + "a" * 64


def status(**kw) -> dict:
    """A status dict with the real wire shape (camelCase, as the API server returns it)."""
    return ModelDeploymentStatus(**kw).model_dump(mode="json", by_alias=True, exclude_none=True)


CANARY = status(
    phase="Canary",
    canary_weight=50,
    current_step=0,
    stable=CohortStatus(
        bundle="base000000000000", revision="seed0", replicas=1, ready_replicas=1, load_progress=1
    ),
    canary=CohortStatus(
        bundle="slow000000000000", revision="seed0", replicas=1, ready_replicas=1, load_progress=1
    ),
    rollout=RolloutStatus(previous="prior00000000000"),
    failed_bundles=["bad0000000000000"],
    last_analysis=AnalysisResult(
        verdict="Fail",
        step=0,
        metrics=[
            MetricVerdict(
                metric="ttft_p95_seconds",
                stable=0.21,
                canary=0.93,
                threshold=0.315,
                samples=42,
                verdict="Fail",
            ),
            MetricVerdict(
                metric="error_rate", stable=0.0, canary=0.0, threshold=0.05, samples=42, verdict="Pass"
            ),
        ],
    ),
    conditions=[Condition(type="Degraded", status="False", reason="Progressing")],
)
COHORTS = [
    demo.Cohort("base", "base000000000000", "stable", ok=812, errors=0),
    demo.Cohort("slow", "slow000000000000", "canary", ok=95, errors=3, kinds=Counter({429: 1, 0: 2})),
]


def snap() -> demo.Snapshot:
    return demo.Snapshot(
        61.24,
        "slow bundle: expecting rollback",
        CANARY,
        [
            ("NewBundle", "canary slow000000000000"),
            ("AnalysisFailed", "step 1: ttft_p95_seconds 0.93 > 0.315"),
            ("Updated", "updated Service chat to the desired state"),
        ],
        COHORTS,
    )


def test_spec_is_valid_and_each_bundle_change_is_a_new_bundle_id() -> None:
    base = demo.spec_for(DIGEST)
    good, slow = copy.deepcopy(base), copy.deepcopy(base)
    good["bundle"]["config"]["maxNumSeqs"] = 6
    slow["bundle"]["config"]["maxNumSeqs"] = 1
    slow["rollout"]["analysis"].update(demo.SLOW_ANALYSIS)
    worse = copy.deepcopy(good)
    worse["bundle"]["model"].update(uri=f"pvc://models/{demo.BAD_MODEL_DIR}", digest="sha256:" + "b" * 64)
    worse["bundle"]["tokenizer"]["digest"] = "sha256:" + "b" * 64
    ids = {bundle_id(ModelDeploymentSpec.model_validate(s).bundle) for s in (base, good, slow, worse)}
    assert len(ids) == 4
    spec = ModelDeploymentSpec.model_validate(base)
    assert spec.rollout.analysis.min_samples == 8
    assert spec.bundle.model.uri == "pvc://models/smollm2-135m-instruct"
    # the quality gate runs on 8 pinned built-in items, the system-turn and the long recall among them
    q = spec.rollout.analysis.quality
    assert q is not None and q.eval_set is not None and q.eval_set.inline is not None
    assert len(q.eval_set.inline) == 8 and q.eval_set.digest is not None
    assert sum(i.messages is not None and i.messages[0].role == "system" for i in q.eval_set.inline) == 2
    assert any(len(i.chat()[0]["content"]) > 4000 for i in q.eval_set.inline)
    assert demo.ANALYSIS["maxTtftP95Ratio"] == 3.0  # spec_for copied, not aliased


def test_roles_from_status() -> None:
    assert [
        demo.role_of(CANARY, b)
        for b in ("base000000000000", "slow000000000000", "prior00000000000", "bad0000000000000", "other")
    ] == ["stable", "canary", "prior", "failed", ""]


def test_phase_line_names_phase_cohorts_weight_verdict_and_traffic() -> None:
    line = demo.phase_line(snap())
    assert line.startswith("[  61.2s] Canary")
    for part in (
        "stable base000000000000",
        "canary slow000000000000",
        "weight 50%",
        "analysis Fail",
        "base 812 ok/0 err",
        "slow 95 ok/3 err",
        "expecting rollback",
    ):
        assert part in line, (part, line)


def test_view_shows_analysis_figures_traffic_and_events() -> None:
    buf = io.StringIO()
    Console(file=buf, width=160, color_system=None).print(demo.view(snap()))
    text = buf.getvalue()
    for part in (
        "Canary",
        "base000000000000 rev seed0  ready 1/1",
        "50%",
        "last analysis: Fail",
        "ttft_p95_seconds",
        "0.93",
        "0.315",
        "42",
        "812",
        "AnalysisFailed",
        "0.93 > 0.315",
    ):
        assert part in text, (part, text)
    assert "updated Service" not in text  # child writes left out
    ttft = next(ln for ln in text.splitlines() if "ttft_p95_seconds" in ln)
    assert ttft.split()[-1] == "Fail"


def test_summary_passes_only_when_promoted_and_rolled_back_by_analysis_and_quality() -> None:
    quality = {
        "verdict": "Fail",
        "items": 8,
        "digest": "sha256:" + "d" * 64,
        "seconds": 21.5,
        "metrics": [
            {"metric": "accuracy", "stable": 1.0, "canary": 0.25, "threshold": 0.625, "verdict": "Fail"},
            {"metric": "mean_logprob", "stable": -0.2, "canary": -3.1, "threshold": -0.3, "verdict": "Fail"},
        ],
    }
    out = demo.Outcome(
        bundles={"good": "g" * 16, "slow": "s" * 16, "worse": "w" * 16},
        promoted=True,
        rollback_reason="AnalysisFailed",
        rollback_message="step 1: ttft_p95_seconds 0.9 > 0.3",
        chat=("What is the capital of France?", "The capital of France is Paris."),
        quality_reason="QualityFailed",
        quality_message="rolling back: quality failed; failing: mean_logprob canary=-3.1",
        quality=quality,
        cohorts=COHORTS,
        seconds={"good rollout": 40.0},
    )
    lines = demo.summary(out)
    assert out.ok and lines[-1] == "result: PASS"
    assert lines[0] == "chat through the openai client: 'What is the capital of France?' -> " + repr(
        "The capital of France is Paris."
    )
    assert lines[1] == f"good bundle {'g' * 16} (maxNumSeqs 6): promoted"
    assert "rolled back, AnalysisFailed: step 1: ttft_p95_seconds" in lines[2]
    assert lines[3].startswith(
        f"quality regression {'w' * 16} (weights re-quantized to 3 bits): rolled back, "
    )
    assert "QualityFailed: rolling back" in lines[3]
    assert "  mean_logprob      stable -0.200 canary -3.100 threshold -0.300 Fail" in lines
    assert "requests slow  slow000000000000: 95 ok, 3 failed (transport: 2, 429: 1)" in lines
    assert "requests base  base000000000000: 812 ok, 0 failed" in lines
    assert "time good rollout: 40.0s" in lines
    for broken in (
        {"promoted": False},
        {"rollback_reason": "CanaryFailed"},
        {"failure": "TimeoutError"},
        {"quality_reason": ""},
        {"quality_reason": "QualityTimeout"},
        {"chat": ("What is the capital of France?", "noise")},
    ):
        bad = demo.Outcome(**{**out.__dict__, **broken})
        assert not bad.ok and demo.summary(bad)[-1] == "result: FAIL"


def test_demo_command_is_registered_with_its_options() -> None:
    # registered by the modeldeploy-dev distribution's entry point, not by the product's own table
    assert "demo" not in COMMANDS and commands()["demo"][0] == "modeldeploy_dev.demo_cli"
    p = argparse.ArgumentParser()
    demo_cli.configure(p)
    a = p.parse_args([])
    assert (a.keep, a.workdir, a.kubeconfig, a.namespace) == (False, "out/demo", None, "demo")
