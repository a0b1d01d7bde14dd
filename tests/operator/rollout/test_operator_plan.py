"""plan(desired, observed) tables: create, scale, bundle change, deletion, drift, fit."""

from __future__ import annotations

import copy

import pytest
from support.operator_fixtures import IMAGE, gpu_nodes, md
from support.plan_driver import (
    NOW,
    advance_to,
    analysis,
    at,
    converge,
    kinds,
    selector,
    sizes,
    stable_then_change,
    status_of,
)

from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.api.v1alpha1.status import AnalysisResult, MetricVerdict, ModelDeploymentStatus
from modeldeploy.operator.rollout.actions import LostPod
from modeldeploy.operator.rollout.inputs import Inputs
from modeldeploy.operator.rollout.machine import RolloutState
from modeldeploy.operator.rollout.plan import (
    Annotate,
    Create,
    Delete,
    Event,
    Observed,
    Patch,
    PatchStatus,
    plan,
    plan_lost_pods,
)
from modeldeploy.operator.rollout.progression import epoch as _epoch
from modeldeploy.operator.rollout.topology import NodeInfo


def test_create_makes_deployment_and_one_service_and_no_cohort_service_before_a_canary() -> None:
    acts = plan(md(), Observed(nodes=gpu_nodes()), NOW)
    created = kinds(acts)
    dep = [a.obj for a in acts if isinstance(a, Create) and a.obj["kind"] == "Deployment"]
    assert len(dep) == 1 and dep[0]["spec"]["replicas"] == 2
    bid = dep[0]["metadata"]["labels"]["modeldeploy.dev/bundle"]
    assert created == sorted([("create", "Deployment", f"chat-{bid[:10]}"), ("create", "Service", "chat")])
    st = status_of(acts)
    assert st["observedGeneration"] == 1 and st["phase"] == "Deploying" and st["stable"]["bundle"] == bid
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Progressing"]["status"] == "True" and cond["Ready"]["status"] == "False"
    assert cond["Degraded"]["status"] == "False" and all(
        c["lastTransitionTime"] == NOW for c in cond.values()
    )
    assert any(isinstance(a, Event) and a.reason == "Created" for a in acts)


def test_converged_state_plans_nothing_and_is_ready() -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()))
    obj, obs = converge(obj, obs)  # status now sees the ready Deployment
    st = obj["status"]
    assert st["phase"] == "Stable" and st["readyReplicas"] == 2
    assert {c["type"]: c["status"] for c in st["conditions"]} == {
        "Ready": "True",
        "Progressing": "False",
        "Degraded": "False",
    }
    assert plan(obj, obs, "2026-01-01T01:00:00Z") == []  # idempotent: a restarted operator changes nothing


def test_scale_patches_replicas_only() -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()))
    obj, obs = converge(obj, obs)
    obj = copy.deepcopy(obj)
    obj["spec"]["replicas"], obj["metadata"]["generation"] = 5, 2
    acts = plan(obj, obs, NOW)
    [patch] = [a for a in acts if isinstance(a, Patch)]
    assert patch.kind == "Deployment" and patch.body["spec"]["replicas"] == 5
    assert [a.reason for a in acts if isinstance(a, Event)] == ["Updated"]  # our change, not drift
    assert kinds(acts) == [("patch", "Deployment", patch.name)]  # same bundle id: no new Deployment
    assert status_of(acts)["observedGeneration"] == 2


