"""`modeldeploy rollout`: patch bodies, rollback target choice, status rendering, CLI errors."""

from __future__ import annotations

import pytest

from modeldeploy.cli import COMMANDS
from modeldeploy.cli import main as cli_main
from modeldeploy.operator import rollout_cli as rc
from modeldeploy.operator.api.v1alpha1.status import (
    AnalysisResult,
    CohortStatus,
    Condition,
    HistoryEntry,
    MetricVerdict,
    ModelDeploymentStatus,
    PrefetchWait,
    RolloutStatus,
)
from modeldeploy.operator.rollout.commands import ABORT, PROMOTE, ROLLBACK_TO, command_from_annotations
from modeldeploy.operator.rollout.progression import now_iso

HISTORY = [
    HistoryEntry(
        bundle="aaaaaaaaaaaaaaaa",
        revision="r1",
        promoted_at="2026-01-01T00:00:00Z",
        replaced_at="2026-01-02T00:00:00Z",
    ),
    HistoryEntry(
        bundle="bbbbbbbbbbbbbbbb",
        revision="r2",
        promoted_at="2026-01-02T00:00:00Z",
        replaced_at="2026-01-03T00:00:00Z",
    ),
]


def status(**kw) -> dict:
    """A status dict with the real wire shape (camelCase, as the API server returns it)."""
    return ModelDeploymentStatus(**kw).model_dump(mode="json", by_alias=True, exclude_none=True)


def md(st: dict, annotations: dict | None = None, generation: int = 3) -> dict:
    return {
        "metadata": {
            "name": "chat",
            "namespace": "llm",
            "generation": generation,
            "annotations": annotations or {},
        },
        "spec": {"rollout": {"steps": [{"weight": 10}, {"weight": 50}]}},
        "status": st,
    }


def test_patch_bodies_touch_only_metadata_annotations() -> None:
    assert rc.annotation_patch("promote", "T") == {
        "metadata": {"annotations": {"modeldeploy.dev/promote": "T"}}
    }
    assert rc.annotation_patch("abort", "T") == {"metadata": {"annotations": {"modeldeploy.dev/abort": "T"}}}
    assert rc.annotation_patch("rollback", "T", "abc") == {
        "metadata": {"annotations": {"modeldeploy.dev/rollback-to": "abc"}}
    }
    with pytest.raises(rc.RolloutError, match="--to BUNDLE"):
        rc.annotation_patch("rollback", "T")
    with pytest.raises(rc.RolloutError, match="unknown action 'status'"):
        rc.annotation_patch("status", "T")


def test_now_stamp_is_rfc3339_utc() -> None:
    import re

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", now_iso())


def test_command_from_annotations_precedence() -> None:
    assert command_from_annotations(None) is None
    assert command_from_annotations({"other": "x"}) is None
    assert command_from_annotations({PROMOTE: "t"}) == "promote"
    assert command_from_annotations({PROMOTE: "t", ROLLBACK_TO: "abc"}) == "rollback-to:abc"
    assert command_from_annotations({PROMOTE: "t", ABORT: "t"}) == "abort"


def test_rollback_target_newest_by_default_and_explicit() -> None:
    st = status(history=HISTORY)
    bundle, note = rc.rollback_target(st, None)
    assert bundle == "bbbbbbbbbbbbbbbb" and "newest history entry bbbbbbbbbbbbbbbb" in note and "r2" in note
    assert rc.rollback_target(st, "aaaaaaaaaaaaaaaa")[0] == "aaaaaaaaaaaaaaaa"


def test_rollback_target_errors_list_the_history() -> None:
    with pytest.raises(rc.RolloutError, match="status.history is empty"):
        rc.rollback_target(status(), None)
    with pytest.raises(rc.RolloutError) as e:
        rc.rollback_target(status(history=HISTORY), "cccc")
    assert "--to cccc: not in status.history" in str(e.value)
    assert "aaaaaaaaaaaaaaaa (r1)" in str(e.value) and "bbbbbbbbbbbbbbbb (r2)" in str(e.value)


