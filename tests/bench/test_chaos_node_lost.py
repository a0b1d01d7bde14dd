"""The node-lost chaos case's pure parts (bench/chaos.py, modeldeploy_dev.faults): the spare node's
network never collides with the host's, the case waits for every canary pod to be bound before the
fault, and the verdict counts the lost canary pods' failures apart from the stable cohort's."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from modeldeploy_dev.faults import SPARE_CIDRS, spare_network

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("chaos", ROOT / "bench/chaos.py")
assert _spec is not None and _spec.loader is not None
chaos = importlib.util.module_from_spec(_spec)
sys.modules["chaos"] = chaos  # its dataclasses look their module up while the class is built
_spec.loader.exec_module(chaos)


def test_spare_network_on_a_clean_host() -> None:
    assert spare_network(["lo", "eth0", "mdbr0"], ["127.0.0.1/8", "10.244.0.1/24"]) == (
        "mdlost0",
        "10.244.150.0/24",
    )


def test_spare_network_skips_a_taken_bridge_and_an_overlapping_cidr() -> None:
    # mdlost0 exists (another run's), and some interface already holds an address in 10.244.151.0/24
    assert spare_network(["mdlost0"], ["10.244.151.7/24"]) == ("mdlost2", "10.244.152.0/24")


def test_spare_network_refuses_when_a_wide_route_covers_every_candidate() -> None:
    with pytest.raises(RuntimeError, match="no free bridge"):
        spare_network([], ["10.244.0.1/16"])
    assert len(SPARE_CIDRS) == 10


def _pod(name: str, node: str | None, deleting: bool = False) -> NS:
    return NS(metadata=NS(name=name, deletion_timestamp="now" if deleting else None), spec=NS(node_name=node))


def _cluster(replicas: int, pods: list[NS]) -> NS:
    return NS(
        apps=NS(
            list_namespaced_deployment=lambda ns, label_selector: NS(items=[NS(spec=NS(replicas=replicas))])
        ),
        core=NS(list_namespaced_pod=lambda ns, label_selector: NS(items=pods)),
    )


def test_canary_placed_waits_until_every_canary_pod_is_bound() -> None:
    assert chaos.canary_placed(_cluster(2, [_pod("c-1", "proc-1")]), "ns", "b") is None  # one not created
    assert chaos.canary_placed(_cluster(2, [_pod("c-1", "proc-1"), _pod("c-2", None)]), "ns", "b") is None
    placed = chaos.canary_placed(_cluster(2, [_pod("c-1", "proc-1"), _pod("c-2", "proc-1")]), "ns", "b")
    assert placed == {"c-1": "proc-1", "c-2": "proc-1"}
    # a pod already being deleted is not the canary's (the Deployment is replacing it)
    gone = [_pod("c-1", "proc-1"), _pod("c-0", "proc-1", deleting=True), _pod("c-2", "proc-1")]
    assert chaos.canary_placed(_cluster(2, gone), "ns", "b") == {"c-1": "proc-1", "c-2": "proc-1"}


def _judge(by_ip: dict[str, Counter], reasons: list[str]) -> chaos.Outcome:
    out = chaos.Outcome("node-lost", "Promoted")
    events = [
        NS(involved_object=NS(name=chaos.NAME), metadata=NS(creation_timestamp=i), reason=r, message="")
        for i, r in enumerate(reasons)
    ]
    cluster = NS(core=NS(list_namespaced_event=lambda ns: NS(items=events)))
    done = {"status": {"phase": "Stable", "stable": {"bundle": "new"}, "rollout": {"reason": "Promoted"}}}
    load = NS(by_ip=lambda: by_ip, api_errors=Counter(), max_requests=50_000)
    stable = {"s-1": "10.244.0.2", "s-2": "10.244.0.3"}
    chaos.judge(out, cluster, "ns", done, "old", stable, None, load, {"10.244.150.2"})
    return out


POSTED = ["NewBundle", "CanaryReady", "ConformancePassed", "Promoted"]


def test_judge_counts_the_lost_canary_failures_apart() -> None:
    by_ip = {
        "10.244.0.2": Counter({200: 50}),
        "10.244.0.3": Counter({200: 48}),
        "10.244.150.2": Counter({200: 9, 0: 4}),  # refused / unreachable once the node lost power
    }
    out = _judge(by_ip, POSTED)
    assert (out.stable_failed, out.lost_canary_failed, out.requests) == (0, 4, 111)
    assert out.passed
    assert "0 of 111 (+4 on the lost canary pods)" in chaos.table([out])


def test_judge_fails_on_a_stable_failure_or_a_decision_posted_twice() -> None:
    by_ip = {"10.244.0.2": Counter({200: 50, 503: 1}), "10.244.150.2": Counter({0: 4})}
    assert not _judge(by_ip, POSTED).passed
    twice = _judge({"10.244.0.2": Counter({200: 5})}, [*POSTED, "Promoted"])
    assert twice.decisions["Promoted"] == 2 and not twice.passed


def test_cli_knows_node_lost() -> None:
    assert "node-lost" in chaos.CASES
    with pytest.raises(SystemExit):
        chaos.main(["--cases", "node-gone"])


def test_a_spare_node_never_started_removes_nothing(tmp_path: Path) -> None:
    """A case that failed before its agent started (e.g. a `proc-1` of another run exists) must not
    delete that other run's Node or pods."""
    from modeldeploy_dev.faults import SpareNode

    def forbidden(*a: object, **k: object) -> None:
        raise AssertionError("touched the API")

    core = NS(delete_node=forbidden, list_pod_for_all_namespaces=forbidden, delete_namespaced_pod=forbidden)
    SpareNode(NS(core=core, kubeconfig="x"), tmp_path).remove()  # type: ignore[arg-type]