def test_bundle_change_canary_gate_steps_promotion_and_warm_prior() -> None:
    obj, obs, old, _ = stable_then_change()
    obj, obs, acts = advance_to(obj, obs, at(0), ready={})
    new = obj["status"]["canary"]["bundle"]
    assert obj["status"]["phase"] == "Deploying" and new != old
    assert {
        d["metadata"]["labels"]["modeldeploy.dev/bundle"]: d["spec"]["replicas"] for d in obs.deployments
    } == {old: 2, new: 1}  # canary next to a full stable
    assert selector(obs, "chat")["modeldeploy.dev/bundle"] == old  # no traffic before the gate
    obj, obs, _ = advance_to(obj, obs, at(0, 20), ready={new: 0})
    assert obj["status"]["phase"] == "Deploying"  # still loading: hold
    obj, obs, _ = advance_to(obj, obs, at(1))
    assert obj["status"]["phase"] == "Verifying"
    obj, obs, _ = advance_to(obj, obs, at(1, 10))  # gate still running: hold
    assert obj["status"]["phase"] == "Verifying"
    obj, obs, acts = advance_to(obj, obs, at(1, 20), conformance=(True, "8/8 checks passed"))
    st = obj["status"]
    assert (st["phase"], st["currentStep"], st["canaryWeight"]) == ("Canary", 0, 25)
    assert "modeldeploy.dev/bundle" not in selector(obs, "chat")  # both cohorts serve now
    assert selector(obs, "chat-canary")["modeldeploy.dev/bundle"] == new
    res = analysis("Pass", 0)
    obj, obs, _ = advance_to(obj, obs, at(1, 40), analysis=res, analysis_at=_epoch(at(1, 40)))
    assert obj["status"]["currentStep"] == 0  # pause of 30 s not over
    obj, obs, _ = advance_to(obj, obs, at(1, 55), analysis=res, analysis_at=_epoch(at(1, 50)))
    assert obj["status"]["currentStep"] == 1 and obj["status"]["lastAnalysis"]["verdict"] == "Pass"
    obj, obs, _ = advance_to(obj, obs, at(2, 30), analysis=analysis("Pass", 1), analysis_at=_epoch(at(2, 30)))
    assert obj["status"]["phase"] == "Promoting"
    obj, obs, acts = advance_to(obj, obs, at(2, 40))
    st = obj["status"]
    assert (st["phase"], st["stable"]["bundle"], st.get("canary")) == ("Stable", new, None)
    assert st["history"][-1]["bundle"] == old and st["rollout"]["previous"] == old
    assert {
        d["metadata"]["labels"]["modeldeploy.dev/bundle"]: d["spec"]["replicas"] for d in obs.deployments
    } == {new: 2, old: 1}  # prior bundle kept warm
    assert selector(obs, "chat")["modeldeploy.dev/bundle"] == new
    assert selector(obs, "chat-canary")["modeldeploy.dev/bundle"] == "none"  # kept, selecting no pod
    assert any(isinstance(a, Event) and a.reason == "Promoted" for a in acts)
    obj, obs, _ = advance_to(obj, obs, "2026-01-01T02:00:00Z")  # keepPrevious.seconds (3600) over
    assert [d["metadata"]["labels"]["modeldeploy.dev/bundle"] for d in obs.deployments] == [new]


def test_scale_during_a_canary_keeps_the_cohorts_ratio_and_status_replicas_follows_spec() -> None:
    """`kubectl scale md` / an HPA writes spec.replicas through the scale subresource: both cohorts
    scale, the canary's share of replicas holds, and status.replicas stays comparable with spec.replicas
    (the surge canary is not counted: an HPA at its target sees current == desired)."""
    obj, obs, old, _ = stable_then_change()
    obj["spec"]["replicas"] = 3
    obj, obs, _ = advance_to(obj, obs, at(0))
    obj, obs, _ = advance_to(obj, obs, at(0, 10))
    new = obj["status"]["canary"]["bundle"]
    obj, obs, _ = advance_to(obj, obs, at(0, 20), conformance=(True, "8/8 checks passed"))
    st = obj["status"]
    assert (st["phase"], st["canaryWeight"]) == ("Canary", 25) and sizes(obs) == {old: 3, new: 1}
    assert st["replicas"] == 3 and st["readyReplicas"] == 4
    obj = {**obj, "spec": {**obj["spec"], "replicas": 6}, "metadata": {**obj["metadata"], "generation": 3}}
    obj, obs, acts = advance_to(obj, obs, at(0, 25))
    assert sizes(obs) == {old: 6, new: 2}  # 1:3 before, 2:6 after: the ratio holds (25 % of the replicas)
    st = obj["status"]
    assert (st["phase"], st["currentStep"], st["replicas"]) == ("Canary", 0, 6)
    assert st["canary"]["replicas"] == 2 and st["stable"]["replicas"] == 6


