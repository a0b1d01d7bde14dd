"""plan()'s named sub-planners, one at a time: each is pure, so each gets its own small table."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from support.operator_fixtures import as_observed, gpu_nodes, md

from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.status import (
    AnalysisResult,
    CohortStatus,
    Condition,
    MetricVerdict,
    ModelDeploymentStatus,
)
from modeldeploy.operator.rollout import children
from modeldeploy.operator.rollout import plan as p
from modeldeploy.operator.rollout.actions import Annotate, Create, Delete, Event, Observed, Patch, PatchStatus
from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, bundle_id
from modeldeploy.operator.rollout.commands import PROMOTE
from modeldeploy.operator.rollout.machine import RolloutState

NOW = "2026-01-01T00:00:00Z"


def inputs(obj: dict[str, Any] | None = None, observed: Observed | None = None, **status: Any) -> p.Inputs:
    obj = obj or md()
    prior = ModelDeploymentStatus.model_validate(status)
    spec = ModelDeploymentSpec.model_validate(obj["spec"])
    return p.Inputs.of(obj, spec, prior, observed or Observed(nodes=gpu_nodes()), NOW)


def dep(bundle: str, replicas: int, ready: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": f"chat-{bundle[:10]}", "labels": {BUNDLE_LABEL: bundle}},
        "spec": {"replicas": replicas},
        "status": {"readyReplicas": ready},
    }


def cohorts(ready: int, all_ready: bool, bundle: str = "b1") -> p.CohortSummary:
    stable = CohortStatus(bundle=bundle, replicas=2, ready_replicas=ready)
    return p.CohortSummary(stable, None, ready, ready >= 2, all_ready)


# plan_rollout


def test_rollout_first_bundle_becomes_stable_with_its_event() -> None:
    x = inputs()
    state, out = p.plan_rollout(x)
    assert (state.phase, state.stable) == ("Stable", x.bid)
    assert [(e.reason) for e in out] == ["Initial"]


def test_rollout_fresh_analysis_is_an_event_before_the_step_and_a_command_is_consumed() -> None:
    analysis = AnalysisResult(
        verdict="Fail", step=0, metrics=[MetricVerdict(metric="error_rate", verdict="Fail")]
    )
    obs = Observed(nodes=gpu_nodes(), analysis=analysis, analysis_fresh=True, command_annotations=(PROMOTE,))
    _, out = p.plan_rollout(inputs(observed=obs))
    assert isinstance(out[0], Event) and (out[0].type, out[0].reason) == ("Warning", "Analysis")
    assert out[-1] == Annotate({PROMOTE: None})


def test_rollout_restarts_from_spec_when_the_stable_deployment_is_gone() -> None:
    x = inputs(stable={"bundle": "gone"}, phase="Stable")
    state, out = p.plan_rollout(x)
    assert state.stable == x.bid and out[0].reason == "Initial"


# plan_deployments


def test_deployments_create_the_desired_bundle() -> None:
    x = inputs()
    live, out = p.plan_deployments(x, {x.bid: 2}, None)
    assert list(live) == [x.bid] and isinstance(out[0], Create) and out[0].obj["spec"]["replicas"] == 2
    assert out[1].reason == "Created"


def test_deployments_scale_an_older_bundle_and_delete_one_no_longer_live() -> None:
    x = inputs(observed=Observed(deployments=[dep("old", 4), dep("dead", 1)], nodes=gpu_nodes()))
    live, out = p.plan_deployments(x, {"old": 1}, None)
    assert list(live) == ["old"]
    assert out[0] == Patch("Deployment", "chat-old", {"spec": {"replicas": 1}}) and out[1].reason == "Scaled"
    assert out[2] == Delete("Deployment", "chat-dead") and out[3].reason == "Deleted"


def test_deployments_an_impossible_placement_keeps_running_pods_untouched() -> None:
    x = inputs()
    running = dep(x.bid, 2, 2)
    x = replace(x, by_bundle={x.bid: running})
    live, out = p.plan_deployments(x, {x.bid: 2}, "no node has gpuType X")
    assert live == {x.bid: running} and out == []
    live, out = p.plan_deployments(replace(x, by_bundle={}), {x.bid: 2}, "no node")
    assert live == {} and out == []


# plan_services


def test_services_main_pinned_to_the_one_serving_bundle_and_cohorts_made_only_with_a_canary() -> None:
    x = inputs()
    state = RolloutState(phase="Stable", stable=x.bid)
    out = p.plan_services(x, state, {x.bid: {}}, None)
    made = {a.obj["metadata"]["name"]: a.obj["spec"]["selector"] for a in out if isinstance(a, Create)}
    assert list(made) == ["chat"] and made["chat"][BUNDLE_LABEL] == x.bid  # no cohorts yet: no copies
    out = p.plan_services(x, state, {x.bid: {}}, "c1")
    made = {a.obj["metadata"]["name"]: a.obj["spec"]["selector"] for a in out if isinstance(a, Create)}
    assert made["chat-canary"][BUNDLE_LABEL] == "c1" and made["chat-stable"][BUNDLE_LABEL] == x.bid
    kept = as_observed(
        next(a.obj for a in out if isinstance(a, Create) and a.obj["metadata"]["name"] == "chat-canary")
    )
    x = replace(x, observed=Observed(services=[kept]))
    out = p.plan_services(x, state, {x.bid: {}}, None)  # the canary is over: kept, selecting no pod
    patched = [a for a in out if isinstance(a, Patch) and a.name == "chat-canary"]
    assert len(patched) == 1 and patched[0].body["spec"]["selector"][BUNDLE_LABEL] == "none"


def test_services_stable_made_at_once_when_an_http_route_names_it_and_kept_after_a_canary() -> None:
    obj = md()
    obj["spec"]["rollout"] = {"trafficRouting": {"gatewayAPI": {"parentRefs": [{"name": "gw"}]}}}
    x = inputs(obj)
    state = RolloutState(phase="Stable", stable=x.bid)
    out = p.plan_services(x, state, {x.bid: {}}, None)
    made = {a.obj["metadata"]["name"]: a.obj["spec"]["selector"] for a in out if isinstance(a, Create)}
    assert sorted(made) == ["chat", "chat-stable"] and made["chat-stable"][BUNDLE_LABEL] == x.bid
    x = inputs()  # no route: a -stable made by an earlier canary is kept and follows the stable bundle
    kept = as_observed(children.service(x.md, "stable", "old"))
    out = p.plan_services(replace(x, observed=Observed(services=[kept])), state, {x.bid: {}}, None)
    patched = [a for a in out if isinstance(a, Patch) and a.name == "chat-stable"]
    assert len(patched) == 1 and patched[0].body["spec"]["selector"][BUNDLE_LABEL] == x.bid


def test_services_converged_plan_nothing_and_drift_reverts() -> None:
    x = inputs()
    state = RolloutState(phase="Stable", stable=x.bid)
    existing = [
        as_observed(a.obj) for a in p.plan_services(x, state, {x.bid: {}}, None) if isinstance(a, Create)
    ]
    x = replace(x, observed=Observed(services=existing))
    assert p.plan_services(x, state, {x.bid: {}}, None) == []
    existing[0]["spec"]["selector"]["extra"] = "x"
    out = p.plan_services(x, state, {x.bid: {}}, None)
    assert out[0].body["spec"]["selector"]["extra"] is None and out[1].reason == "DriftReverted"


# plan_routes


def test_routes_without_gateway_delete_leftovers() -> None:
    x = inputs(observed=Observed(routes=[{"metadata": {"name": "chat"}}]))
    assert p.plan_routes(x, 0, False) == (None, [Delete("HTTPRoute", "chat")])


def test_routes_gateway_set_but_not_served_is_a_problem() -> None:
    obj = md(rollout={"trafficRouting": {"gatewayAPI": {"parentRefs": [{"name": "gw"}]}}})
    problem, out = p.plan_routes(inputs(obj, Observed(routes=None)), 10, True)
    assert "serves no gateway.networking.k8s.io/v1 HTTPRoute" in problem and out == []
    problem, out = p.plan_routes(inputs(obj, Observed(routes=[])), 10, True)
    assert problem is None and isinstance(out[0], Create) and out[0].obj["kind"] == "HTTPRoute"


# plan_cohorts


def test_cohorts_figures_and_readiness() -> None:
    x = inputs()
    x = replace(x, by_bundle={x.bid: dep(x.bid, 2, 2), "c": dep("c", 1, 1)})
    state = RolloutState(phase="Canary", stable=x.bid, canary="c", step=0)
    c = p.plan_cohorts(x, state, {x.bid: 2, "c": 1}, "c", {})
    assert (c.stable.ready_replicas, c.canary.ready_replicas, c.ready_total) == (2, 1, 3)
    assert c.stable_ready and not c.all_ready  # a canary is in flight
    c = p.plan_cohorts(x, RolloutState(stable=x.bid), {x.bid: 2}, None, {})
    assert c.all_ready and c.canary is None and c.stable.revision == "r1"


def test_a_deployment_being_created_is_named_with_nothing_ready() -> None:
    x = inputs()  # no Deployment observed yet: this plan creates it
    created = {x.bid: {"metadata": {"name": "chat-new"}, "spec": {"replicas": 2}}}
    c = p.plan_cohorts(x, RolloutState(stable=x.bid), {x.bid: 2}, None, created)
    assert (c.stable.deployment, c.stable.ready_replicas, c.stable.load_progress) == ("chat-new", 0, 0.0)
    assert not c.stable_ready and not c.all_ready
    c = p.plan_cohorts(x, RolloutState(stable=x.bid), {x.bid: 2}, None, {})
    assert c.stable.deployment is None  # not created (an impossible placement): nothing named


# plan_degraded


def test_degraded_most_fundamental_reason_first() -> None:
    x = inputs(observed=Observed(load_errors={"b": "digest mismatch"}))
    state = RolloutState(stable="b")
    assert p.plan_degraded(x, state, "no node", "no routes")[0] == "Unschedulable"
    assert p.plan_degraded(x, state, None, "no routes") == (
        "LoadFailed",
        "bundle b failed to load: digest mismatch",
    )
    assert p.plan_degraded(inputs(), state, None, "no routes") == ("GatewayAPIUnavailable", "no routes")
    assert p.plan_degraded(inputs(), RolloutState(stable=inputs().bid), None, None) is None


def test_degraded_a_failed_rollout_keeps_its_reason_while_spec_asks_for_that_bundle() -> None:
    state = RolloutState(stable="old", reason="AnalysisFailed", message="error_rate canary=0.5")
    assert p.plan_degraded(inputs(), state, None, None) == ("AnalysisFailed", "error_rate canary=0.5")


# plan_phase


def test_phase_degraded_deploying_or_the_machines() -> None:
    assert (
        p.plan_phase(RolloutState(stable="b"), ("Unschedulable", "x"), cohorts(0, False), "b") == "Degraded"
    )
    assert p.plan_phase(RolloutState(stable="b"), ("AnalysisFailed", "x"), cohorts(2, False), "b") == "Stable"
    assert p.plan_phase(RolloutState(stable="b"), None, cohorts(0, False), "b") == "Deploying"
    canary = RolloutState(phase="Canary", stable="b", canary="c")
    assert p.plan_phase(canary, ("ReplicaFailure", "x"), cohorts(2, False), "c") == "Canary"


# plan_conditions and degraded_event


def test_conditions_ready_progressing_degraded() -> None:
    x = inputs()
    conds = {
        c.type: c for c in p.plan_conditions(x, RolloutState(stable=x.bid), None, cohorts(2, True, x.bid))
    }
    assert (conds["Ready"].status, conds["Progressing"].reason, conds["Degraded"].reason) == (
        "True",
        "Complete",
        "AsExpected",
    )
    state = RolloutState(phase="Canary", stable=x.bid, canary="c", reason="CanaryReady", message="step 1/2")
    conds = {c.type: c for c in p.plan_conditions(x, state, ("ReplicaFailure", "quota"), cohorts(1, False))}
    assert conds["Ready"].status == "False" and conds["Ready"].message == "1/2 stable replicas ready"
    assert (conds["Progressing"].status, conds["Progressing"].reason) == ("True", "CanaryReady")
    assert (conds["Degraded"].status, conds["Degraded"].message) == ("True", "quota")


def test_degraded_event_only_on_a_new_reason() -> None:
    assert p.degraded_event(ModelDeploymentStatus(), ("LoadFailed", "m")) == [
        Event("Warning", "LoadFailed", "m")
    ]
    old = Condition(type="Degraded", status="True", reason="LoadFailed")
    assert p.degraded_event(ModelDeploymentStatus(conditions=[old]), ("LoadFailed", "m")) == []
    assert p.degraded_event(ModelDeploymentStatus(), ("AnalysisFailed", "m")) == []  # the rollout has its own
    assert p.degraded_event(ModelDeploymentStatus(), None) == []


# plan_status and status_patch


def test_status_step_only_while_canary_and_analysis_kept_outside_a_rollout() -> None:
    kept = AnalysisResult(verdict="Pass", step=1)
    x = inputs(lastAnalysis=kept.model_dump(by_alias=True))
    c = cohorts(2, True, x.bid)
    st = p.plan_status(
        x, RolloutState(phase="Canary", stable=x.bid, canary="c", step=1), "Canary", [], c, {x.bid: 2}, 10
    )
    assert st.current_step == 1 and st.canary_weight == 10 and st.last_analysis is None  # observed: none yet
    st = p.plan_status(x, RolloutState(stable=x.bid, step=1), "Stable", [], c, {x.bid: 2}, 0)
    assert (
        st.current_step is None and st.last_analysis == kept and st.selector.startswith("app.kubernetes.io/")
    )
    assert st.replicas == 2 and st.ready_replicas == 2


def test_status_patch_only_when_changed() -> None:
    prior = ModelDeploymentStatus(phase="Stable")
    assert p.status_patch(prior, prior.model_copy()) == []
    out = p.status_patch(prior, prior.model_copy(update={"phase": "Deploying"}))
    assert out == [
        PatchStatus(
            {
                "phase": "Deploying",
                "canaryWeight": 0,
                "replicas": 0,
                "readyReplicas": 0,
                "conditions": [],
                "history": [],
                "failedBundles": [],
            }
        )
    ]


def test_inputs_bundle_id_is_the_specs() -> None:
    x = inputs()
    assert x.bid == bundle_id(x.spec.bundle) and x.generation == 1 and x.now_s == 1767225600.0