def test_a_cohort_without_ready_pods_says_so_in_the_analysis() -> None:
    """Found by the node-lost case: once the node controller marked the lost canary pods unready, the
    pod scrape read no canary pod, the analysis was Inconclusive and the step held for minutes while
    status.lastAnalysis.message was empty. It names the cohort now."""
    from modeldeploy.operator.analysis.scrape import Baselines, CohortScrape, PodScrape
    from modeldeploy.operator.analysis.sources import analyze_interval
    from modeldeploy.operator.analysis.window import AnalysisWindow
    from modeldeploy.operator.api.v1alpha1.analysis import Analysis

    assert CohortScrape("c").problems() == "bundle c: no Ready pods to scrape"
    window = AnalysisWindow("uid", "ns", "s", "c", stable_pods=(), canary_pods=(), mark=("c", 0, "t"))
    source = PodScrape(Baselines())
    for _ in range(2):  # the window's opening read, then one that would count
        result, problems = analyze_interval(source, window, Analysis(), step=0, time="t")
        assert result.verdict == "Inconclusive"
        assert "bundle c: no Ready pods to scrape" in problems


def test_the_partition_cases_are_known_and_operator_one_must_roll_back_as_inconclusive() -> None:
    assert {"partition-prometheus", "partition-operator", "node-lost-rollback"} <= set(chaos.CASES)
    assert "partition-operator" in chaos.ROLLBACK and "partition-prometheus" not in chaos.ROLLBACK
    events = [
        NS(involved_object=NS(name=chaos.NAME), metadata=NS(creation_timestamp=i), reason=r, message="")
        for i, r in enumerate(["NewBundle", "CanaryReady", "ConformancePassed", "RolledBack"])
    ]
    cluster = NS(core=NS(list_namespaced_event=lambda ns: NS(items=events)))
    load = NS(by_ip=lambda: {"10.244.0.2": Counter({200: 20})}, api_errors=Counter(), max_requests=50_000)
    for reason, passed in (("AnalysisInconclusive", True), ("AnalysisFailed", False)):
        out = chaos.Outcome("partition-operator", "RolledBack")
        done = {
            "status": {
                "phase": "Stable",
                "stable": {"bundle": "old"},
                "failedBundles": [{"bundle": "new"}],
                "rollout": {"reason": reason},
            }
        }
        chaos.judge(out, cluster, "ns", done, "old", {"s-1": "10.244.0.2"}, None, load)
        assert out.passed is passed, reason


def test_unknown_cases_are_refused_and_a_spec_points_at_the_runtime_image_on_the_real_node() -> None:
    with pytest.raises(SystemExit):
        chaos.main(["--node", "real", "--cases", "apiserver,node-gone"])
    from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
    from modeldeploy_dev.rollout_scenario import tiny_spec

    image = "127.0.0.1:5000/modeldeploy/runtime@sha256:" + "a" * 64
    obj = tiny_spec("chaos", "sha256:" + "b" * 64)
    chaos.Node().spec(obj)  # the process node: unchanged
    assert obj["spec"]["topology"]["nodeSelector"] == {"modeldeploy.dev/node-kind": "process"}
    chaos.Node("real", image).spec(obj)
    spec = ModelDeploymentSpec.model_validate(obj["spec"])  # still a valid spec
    assert spec.bundle.engine.image == image and obj["spec"]["topology"]["gpusPerReplica"] == 0
    assert obj["spec"]["topology"]["nodeSelector"] == {"modeldeploy.dev/node-kind": "real"}
    assert obj["spec"]["resources"]["limits"]["memory"] == "3Gi"  # the example's, not the process node's 1Gi
    assert "(real node)" in chaos.table([chaos.Outcome("stable-pod", "Promoted", "real")])