def test_failed_analysis_rolls_back_and_holds_the_bundle() -> None:
    obj, obs, old, _ = stable_then_change()
    obj, obs, _ = advance_to(obj, obs, at(0))
    obj, obs, _ = advance_to(obj, obs, at(0, 10))
    obj, obs, _ = advance_to(obj, obs, at(0, 20), conformance=(True, "ok"))
    new = obj["status"]["canary"]["bundle"]
    obj, obs, acts = advance_to(
        obj, obs, at(0, 30), analysis=analysis("Fail", 0, 0.9), analysis_at=_epoch(at(0, 30))
    )
    assert obj["status"]["phase"] == "RollingBack" and obj["status"]["canaryWeight"] == 0
    fail = [a for a in acts if isinstance(a, Event) and a.reason == "AnalysisFailed"]
    assert fail and "ttft_p95_seconds canary=0.9 stable=0.1" in fail[0].message
    obj, obs, acts = advance_to(obj, obs, at(0, 31))
    st = obj["status"]
    assert (st["phase"], st["stable"]["bundle"], st["failedBundles"]) == ("Stable", old, [new])
    assert [d["metadata"]["labels"]["modeldeploy.dev/bundle"] for d in obs.deployments] == [old]
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Degraded"]["status"] == "True" and cond["Degraded"]["reason"] == "AnalysisFailed"
    obj, obs, acts = advance_to(obj, obs, at(5))
    obj, obs, acts = advance_to(obj, obs, at(6))
    assert not [a for a in acts if isinstance(a, Create)]  # same spec: never retried


def test_manual_abort_is_consumed_once() -> None:
    obj, obs, old, _ = stable_then_change()
    obj, obs, _ = advance_to(obj, obs, at(0), ready={})
    obj, obs, acts = advance_to(
        obj, obs, at(0, 5), ready={}, command="abort", command_annotations=("modeldeploy.dev/abort",)
    )
    assert obj["status"]["phase"] == "RollingBack"
    assert [a.annotations for a in acts if isinstance(a, Annotate)] == [{"modeldeploy.dev/abort": None}]


def test_deletion_plans_nothing_gc_owns_children() -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()))
    obj["metadata"]["deletionTimestamp"] = NOW
    assert plan(obj, obs, NOW) == []
    owner = obs.deployments[0]["metadata"]["ownerReferences"][0]
    assert owner["uid"] == "uid-1" and owner["controller"] is True and owner["blockOwnerDeletion"] is True


def test_stale_bundle_deployment_is_deleted() -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()))
    stray = copy.deepcopy(obs.deployments[0])
    stray["metadata"]["name"] = "chat-0000000000"
    stray["metadata"]["labels"]["modeldeploy.dev/bundle"] = "0000000000000000"
    obs.deployments.append(stray)
    assert ("delete", "Deployment", "chat-0000000000") in kinds(plan(obj, obs, NOW))


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(image="evil@sha256:" + "c" * 64),
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "X", "value": "1"}),
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["args"].__setitem__(1, "/elsewhere"),
        lambda d: d["spec"].update(replicas=7),
        lambda d: d["spec"]["template"]["spec"]["securityContext"].update(runAsNonRoot=False),
    ],
    ids=["image", "env-added", "args", "replicas", "security"],
)
def test_drift_on_child_deployment_is_reverted(edit) -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()))
    obj, obs = converge(obj, obs)
    edit(obs.deployments[0])
    acts = plan(obj, obs, NOW)
    [patch] = [a for a in acts if isinstance(a, Patch)]
    assert patch.kind == "Deployment" and any(
        isinstance(a, Event) and a.reason == "DriftReverted" for a in acts
    )
    obj, obs = converge(obj, obs)
    assert obs.deployments[0]["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert [a for a in plan(obj, obs, NOW) if not isinstance(a, PatchStatus)] == []


def test_service_selector_drift_is_reverted() -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()))
    svc = next(s for s in obs.services if s["metadata"]["name"] == "chat")
    svc["spec"]["selector"] = {"app": "other"}
    assert kinds(plan(obj, obs, NOW)) == [("patch", "Service", "chat")]


