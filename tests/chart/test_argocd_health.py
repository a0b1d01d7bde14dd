"""Argo CD health Lua for ModelDeployment, run in Lua 5.1 (Argo CD's gopher-lua dialect) through lupa.

Two sources of objects: built with the real status model (`ModelDeploymentStatus.model_dump`, the
wire shape the operator writes), and recorded from the rollout e2e (tests/data/argocd/*.json,
written by `MODELDEPLOY_RECORD_STATUS=tests/data/argocd pytest e2e/test_rollout_controls.py
e2e/test_rollout_faults.py`; the e2e evaluates the same Lua on the live objects too). The
capacity states (`*insufficient-capacity*`, `*replace*`, `*inconclusive*`) were first written from the
plan() scenarios of tests/operator/rollout/test_operator_capacity.py (2 nodes x 8 GPUs, 16
replicas); the `*-kwok.json`
ones are the same states recorded live on kwok GPU nodes by e2e/test_rollout_capacity.py (Replace canary,
InsufficientCapacity, Replace promotion with a cold prior, Replace rollback, Surge with a warm prior).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from modeldeploy.operator.api.v1alpha1.status import CohortStatus, Condition, ModelDeploymentStatus
from modeldeploy_dev.argocd import LUA, health

ROOT = Path(__file__).resolve().parents[2]
RECORDED = sorted((ROOT / "tests/data/argocd").glob("*.json"))
SNIPPET = ROOT / "charts/modeldeploy-operator/argocd/argocd-cm-snippet.yaml"
KEY = "resource.customizations.health.serving.modeldeploy.dev_ModelDeployment"

STABLE = CohortStatus(
    bundle="aaaaaaaaaaaaaaaa", revision="r1", replicas=4, ready_replicas=4, load_progress=1.0
)
CANARY = CohortStatus(
    bundle="bbbbbbbbbbbbbbbb", revision="r2", replicas=1, ready_replicas=1, load_progress=1.0
)


def md(generation: int = 2, **status: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "serving.modeldeploy.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": "llm", "generation": generation},
    }
    if status:
        obj["status"] = ModelDeploymentStatus(**status).model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
    return obj


def cond(ctype: str, status: bool, reason: str, message: str = "") -> Condition:
    return Condition(
        type=ctype,
        status="True" if status else "False",
        reason=reason,
        message=message,
        observed_generation=2,
        last_transition_time="2026-01-01T00:00:00Z",
    )


READY = cond("Ready", True, "AllReplicasReady", "4/4 ready")
NOT_DEGRADED = cond("Degraded", False, "AsExpected")


def test_snippet_embeds_the_same_script() -> None:
    cm = yaml.safe_load(SNIPPET.read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"] == {
        "name": "argocd-cm",
        "namespace": "argocd",
        "labels": {"app.kubernetes.io/name": "argocd-cm", "app.kubernetes.io/part-of": "argocd"},
    }
    assert cm["data"][KEY] == LUA.read_text()


def test_no_status_is_progressing() -> None:
    assert health(md()) == ("Progressing", "Waiting for the operator to report status")


def test_stable_ready_is_healthy() -> None:
    status, msg = health(
        md(observed_generation=2, phase="Stable", stable=STABLE, conditions=[READY, NOT_DEGRADED])
    )
    assert status == "Healthy" and msg == "Stable aaaaaaaaaaaaaaaa 4/4 ready"


@pytest.mark.parametrize("observed", [1, None])
def test_stale_observed_generation_is_progressing_even_if_ready(observed) -> None:
    status, msg = health(
        md(generation=2, observed_generation=observed, phase="Stable", stable=STABLE, conditions=[READY])
    )
    assert (
        status == "Progressing"
        and "observe generation 2" in msg
        and f"status is for {observed or 'none'}" in msg
    )


@pytest.mark.parametrize(
    "phase", ["Prefetching", "Deploying", "Verifying", "Canary", "Promoting", "RollingBack"]
)
def test_rollout_phases_are_progressing(phase) -> None:
    status, msg = health(
        md(
            observed_generation=2,
            phase=phase,
            stable=STABLE,
            canary=CANARY,
            canary_weight=10,
            current_step=0,
            conditions=[READY, NOT_DEGRADED, cond("Progressing", True, "AnalysisRunning", "step 1/2")],
        )
    )
    assert status == "Progressing"
    assert msg == (
        f"{phase}: canary bbbbbbbbbbbbbbbb 1/1 ready at 10% step 1; stable aaaaaaaaaaaaaaaa 4/4 ready "
        "(AnalysisRunning: step 1/2)"
    )


@pytest.mark.parametrize("reason", ["Paused", "AwaitingPromotion"])
def test_paused_canary_step_is_suspended(reason) -> None:
    status, msg = health(
        md(
            observed_generation=2,
            phase="Canary",
            stable=STABLE,
            canary=CANARY,
            canary_weight=50,
            current_step=1,
            conditions=[READY, cond("Progressing", True, reason, "waiting")],
        )
    )
    assert status == "Suspended"
    assert "at 50% step 2" in msg and f"{reason}: waiting" in msg and "modeldeploy rollout promote" in msg


def test_paused_reason_outside_canary_is_not_suspended() -> None:
    status, _ = health(
        md(
            observed_generation=2,
            phase="Verifying",
            stable=STABLE,
            canary=CANARY,
            conditions=[cond("Progressing", True, "Paused")],
        )
    )
    assert status == "Progressing"


def test_degraded_condition_after_rollback() -> None:
    status, msg = health(
        md(
            observed_generation=2,
            phase="Stable",
            stable=STABLE,
            failed_bundles=["b" * 16],
            conditions=[
                READY,
                cond(
                    "Degraded",
                    True,
                    "AnalysisFailed",
                    "ttft_p95_seconds canary=0.52 stable=0.21 threshold=0.252",
                ),
            ],
        )
    )
    assert (
        status == "Degraded"
        and msg == "AnalysisFailed: ttft_p95_seconds canary=0.52 stable=0.21 threshold=0.252"
    )


def test_quality_failure_is_degraded_with_its_figures() -> None:
    """The quality gate's rollback reaches Argo CD through the Degraded condition, figures and all."""
    figures = (
        "rolling back bbbbbbbbbbbbbbbb: quality failed: accuracy canary 19/28 stable 28/28, greedy agreement "
        "0.21, log-prob drop 0.8123 nats/token over 28 items (canary against stable); failing: accuracy "
        "canary=0.6786 stable=1.0 threshold=0.8929; mean_logprob canary=-1.41 stable=-0.6 threshold=-0.7"
    )
    status, msg = health(
        md(
            observed_generation=2,
            phase="Stable",
            stable=STABLE,
            failed_bundles=["b" * 16],
            conditions=[READY, cond("Degraded", True, "QualityFailed", figures)],
        )
    )
    assert status == "Degraded" and msg == f"QualityFailed: {figures}"
    status, msg = health(
        md(
            observed_generation=2,
            phase="Verifying",
            stable=STABLE,
            canary=CANARY,
            conditions=[READY, cond("Progressing", True, "ConformancePassed", "running the quality gate")],
        )
    )
    assert status == "Progressing" and "running the quality gate" in msg