def test_kill_pod_process_knows_the_process_and_the_real_node_and_refuses_anything_else() -> None:
    from modeldeploy_dev import faults

    def cluster(container_id: str, real: bool) -> NS:
        status = NS(container_statuses=[NS(container_id=container_id)])
        core = NS(read_namespaced_pod=lambda pod, ns: NS(status=status))
        return NS(core=core, local=NS(s=NS(real_node=real)))

    with pytest.raises(ValueError, match="no running container"):
        faults.kill_pod_process(cluster("docker://abc", True), "ns", "p")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no running container"):  # a real-node ID on a cluster without one
        faults.kill_pod_process(cluster("containerd://abc", False), "ns", "p")  # type: ignore[arg-type]


def test_models_pv_is_a_host_path_on_the_process_node_and_local_on_a_real_one(tmp_path: Path) -> None:
    from modeldeploy_dev.rollout_scenario import models_pv

    made: list[dict] = []
    core = NS(
        create_persistent_volume=made.append,
        create_namespaced_persistent_volume_claim=lambda ns, body: made.append(body),
    )
    models_pv(core, "ns", tmp_path)
    models_pv(core, "ns", tmp_path, node="real-0")
    host, local = made[0]["spec"], made[2]["spec"]
    assert host["hostPath"]["path"] == str(tmp_path) and "local" not in host
    assert local["local"]["path"] == str(tmp_path) and "hostPath" not in local
    (term,) = local["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["real-0"]
    assert made[1]["spec"]["volumeName"] == made[3]["spec"]["volumeName"] == "ns-models"
    models_pv(core, "ns", tmp_path, node=("real-0", "real-1"))  # two real nodes of one machine's disk
    (term,) = made[4]["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["real-0", "real-1"]


def test_a_partitioned_node_loses_its_agent_only_and_a_lost_one_its_pods_too(tmp_path: Path) -> None:
    """node-partition: the agent SIGKILLed, the pod processes (their own process groups, recorded
    under <state>/pods) still running; node-lost: those killed as well. Real processes, no cluster."""
    import subprocess

    from modeldeploy_dev.faults import SpareNode
    from modeldeploy_dev.procnode.pids import alive, proc_start_time

    assert "node-partition" in chaos.CASES
    for pods_too in (False, True):
        state = tmp_path / f"state-{pods_too}"
        (state / "pods" / "p").mkdir(parents=True)
        pod = subprocess.Popen(["sleep", "60"], start_new_session=True)
        agent = subprocess.Popen(["sleep", "60"], start_new_session=True)
        try:
            (state / "pods" / "p" / "c.pid").write_text(f"{pod.pid} {proc_start_time(pod.pid)}")
            node = SpareNode.__new__(SpareNode)  # no cluster: lose() touches processes only
            node.state, node.proc, node.lost = state, agent, False
            node.bridge, node.cidr = "mdlost-none", "10.244.159.0/24"
            node.lose(pods=pods_too)
            assert agent.poll() is not None and node.lost
            pod_alive = pod.poll() is None and alive(pod.pid)
            assert pod_alive is not pods_too, (pods_too, pod.poll())
        finally:
            for p in (pod, agent):
                if p.poll() is None:
                    p.kill()
                p.wait(10)


def test_node_lost_replace_passes_only_once_stable_is_back_to_full_size() -> None:
    """Under Replace the rollback must grow stable back (its new pod's requests count as stable)."""
    assert "node-lost-replace" in chaos.ROLLBACK
    reasons = ["NewBundle", "CanaryReady", "ConformancePassed", "RolledBack"]
    events = [
        NS(involved_object=NS(name=chaos.NAME), metadata=NS(creation_timestamp=i), reason=r, message="")
        for i, r in enumerate(reasons)
    ]
    cluster = NS(core=NS(list_namespaced_event=lambda ns: NS(items=events)))
    done = {
        "status": {
            "phase": "Stable",
            "stable": {"bundle": "old"},
            "failedBundles": ["new"],
            "rollout": {"reason": "AnalysisInconclusive"},
        }
    }
    stable = {"s-1": "10.244.0.2", "s-3": "10.244.0.4"}  # s-3: the pod the rollback brought back
    for marks, restored_fail, passed in (
        ({}, 0, False),
        ({"stable restored": 70.0}, 0, True),
        ({"stable restored": 70.0}, 1, False),
    ):
        load = NS(
            by_ip=lambda f=restored_fail: {
                "10.244.0.2": Counter({200: 40}),
                "10.244.0.4": Counter({200: 5, 503: f}),
                "10.244.150.2": Counter({0: 3}),
            },
            api_errors=Counter(),
            max_requests=50_000,
        )
        out = chaos.Outcome("node-lost-replace", "RolledBack", timeline=dict(marks))
        chaos.judge(out, cluster, "ns", done, "old", stable, None, load, {"10.244.150.2"})
        assert (out.passed, out.stable_failed, out.lost_canary_failed) == (passed, restored_fail, 3), out