def test_defaults_added_by_api_server_are_not_drift() -> None:
    obj, obs = converge(
        md(resources={"requests": {"cpu": "1000m", "memory": "4Gi"}}), Observed(nodes=gpu_nodes())
    )
    obs.deployments[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
    assert kinds(plan(obj, obs, NOW)) == []


@pytest.mark.parametrize(
    ("topology", "nodes", "needle"),
    [
        ({"gpusPerReplica": 1, "gpuType": "NVIDIA-B300"}, gpu_nodes(), "nvidia.com/gpu.product=NVIDIA-B300"),
        (
            {"gpusPerReplica": 16, "tensorParallel": 8, "gpuType": "NVIDIA-H200"},
            gpu_nodes(),
            "gpusPerReplica: 16",
        ),
        ({"gpusPerReplica": 1, "tolerations": []}, gpu_nodes(), "nvidia.com/gpu=present:NoSchedule"),
        (
            {"gpusPerReplica": 1, "nodeSelector": {"zone": "b"}},
            gpu_nodes(),
            "nodeSelector: no node has label zone=b",
        ),
    ],
    ids=["gpu-type", "gpu-count", "taint", "node-selector"],
)
def test_unschedulable_topology_is_degraded_and_creates_no_pods(topology, nodes, needle) -> None:
    acts = plan(md(topology=topology), Observed(nodes=nodes), NOW)
    assert not any(isinstance(a, Create) and a.obj["kind"] == "Deployment" for a in acts)
    st = status_of(acts)
    deg = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert deg["status"] == "True" and deg["reason"] == "Unschedulable" and needle in deg["message"]
    assert st["phase"] == "Degraded"
    assert [a.reason for a in acts if isinstance(a, Event) and a.type == "Warning"] == ["Unschedulable"]


def test_unschedulable_new_bundle_keeps_stable_serving() -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()))
    obj, obs = converge(obj, obs)
    obj = copy.deepcopy(obj)
    obj["spec"]["topology"]["gpuType"] = "NVIDIA-B300"
    acts = plan(obj, obs, NOW)
    assert kinds(acts) == [] or all(k[0] == "patch" and k[1] == "Service" for k in kinds(acts))
    st = status_of(acts)
    assert (
        st["stable"]["readyReplicas"] == 2
        and {c["type"]: c["reason"] for c in st["conditions"]}["Degraded"] == "Unschedulable"
    )


def test_last_transition_time_kept_when_status_unchanged() -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()))
    first = {c["type"]: c["lastTransitionTime"] for c in obj["status"]["conditions"]}
    acts = plan(obj, obs, "2026-01-01T05:00:00Z")
    st = status_of(acts)  # ready count changed: Ready flips, the others keep their time
    times = {c["type"]: c["lastTransitionTime"] for c in st["conditions"]}
    assert times["Ready"] == "2026-01-01T05:00:00Z" and times["Degraded"] == first["Degraded"]