def test_render_canary_status_shows_every_figure() -> None:
    analysis = AnalysisResult(
        time="2026-01-03T10:00:00Z",
        step=0,
        verdict="Fail",
        metrics=[
            MetricVerdict(
                metric="ttft_p95_seconds",
                stable=0.21,
                canary=0.52,
                threshold=0.252,
                samples=120,
                verdict="Fail",
            ),
            MetricVerdict(
                metric="error_rate", stable=0.0, canary=0.0, threshold=0.01, samples=120, verdict="Pass"
            ),
        ],
    )
    st = status(
        phase="Canary",
        observed_generation=3,
        canary_weight=10,
        current_step=0,
        stable=CohortStatus(
            bundle="bbbbbbbbbbbbbbbb", revision="r2", replicas=4, ready_replicas=4, load_progress=1.0
        ),
        canary=CohortStatus(
            bundle="dddddddddddddddd", revision="r3", replicas=1, ready_replicas=0, load_progress=0.4
        ),
        conditions=[
            Condition(
                type="Progressing",
                status="True",
                reason="AnalysisRunning",
                message="step 1/2",
                last_transition_time="2026-01-03T09:59:00Z",
            )
        ],
        history=HISTORY,
        last_analysis=analysis,
        failed_bundles=["eeeeeeeeeeeeeeee"],
    )
    text = rc.render_text(md(st, {PROMOTE: "2026-01-03T10:01:00Z"}), width=160)
    for want in (
        "ModelDeployment llm/chat",
        "Canary",
        "bbbbbbbbbbbbbbbb rev r2  ready 4/4",
        "dddddddddddddddd rev r3  ready 0/1, load 40%",
        "10%",
        "1/2 (weight 10%)",
        "modeldeploy.dev/promote=2026-01-03T10:01:00Z",
        "AnalysisRunning",
        "last analysis step 1",
        "Fail",
        "ttft_p95_seconds",
        "0.21",
        "0.52",
        "0.252",
        "120",
        "aaaaaaaaaaaaaaaa",
        "2026-01-02T00:00:00Z",
        "failed bundles",
        "eeeeeeeeeeeeeeee",
    ):
        assert want in text, want
    ttft_row = next(line for line in text.splitlines() if "ttft_p95_seconds" in line)
    assert ttft_row.split()[-1] == "Fail" and "0.52" in ttft_row
    assert "status not yet updated" not in text


def test_render_inconclusive_analysis_says_what_could_not_be_read() -> None:
    why = "prometheus http://prom:9090: query 'sum by (le) (...)' returned no series"
    st = status(
        phase="Canary",
        observed_generation=3,
        current_step=0,
        last_analysis=AnalysisResult(step=0, verdict="Inconclusive", message=why),
    )
    text = rc.render_text(md(st), width=200)
    assert "Inconclusive" in text and f"analysis could not read: {why}" in text


def prefetching(**rollout) -> dict:
    return status(
        phase="Prefetching",
        observed_generation=3,
        stable=CohortStatus(bundle="bbbbbbbbbbbbbbbb", revision="r2", replicas=3, ready_replicas=3),
        canary=CohortStatus(bundle="dddddddddddddddd", revision="r3"),
        rollout=RolloutStatus(
            reason="NewBundle",
            phase_since="2026-01-03T10:00:00Z",
            prefetch_nodes=3,
            prefetched_nodes=1,
            **rollout,
        ),
    )


def test_render_prefetching_shows_nodes_pulled_time_spent_and_each_waiting_pod() -> None:
    mismatch = (
        'Back-off pulling image "registry.local:5000/models/m@sha256:dd": ErrImagePull: failed commit on ref '
        '"layer-sha256:ee": unexpected commit digest sha256:ff, expected sha256:ee: failed precondition'
    )
    st = prefetching(
        prefetch_waiting=[
            PrefetchWait(node="gpu-2", reason="ImagePullBackOff", message=mismatch),
            PrefetchWait(node="gpu-1", reason="ContainerCreating"),
            PrefetchWait(reason="Unschedulable", message="0/3 nodes are available"),
        ]
    )
    obj = md(st)
    obj["spec"]["rollout"]["prefetch"] = {"timeoutSeconds": 300}
    now = 1767434400.0 + 42  # 2026-01-03T10:00:42Z
    text = rc.render_text(obj, width=400, now=now)
    assert "images pulled on 1/3 nodes, 42s of prefetch.timeoutSeconds 300" in text
    assert "pre-pull pods not Ready" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip().startswith(("gpu-", "(un"))}
    assert "ImagePullBackOff" in rows["gpu-2"] and "unexpected commit digest sha256:ff" in rows["gpu-2"]
    assert "ContainerCreating" in rows["gpu-1"] and rows["gpu-1"].split()[-1] == "-"
    assert "Unschedulable" in rows["(unscheduled)"]


def test_render_prefetching_defaults_the_timeout_and_hides_the_table_when_nothing_waits() -> None:
    text = rc.render_text(md(prefetching()), width=200, now=1767434400.0 + 5)
    assert "images pulled on 1/3 nodes, 5s of prefetch.timeoutSeconds 900" in text  # the API's default
    assert "pre-pull pods" not in text
    stable = rc.render_text(md(status(phase="Stable", observed_generation=3)), width=200)
    assert "prefetch" not in stable


def test_render_stale_generation_and_empty_status() -> None:
    text = rc.render_text(md(status(phase="Stable", observed_generation=2), generation=3))
    assert "3 observed 2 (status not yet updated for this generation)" in text
    assert "no status yet" in rc.render_text(md({}))


def test_cli_is_registered_and_flags_are_checked(capsys) -> None:
    assert COMMANDS["rollout"][0] == "modeldeploy.operator.rollout_cli"
    with pytest.raises(SystemExit) as e:
        cli_main(["rollout", "resume", "chat"])
    assert e.value.code == 2 and "invalid choice: 'resume'" in capsys.readouterr().err
    assert cli_main(["rollout", "promote", "chat", "--to", "abc"]) == 1
    assert "--to applies to rollback only, not promote" in capsys.readouterr().err


def test_cli_missing_kubeconfig_is_a_clear_error(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli_main(["rollout", "status", "chat", "--kubeconfig", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("modeldeploy rollout: error: no Kubernetes configuration") and "nope" in err