def test_degraded_wins_over_a_rollout_phase() -> None:
    status, msg = health(
        md(
            observed_generation=2,
            phase="RollingBack",
            stable=STABLE,
            canary=CANARY,
            conditions=[cond("Degraded", True, "ConformanceFailed", "streaming")],
        )
    )
    assert (status, msg) == ("Degraded", "ConformanceFailed: streaming")


def test_degraded_phase_without_condition() -> None:
    assert health(md(observed_generation=2, phase="Degraded")) == ("Degraded", "Phase Degraded")


def test_unschedulable_is_degraded() -> None:
    status, msg = health(
        md(
            observed_generation=2,
            phase="Degraded",
            conditions=[
                cond("Ready", False, "Unschedulable"),
                cond("Degraded", True, "Unschedulable", "no node has NVIDIA-B200"),
            ],
        )
    )
    assert status == "Degraded" and "NVIDIA-B200" in msg


def test_not_ready_stable_is_progressing() -> None:
    status, msg = health(
        md(
            observed_generation=2,
            phase="Stable",
            stable=STABLE.model_copy(update={"ready_replicas": 1}),
            conditions=[cond("Ready", False, "Loading", "1/4 ready, load 40%"), NOT_DEGRADED],
        )
    )
    assert (status, msg) == ("Progressing", "Not ready: Loading: 1/4 ready, load 40%")
    assert health(md(observed_generation=2, phase="Stable")) == (
        "Progressing",
        "Waiting for the Ready condition",
    )


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_objects_recorded_in_the_rollout_e2e(path: Path) -> None:
    rec = json.loads(path.read_text())
    assert health(rec["object"]) == tuple(rec["expected"])
    assert path.stem.split("-")[0] == rec["expected"][0].lower()  # the file name says the health


def test_recordings_cover_every_health_state() -> None:
    assert {p.stem.split("-")[0] for p in RECORDED} == {"healthy", "progressing", "suspended", "degraded"}


def test_replace_waiting_for_capacity_is_progressing_and_says_so() -> None:
    prog = cond("Progressing", True, "InsufficientCapacity", "capacity Replace: 16 Ready, minAvailable 16")
    status, msg = health(
        md(
            observed_generation=2,
            phase="Deploying",
            stable=STABLE,
            canary=CANARY,
            conditions=[prog, NOT_DEGRADED],
        )
    )
    assert status == "Progressing" and msg.startswith("Waiting for capacity: Deploying:")
    assert "minAvailable 16" in msg