@pytest.mark.parametrize(
    ("rollout", "named"),
    [
        ({}, "rollout.conformanceGate"),
        ({"conformanceGate": False, "analysis": {"quality": {}}}, "rollout.analysis.quality"),
    ],
)
def test_a_keyed_spec_with_a_gate_needs_the_operators_gate_key(rollout: dict, named: str) -> None:
    """Without a gate key the gates could not ask a keyed pod: refused with the reason and the env
    that fixes it, no children touched. With one, the pods get its digest; with no gate, no key needed."""
    obj = md(rollout=rollout)
    obj["spec"]["bundle"]["config"]["apiKeySecretRef"] = {"name": "k", "key": "token"}
    acts = plan(obj, Observed(nodes=gpu_nodes()), NOW)
    assert kinds(acts) == []
    deg = next(c for c in status_of(acts)["conditions"] if c["type"] == "Degraded")
    assert (
        deg["reason"] == "NoGateKey" and named in deg["message"] and "MODELDEPLOY_GATE_KEY" in deg["message"]
    )
    assert any(isinstance(a, Event) and a.reason == "NoGateKey" for a in acts)

    acts = plan(obj, Observed(nodes=gpu_nodes(), gate_key_sha256="cd" * 32), NOW)
    (dep,) = [a.obj for a in acts if isinstance(a, Create) and a.obj["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MODELDEPLOY_GATE_KEY_SHA256"] == "cd" * 32

    ungated = md(rollout={"conformanceGate": False})
    ungated["spec"]["bundle"]["config"]["apiKeySecretRef"] = {"name": "k", "key": "token"}
    assert ("create", "Deployment") in [k[:2] for k in kinds(plan(ungated, Observed(nodes=gpu_nodes()), NOW))]


def test_invalid_spec_reports_degraded_without_children() -> None:
    bad = md()
    bad["spec"]["bundle"]["engine"]["image"] = "registry.local/modeldeploy:latest"
    acts = plan(bad, Observed(nodes=gpu_nodes()), NOW)
    assert kinds(acts) == []
    deg = next(c for c in status_of(acts)["conditions"] if c["type"] == "Degraded")
    assert deg["reason"] == "InvalidSpec" and "pinned by digest" in deg["message"]


def test_load_progress_counts_loading_pods() -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()), ready=0)
    bid = obj["status"]["stable"]["bundle"]
    obs.loading = {bid: [0.5, 0.25]}
    st = status_of(plan(obj, obs, NOW))
    assert st["stable"]["loadProgress"] == 0.375 and st["stable"]["readyReplicas"] == 0


def test_transient_node_taints_do_not_make_a_replica_impossible() -> None:
    nodes = [
        NodeInfo(
            "gpu-0",
            {"nvidia.com/gpu.product": "NVIDIA-H200"},
            8,
            (("nvidia.com/gpu", "present", "NoSchedule"), ("node.kubernetes.io/not-ready", "", "NoSchedule")),
        )
    ]
    acts = plan(md(), Observed(nodes=nodes), NOW)
    assert any(isinstance(a, Create) and a.obj["kind"] == "Deployment" for a in acts)


def test_runtime_load_failure_is_degraded_with_its_error() -> None:
    obj, obs = converge(md(), Observed(nodes=gpu_nodes()), ready=0)
    bid = obj["status"]["stable"]["bundle"]
    obs.load_errors = {
        bid: "DigestMismatch: digest mismatch for /models/model: expected sha256:bb.., got sha256:73.."
    }
    acts = plan(obj, obs, NOW)
    st = status_of(acts)
    deg = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert deg["status"] == "True" and deg["reason"] == "LoadFailed" and "DigestMismatch" in deg["message"]
    assert st["phase"] == "Degraded"
    assert [a.reason for a in acts if isinstance(a, Event) and a.type == "Warning"] == ["LoadFailed"]


def test_main_service_drops_the_bundle_pin_when_the_canary_joins() -> None:
    obj, obs, old, _ = stable_then_change()
    obj, obs, _ = advance_to(obj, obs, at(0))
    obj, obs, _ = advance_to(obj, obs, at(0, 10))
    for s in obs.services:  # what the API server holds after Verifying
        if s["metadata"]["name"] == "chat":
            s["spec"]["selector"]["modeldeploy.dev/bundle"] = old
    _, _, acts = advance_to(obj, obs, at(0, 20), conformance=(True, "ok"))
    drops = [
        a
        for a in acts
        if isinstance(a, Patch)
        and a.name == "chat"
        and a.body["spec"]["selector"].get("modeldeploy.dev/bundle", "") is None
    ]
    assert drops, acts


