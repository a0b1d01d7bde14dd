"""Capacity on a full GPU cluster: Surge | Replace | Auto, minAvailable, rollback order.

Pure tables for the Replace step and the machine, then plan() on 2 nodes x 8 GPUs with 16 replicas x
1 GPU, the Deployments' Ready replicas simulated (a canary pod becomes Ready one reconcile after it
is asked for, a stable pod leaves at once), recording the minimum Ready replicas at every reconcile.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from support.operator_fixtures import gpu_nodes, md
from support.plan_driver import advance_to, analysis, at, converge, sizes

from modeldeploy.operator.controller.claims import claim_pending
from modeldeploy.operator.rollout.capacity import Have, replace_step
from modeldeploy.operator.rollout.machine import Policy, RolloutState, Signals, Step, advance
from modeldeploy.operator.rollout.plan import Event, Observed
from modeldeploy.operator.rollout.progression import epoch
from modeldeploy.operator.rollout.sizing import cohort_replicas
from modeldeploy.operator.rollout.topology import NodeInfo, gpu_requests, spare_fit

P = Policy(replicas=16, steps=(Step(25, 0), Step(50, 0)), capacity="Replace", min_available=12)


def test_replace_step_moves_within_min_available_one_batch_at_a_time() -> None:
    m = replace_step(16, 4, Have(16, 16), None, 12)
    assert (m.stable, m.canary, m.blocked) == (12, 4, None)
    # the stable Deployment's status still says 16 Ready: counted at most at its size, no second batch
    assert replace_step(16, 8, Have(12, 16), Have(4, 0), 12) == replace_step(
        16, 8, Have(12, 12), Have(4, 0), 12
    )
    assert replace_step(16, 8, Have(12, 12), Have(4, 0), 12).stable == 12  # canary loading: wait
    assert replace_step(16, 8, Have(12, 12), Have(4, 4), 12).stable == 8  # loaded: next batch
    assert replace_step(16, 8, Have(12, 12), Have(4, 2), 12).stable == 10  # partial: as far as allowed
    m = replace_step(16, 4, Have(16, 16), None, 16)
    assert (m.stable, m.canary) == (16, 0) and "minAvailable 16" in m.blocked
    assert replace_step(16, 4, Have(16, 10), None, 16).blocked is None  # pods in flight: not stuck yet
    assert replace_step(24, 6, Have(12, 12), Have(4, 4), 12).stable == 18  # spec.replicas grew: stable grows


def test_spare_fit_counts_allocatable_minus_requested_on_matching_nodes() -> None:
    from modeldeploy.operator.api.v1alpha1.topology import Topology

    topo = Topology(gpus_per_replica=1, gpu_type="NVIDIA-H200")
    full = [replace(n, requested=8) for n in gpu_nodes(2)]
    ok, why = spare_fit(topo, full, 16)
    assert not ok and "0 of 16 GPUs spare on 2 matching nodes" in why
    assert spare_fit(topo, gpu_nodes(4), 16)[0] and spare_fit(topo, [replace(full[0], requested=0)], 8)[0]
    two = Topology(gpus_per_replica=2, tensor_parallel=2, gpu_type="NVIDIA-H200")
    odd = [replace(n, requested=7) for n in gpu_nodes(2)]  # 1 spare GPU on each node: no whole 2-GPU replica
    assert not spare_fit(two, odd, 1)[0]
    assert spare_fit(Topology(gpus_per_replica=0), [], 5)[0]
    pods = [
        {"spec": {"nodeName": "gpu-0", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}},
        {"spec": {"nodeName": "gpu-0", "containers": [{"resources": {"requests": {"nvidia.com/gpu": 1}}}]}},
        {"spec": {"nodeName": "gpu-1", "containers": [{}]}, "status": {"phase": "Running"}},
        {
            "spec": {"nodeName": "gpu-1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": 4}}}]},
            "status": {"phase": "Succeeded"},
        },
        {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 4}}}]}},  # Pending, unbound
    ]
    assert gpu_requests(pods) == {"gpu-0": 3, "gpu-1": 0}
    node = {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    assert NodeInfo.from_node(node, 5).free_gpus == 3


def test_gpus_freed_for_a_pending_canary_are_not_spare() -> None:
    """The starvation the 100-rollout bench found: GPUs a Replace rollout freed for its own Pending
    canary pods looked spare to the next Auto decision, which chose Surge and took them."""
    from modeldeploy.operator.api.v1alpha1.topology import Topology

    topo = Topology(gpus_per_replica=1, gpu_type="NVIDIA-H200")
    freed = [replace(gpu_nodes(2)[0], requested=4), replace(gpu_nodes(2)[1], requested=8)]  # 4 spare GPUs
    gpu_pod = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    pending = [{"spec": {**gpu_pod, "containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]}}] * 4
    assert spare_fit(topo, freed, 4)[0]  # without the Pending pods: 4 fit
    claimed = claim_pending(freed, pending)
    ok, why = spare_fit(topo, claimed, 1)
    assert not ok and "0 of 16 GPUs spare" in why
    assert [n.requested for n in claimed] == [8, 8] and [n.name for n in claimed] == [n.name for n in freed]
    big = [{"spec": {**gpu_pod, "containers": [{"resources": {"limits": {"nvidia.com/gpu": 8}}}]}}]
    assert [n.requested for n in claim_pending(freed, big)] == [4, 8]  # fits nowhere whole: claims nothing
    assert claim_pending(freed, [{"spec": {"containers": [{}]}}]) == freed  # no GPUs asked
    # CI: unschedulable pods of another test, pinned elsewhere, made this pool look full
    pinned = [{"spec": {**p["spec"], "nodeSelector": {"pool": "other"}}} for p in pending]
    untolerated = [{"spec": {"containers": p["spec"]["containers"]}} for p in pending]
    assert claim_pending(freed, pinned) == freed and claim_pending(freed, untolerated) == freed


def test_a_pending_pod_claims_only_nodes_its_affinity_and_tolerations_allow() -> None:
    from modeldeploy.operator.controller.claims import schedulable

    node = replace(gpu_nodes(1)[0], labels={"pool": "a", "gen": "5"})
    tol = [{"key": "nvidia.com/gpu", "operator": "Exists"}]

    def aff(*exprs: dict, fields: tuple = ()) -> dict:
        term = {"matchExpressions": list(exprs), "matchFields": list(fields)}
        return {
            "tolerations": tol,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
        }

    assert schedulable({"tolerations": tol}, node) and not schedulable({}, node)  # the GPU taint
    assert schedulable(aff({"key": "pool", "operator": "In", "values": ["a", "b"]}), node)
    assert not schedulable(aff({"key": "pool", "operator": "NotIn", "values": ["a"]}), node)
    assert schedulable(
        aff({"key": "gen", "operator": "Gt", "values": ["4"]}, {"key": "x", "operator": "DoesNotExist"}), node
    )
    assert not schedulable(aff({"key": "gen", "operator": "Lt", "values": ["4"]}), node)
    assert not schedulable(
        aff(fields=({"key": "metadata.name", "operator": "In", "values": ["gpu-9"]},)), node
    )
    assert schedulable({"tolerations": [{"operator": "Exists"}]}, node)  # tolerates every taint


def test_auto_picks_replace_on_a_full_cluster_and_says_why() -> None:
    s = RolloutState(phase="Stable", stable="old", phase_since=0.0)
    auto = replace(P, capacity="Auto")
    t = advance(s, auto, Signals(desired="new", surge_fits=(False, "16 more replicas do not fit")), 1.0)
    assert (t.state.capacity, t.event[1]) == ("Replace", "NewBundle")
    assert "capacity Replace (Auto: 16 more replicas do not fit)" in t.event[2]
    t = advance(s, auto, Signals(desired="new", surge_fits=(True, "fit")), 1.0)
    assert t.state.capacity == "Surge" and "capacity Surge (Auto: fit)" in t.event[2]
    assert advance(s, auto, Signals(desired="new"), 1.0).state.capacity == "Surge"  # nodes unknown
    t = advance(s, replace(P, capacity="Surge"), Signals(desired="new", surge_fits=(False, "x")), 1.0)
    assert t.state.capacity_reason == "spec.rollout.capacity: Surge"


def test_replace_rollback_restores_stable_first_where_gpus_allow_else_reports_the_gap() -> None:
    canary = RolloutState(
        phase="Canary",
        stable="old",
        canary="bad",
        step=0,
        started_at=0.0,
        phase_since=0.0,
        capacity="Replace",
    )
    have = {"old": Have(12, 12), "bad": Have(4, 4)}
    # spare GPUs: stable back to 16 while the canary keeps its 4, then the canary goes
    t = advance(canary, P, Signals(desired="bad", command="abort", restore_fits=True, stable_ready=12), 5.0)
    assert (t.state.phase, t.state.restore) == ("RollingBack", "StableFirst")
    assert cohort_replicas(t.state, P, 5.0, have) == {"old": 16, "bad": 4}
    assert advance(t.state, P, Signals(desired="bad", stable_ready=14), 6.0).event is None
    done = advance(t.state, P, Signals(desired="bad", stable_ready=16), 7.0)
    assert done.state.phase == "Stable" and "capacity gap" not in done.event[2]
    assert cohort_replicas(done.state, P, 7.0, have) == {"old": 16}
    # a full cluster: the canary goes first and the gap is reported
    t = advance(canary, P, Signals(desired="bad", command="abort", restore_fits=False, stable_ready=12), 5.0)
    assert t.state.restore == "CanaryFirst" and cohort_replicas(t.state, P, 5.0, have) == {"old": 16}
    done = advance(t.state, P, Signals(desired="bad", stable_ready=12), 6.0)
    assert done.state.phase == "Stable" and "capacity gap: stable 12/16 Ready" in done.event[2]


def full_cluster(**rollout: Any) -> tuple[dict[str, Any], Observed, str]:
    """16 replicas x 1 GPU Stable on 2 nodes x 8 GPUs, every GPU requested; then a bundle change."""
    nodes = [replace(n, requested=8) for n in gpu_nodes(2)]
    obj, obs = converge(md(replicas=16), Observed(nodes=nodes))
    obj, obs = converge(obj, obs)
    old = obj["status"]["stable"]["bundle"]
    obj = copy.deepcopy(obj)
    obj["spec"]["bundle"]["config"]["maxNumSeqs"] = 4
    obj["spec"]["rollout"] = {
        "steps": [{"weight": 25, "pauseSeconds": 0}],
        "conformanceGate": False,
        **rollout,
    }
    obj["metadata"]["generation"] = 2
    return obj, obs, old


def run(obj: dict[str, Any], obs: Observed, reconciles: int, **signals: Any):
    """Reconcile `reconciles` times, 10 s apart: a stable pod is gone at once, a canary pod is Ready one
    reconcile after it was asked for. Returns the object, what exists, every Event, the minimum Ready."""
    events, lowest, asked = [], 10**6, {}
    for i in range(reconciles):
        ready = {}
        for d in obs.deployments:
            b = d["metadata"]["labels"]["modeldeploy.dev/bundle"]
            ready[b] = min(d["spec"]["replicas"], asked.get(b, d["status"]["readyReplicas"]))
        lowest = min(lowest, sum(ready.values()))
        sig = dict(signals)
        if obj.get("status", {}).get("phase") == "Canary":
            st = obj["status"]["currentStep"]
            sig |= {"analysis": analysis("Pass", st), "analysis_at": epoch(at(5 + i // 6, (i % 6) * 10))}
        obj, obs, acts = advance_to(obj, obs, at(5 + i // 6, (i % 6) * 10), ready=ready, **sig)
        asked = {
            d["metadata"]["labels"]["modeldeploy.dev/bundle"]: d["spec"]["replicas"] for d in obs.deployments
        }
        events += [a for a in acts if isinstance(a, Event)]
    return obj, obs, events, lowest


def test_full_cluster_rolls_out_in_replace_mode_never_below_min_available() -> None:
    obj, obs, old = full_cluster()
    obj, obs, events, lowest = run(obj, obs, 20)
    new = obj["status"]["stable"]["bundle"]
    assert new != old and obj["status"]["phase"] == "Stable", obj["status"]
    start = next(e for e in events if e.reason == "NewBundle")
    assert "capacity Replace (Auto: 16 more replicas x 1 nvidia.com/gpu do not fit" in start.message
    assert obj["status"]["rollout"]["capacity"] == "Replace"
    assert lowest >= 12  # minAvailable 75 % of 16
    assert sizes(obs) == {new: 16}  # no spare GPU for a warm prior: scaled to zero, said in status
    ro = obj["status"]["rollout"]
    assert ro["prior"] == "Cold" and "GPUs not spare" in ro["priorReason"]
    assert "previous" not in ro


def test_keep_prior_within_its_gpu_budget() -> None:
    from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
    from modeldeploy.operator.rollout.progression import policy

    spec = md(replicas=4, topology={"gpusPerReplica": 2, "tensorParallel": 2})["spec"]
    spec["rollout"] = {"keepPrior": {"replicas": 3, "maxGPUs": 4, "seconds": 60}}
    p = policy(ModelDeploymentSpec.model_validate(spec))
    assert (p.keep_previous_replicas, p.keep_previous_seconds, p.keep_gpus) == (2, 60, 4)
    spec["rollout"] = {"keepPrior": {"replicas": 3, "maxGPUs": 1}}
    assert policy(ModelDeploymentSpec.model_validate(spec)).keep_previous_replicas == 0
    spec["rollout"] = {"keepPrevious": {"replicas": 2, "seconds": 5}}  # the deprecated field still works
    p = policy(ModelDeploymentSpec.model_validate(spec))
    assert (p.keep_previous_replicas, p.keep_previous_seconds) == (2, 5)
    promoting = RolloutState(
        phase="Promoting", stable="old", canary="new", phase_since=0.0, capacity="Replace"
    )
    warm = replace(P, keep_previous_replicas=1, keep_gpus=1)
    t = advance(promoting, warm, Signals(desired="new", canary_ready=16, prior_fits=(True, "fit")), 5.0)
    assert (t.state.prior, t.state.previous) == ("Warm", "old") and "(maxGPUs 1)" in t.state.prior_reason
    assert cohort_replicas(t.state, warm, 6.0) == {"new": 16, "old": 1}
    t = advance(promoting, warm, Signals(desired="new", canary_ready=16, prior_fits=(False, "0 spare")), 5.0)
    assert (t.state.prior, t.state.previous) == ("Cold", None) and "GPUs not spare: 0 spare" in t.event[2]
    over = replace(warm, keep_previous_replicas=0)
    t = advance(promoting, over, Signals(desired="new", canary_ready=16), 5.0)
    assert t.state.prior == "Cold" and "no warm replicas within keepPrior (maxGPUs 1)" in t.state.prior_reason
    later = advance(
        replace(t.state, previous="old", previous_until=9.0, prior="Warm"), P, Signals(desired="new"), 10.0
    )
    assert later.state.prior == "Cold" and "warm time over" in later.state.prior_reason


def test_replace_waits_with_insufficient_capacity_instead_of_crossing_min_available() -> None:
    obj, obs, old = full_cluster(minAvailable=16)
    obj, obs, events, lowest = run(obj, obs, 4)
    assert lowest == 16 and sizes(obs)[old] == 16
    prog = next(c for c in obj["status"]["conditions"] if c["type"] == "Progressing")
    assert prog["reason"] == "InsufficientCapacity" and "minAvailable 16" in prog["message"]
    assert [e.reason for e in events].count("InsufficientCapacity") == 1  # once, not every reconcile


def test_spare_gpus_keep_surge() -> None:
    obj, obs, old = full_cluster()
    obs = Observed(
        obs.deployments, obs.services, gpu_nodes(4)[2:] + [replace(n, requested=8) for n in gpu_nodes(2)]
    )
    obj, obs, events, _ = run(obj, obs, 2)
    start = next(e for e in events if e.reason == "NewBundle")
    assert "capacity Surge (Auto: 16 more replicas" in start.message and "next to stable" in start.message
    assert sizes(obs)[old] == 16


def test_explicit_replace_with_min_available_zero_moves_the_whole_step_at_once() -> None:
    obj, obs, old = full_cluster(capacity="Replace", minAvailable=0)
    obj, obs, events, lowest = run(obj, obs, 1)
    new = obj["status"]["canary"]["bundle"]
    assert sizes(obs) == {old: 12, new: 4} and obj["status"]["replicas"] == 16  # 25 % of the slots
    assert "capacity Replace (spec.rollout.capacity: Replace)" in events[0].message


def test_capacity_decisions_are_recognised_in_the_status_a_plan_writes() -> None:
    from modeldeploy.operator.rollout.plan import PatchStatus, capacity_decided

    before = {"phase": "Stable", "rollout": {"reason": "Initial", "prior": "Cold"}}
    start = {"phase": "Deploying", "rollout": {"reason": "NewBundle", "startedAt": "t1", "prior": "Cold"}}
    assert capacity_decided(before, [PatchStatus(start)])  # a rollout begins: Auto's fit check ran
    assert capacity_decided(
        start, [PatchStatus(start | {"rollout": {**start["rollout"], "restore": "CanaryFirst"}})]
    )
    assert capacity_decided(start, [PatchStatus({"rollout": {"prior": "Warm"}})])  # promoted
    step = {"phase": "Canary", "rollout": {**start["rollout"], "reason": "AnalysisPassed"}}
    assert not capacity_decided(start, [PatchStatus(step)])  # a step: no fit decision
    assert not capacity_decided(start, []) and not capacity_decided(None, [Event("Normal", "X", "y")])


def test_a_first_deployment_asks_no_spare_fit(monkeypatch) -> None:
    """No canary can start before there is a stable: its spare_fit (every node, every pass) is skipped."""
    from modeldeploy.operator.rollout import plan as plan_module

    asked: list[int] = []
    real = plan_module.spare_fit
    monkeypatch.setattr(plan_module, "spare_fit", lambda *a, **k: asked.append(1) or real(*a, **k))
    obj, obs = converge(md(replicas=16), Observed(nodes=gpu_nodes(2)))
    assert obj["status"]["stable"]["bundle"] and not asked, obj["status"]
    obj, obs, old = full_cluster()
    run(obj, obs, 1)
    assert asked  # a bundle change of a stable object does ask