def test_every_fresh_analysis_is_an_event_with_its_figures() -> None:
    obj, obs, old, _ = stable_then_change()
    obj, obs, _ = advance_to(obj, obs, at(0))
    obj, obs, _ = advance_to(obj, obs, at(0, 10))
    obj, obs, _ = advance_to(obj, obs, at(0, 20), conformance=(True, "ok"))
    held = AnalysisResult(
        step=0,
        verdict="Inconclusive",
        message="pod 10.0.0.9 unreachable",
        metrics=[
            MetricVerdict(
                metric="ttft_p95_seconds",
                stable=0.1,
                canary=0.11,
                threshold=0.12,
                samples=3,
                verdict="Inconclusive",
            )
        ],
    )
    obj, obs, acts = advance_to(
        obj, obs, at(0, 25), analysis=held, analysis_at=_epoch(at(0, 25)), analysis_fresh=True
    )
    ev = [a for a in acts if isinstance(a, Event) and a.reason == "Analysis"]
    assert len(ev) == 1 and ev[0].type == "Normal" and obj["status"]["phase"] == "Canary"
    assert ev[0].message == (
        "step 1: Inconclusive (pod 10.0.0.9 unreachable): ttft_p95_seconds Inconclusive "
        "canary=0.11 stable=0.1 threshold=0.12 samples=3"
    )
    # the same result read back from status on the next reconcile is not a new analysis
    obj, obs, acts = advance_to(obj, obs, at(0, 26), analysis=held, analysis_at=_epoch(at(0, 25)))
    assert not [a for a in acts if isinstance(a, Event) and a.reason == "Analysis"]
    obj, obs, acts = advance_to(
        obj,
        obs,
        at(0, 30),
        analysis=analysis("Fail", 0, 0.9),
        analysis_at=_epoch(at(0, 30)),
        analysis_fresh=True,
    )
    assert [a.type for a in acts if isinstance(a, Event) and a.reason == "Analysis"] == ["Warning"]
    assert obj["status"]["phase"] == "RollingBack"


def test_pods_the_rollout_waits_on_are_deleted_off_a_lost_node_and_settled_ones_are_left() -> None:
    """The canary's pods while it moves, the stable's while rolling back, and any pod that never
    started: deleted once not Ready on a node marked lost, so their ReplicaSet places them now, not
    after the 300 s toleration. A settled pod that ran there is left to the eviction policy."""
    obj, obs, old, _ = stable_then_change()
    obj, obs, _ = advance_to(obj, obs, at(0), ready={})
    new = obj["status"]["canary"]["bundle"]
    lost = {new: [LostPod("c-1", "gpu-1", True)], old: [LostPod("s-1", "gpu-1", True)]}
    obj, obs, acts = advance_to(obj, obs, at(0, 5), ready={new: 0}, lost_pods=lost)
    assert obj["status"]["phase"] == "Deploying"
    assert [(a.kind, a.name) for a in acts if isinstance(a, Delete)] == [("Pod", "c-1")]
    (ev,) = [a for a in acts if isinstance(a, Event) and a.reason == "PodOnLostNode"]
    assert "c-1" in ev.message and "gpu-1" in ev.message and new in ev.message

    # rolling back: the stable's pods are the ones waited on (the restore), the canary's no longer
    x = Inputs.of(obj, ModelDeploymentSpec.model_validate(obj["spec"]), ModelDeploymentStatus(), obs, NOW)
    x.observed.lost_pods = lost
    back = RolloutState(phase="RollingBack", stable=old, canary=new, restore="StableFirst")
    assert [(a.kind, a.name) for a in plan_lost_pods(x, back) if isinstance(a, Delete)] == [("Pod", "s-1")]
    assert plan_lost_pods(x, RolloutState(phase="Stable", stable=old)) == []
    # settled, a pod that never started there (bound in the node's grace period) goes all the same
    x.observed.lost_pods = {old: [LostPod("s-1", "gpu-1", True), LostPod("s-2", "gpu-1", False)]}
    acts = plan_lost_pods(x, RolloutState(phase="Stable", stable=old))
    assert [(a.kind, a.name) for a in acts if isinstance(a, Delete)] == [("Pod", "s-2")]
    assert "never started there" in next(a.message for a in acts if isinstance(a, Event))

    settled, sobs = converge(md(), Observed(nodes=gpu_nodes()))
    settled, sobs = converge(settled, sobs)
    bid = settled["status"]["stable"]["bundle"]
    view = Observed(
        sobs.deployments, sobs.services, sobs.nodes, lost_pods={bid: [LostPod("s-1", "gpu-1", True)]}
    )
    assert not [a for a in plan(settled, view, NOW) if isinstance(a, Delete)]
