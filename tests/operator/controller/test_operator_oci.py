"""oci:// models in the operator: the API's acceptance (pydantic and the CRD's CEL rule agree with
`parse_oci_uri`), the pre-pull phase of the rollout machine (Prefetching), and plan()'s pre-pull
Deployment, with no cluster."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from pydantic import ValidationError
from support.operator_fixtures import DIGEST, gpu_nodes, md
from support.pod_security import _restricted_violations

from modeldeploy.oci import OciRefError, parse_oci_uri
from modeldeploy.operator.api import crd
from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.controller.observe import LoadProbe
from modeldeploy.operator.rollout import children, prefetch, progression
from modeldeploy.operator.rollout.actions import Create, Delete, Event, Observed, Patch, PatchStatus
from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, deployment_name
from modeldeploy.operator.rollout.machine import (
    Policy,
    RolloutState,
    Signals,
    Step,
    advance,
)
from modeldeploy.operator.rollout.plan import plan
from modeldeploy.operator.rollout.progression import epoch
from modeldeploy.operator.rollout.sizing import capacity_wait, cohort_replicas

OCI = "oci://registry.local:5000/models/smollm2@sha256:" + "c" * 64
OCI2 = "oci://registry.local:5000/models/smollm2@sha256:" + "d" * 64


def oci_md(**spec: Any) -> dict[str, Any]:
    obj = md(**spec)
    obj["spec"]["bundle"]["model"]["uri"] = OCI
    return obj


# --- the API ----------------------------------------------------------------------------------------

URIS = [
    (OCI, True),
    ("oci://localhost/m@sha256:" + "0" * 64, True),
    ("oci://127.0.0.1:5000/a/b/c@sha256:" + "0" * 64, True),
    ("oci://registry.local:5000/models/smollm2:v1", False),  # a tag
    ("oci://registry.local:5000/models/smollm2:v1@sha256:" + "0" * 64, False),  # tag and digest
    ("oci://registry.local/Models/x@sha256:" + "0" * 64, False),  # upper-case repository
    ("oci://models/x@sha256:" + "0" * 64, False),  # no registry host
    ("oci://registry.local/x@sha256:" + "0" * 63, False),
]


def _cel_uri_rules() -> list[dict[str, str]]:
    model = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in ("bundle", "model", "uri"):
        model = model["properties"][part]
    return model["x-kubernetes-validations"]


@pytest.mark.parametrize(("uri", "ok"), URIS)
def test_oci_uri_accepted_exactly_when_pinned_by_digest(uri: str, ok: bool) -> None:
    obj = md()
    obj["spec"]["bundle"]["model"]["uri"] = uri
    if ok:
        assert ModelDeploymentSpec.model_validate(obj["spec"]).bundle.model.uri == uri
    else:
        with pytest.raises(ValidationError, match="pinned by digest"):
            ModelDeploymentSpec.model_validate(obj["spec"])
    # the CRD's CEL rule: its regex, with CEL's string escapes undone, accepts what the parser accepts
    [oci] = [r for r in _cel_uri_rules() if "oci://" in r["rule"] and "startsWith" in r["rule"]]
    assert "pinned by digest" in oci["message"] and "tags" in oci["message"]
    pattern = re.search(r"matches\('(.*)'\)", oci["rule"]).group(1).replace("\\\\", "\\")
    assert bool(re.match(pattern, uri)) is ok
    try:
        parse_oci_uri(uri)
        parsed = True
    except OciRefError:
        parsed = False
    assert parsed is ok


def test_oci_adapter_uri_refuses_a_tag() -> None:
    obj = md()
    obj["spec"]["bundle"]["adapters"] = [
        {"name": "sql", "uri": "oci://registry.local/a/sql:latest", "revision": "a", "digest": DIGEST}
    ]
    with pytest.raises(ValidationError, match=r"adapters\.0\.uri[\s\S]*pinned by digest"):
        ModelDeploymentSpec.model_validate(obj["spec"])


def test_pull_method_only_with_oci_and_a_closed_set() -> None:
    obj = md()
    obj["spec"]["bundle"]["model"]["pullMethod"] = "InitContainer"  # the fixture's model is pvc://
    with pytest.raises(ValidationError, match="only to oci://"):
        ModelDeploymentSpec.model_validate(obj["spec"])
    obj = oci_md()
    obj["spec"]["bundle"]["model"]["pullMethod"] = "Sidecar"
    with pytest.raises(ValidationError, match="pullMethod"):
        ModelDeploymentSpec.model_validate(obj["spec"])
    model = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    model = model["properties"]["bundle"]["properties"]["model"]
    assert model["properties"]["pullMethod"]["enum"] == ["ImageVolume", "InitContainer"]
    assert any("startsWith('oci://')" in r["rule"] for r in model["x-kubernetes-validations"])


@pytest.mark.parametrize(
    ("uri", "pull", "enabled", "on"),
    [(OCI, None, None, True), (OCI, "ImageVolume", None, True), (OCI, "InitContainer", None, False),
     ("pvc://models/tiny", None, None, False), ("pvc://models/tiny", None, True, True),
     (OCI, None, False, False)],
)  # fmt: skip
def test_prefetch_is_on_by_default_only_for_image_volumes(
    uri: str, pull: str | None, enabled: bool | None, on: bool
) -> None:
    obj = md()
    obj["spec"]["bundle"]["model"]["uri"] = uri
    if pull:
        obj["spec"]["bundle"]["model"]["pullMethod"] = pull
    if enabled is not None:
        obj["spec"]["rollout"] = {"prefetch": {"enabled": enabled, "timeoutSeconds": 120}}
    p = progression.policy(ModelDeploymentSpec.model_validate(obj["spec"]))
    assert p.prefetch is on
    assert p.prefetch_timeout_seconds == (120 if enabled is not None else 900)


# --- the machine ------------------------------------------------------------------------------------

P = Policy(
    replicas=4, steps=(Step(25, 60),), load_timeout_seconds=300, prefetch=True, prefetch_timeout_seconds=600
)
STABLE = RolloutState(phase="Stable", stable="old", phase_since=0.0)


def test_new_bundle_is_prefetched_before_its_canary_deployment_exists() -> None:
    t = advance(STABLE, P, Signals(desired="new"), 100.0)
    s = t.state
    assert (s.phase, s.canary, s.reason) == ("Prefetching", "new", "NewBundle")
    assert "pre-pulling the images of canary new" in s.message
    assert cohort_replicas(s, P, 100.0) == {"old": 4}  # no canary pods wait on a download
    assert capacity_wait(replace_capacity(s), P, {}) is None
    held = advance(s, P, Signals(desired="new", prefetch=(1, 2)), 200.0)
    assert held.event is None and held.state == s
    done = advance(s, P, Signals(desired="new", prefetch=(2, 2)), 250.0)
    assert (done.state.phase, done.state.reason, done.state.phase_since) == ("Deploying", "Prefetched", 250.0)
    assert done.event is not None and "pulled onto 2 nodes in 150s" in done.event[2]
    assert cohort_replicas(done.state, P, 250.0) == {"old": 4, "new": 2}
    # loadTimeoutSeconds counts from the end of the pre-pull, not from NewBundle
    assert advance(done.state, P, Signals(desired="new"), 250.0 + 299).state.phase == "Deploying"
    late = advance(done.state, P, Signals(desired="new"), 250.0 + 301).state
    assert (late.phase, late.reason) == ("RollingBack", "LoadTimeout")


def replace_capacity(s: RolloutState) -> RolloutState:
    return RolloutState(**{**s.__dict__, "capacity": "Replace"})


def test_prefetch_timeout_rolls_back_naming_it_and_the_figures() -> None:
    s = advance(STABLE, P, Signals(desired="new"), 0.0).state
    assert advance(s, P, Signals(desired="new", prefetch=(1, 3)), 600.0).state.phase == "Prefetching"
    t = advance(s, P, Signals(desired="new", prefetch=(1, 3)), 601.0)
    assert (t.state.phase, t.state.reason) == ("RollingBack", "PrefetchTimeout")
    assert t.event is not None and t.event[0] == "Warning"
    assert "images pulled on 1/3 nodes within prefetch.timeoutSeconds=600" in t.event[2]
    back = advance(t.state, P, Signals(desired="new"), 602.0).state
    assert (back.phase, back.stable, back.failed) == ("Stable", "old", ("new",))
    assert "PrefetchTimeout" in progression.FAILURE_REASONS


def test_a_pull_that_keeps_failing_rolls_back_at_once() -> None:
    s = advance(STABLE, P, Signals(desired="new"), 0.0).state
    why = "image registry.local/x@sha256:... cannot be pulled (ImagePullBackOff): not found"
    t = advance(s, P, Signals(desired="new", canary_failure=why, prefetch=(0, 2)), 5.0)
    assert (t.state.phase, t.state.reason) == ("RollingBack", "PrefetchFailed")
    assert why in t.state.message


def test_no_prefetch_policy_deploys_at_once_and_a_superseding_bundle_is_prefetched_too() -> None:
    plain = Policy(replicas=4, steps=(Step(25, 60),))
    assert advance(STABLE, plain, Signals(desired="new"), 0.0).state.phase == "Deploying"
    s = advance(STABLE, P, Signals(desired="new"), 0.0).state
    t = advance(s, P, Signals(desired="newer"), 10.0)
    assert (t.state.phase, t.state.canary, t.state.reason) == ("Prefetching", "newer", "Superseded")
    aborted = advance(s, P, Signals(desired="new", command="abort"), 10.0).state
    assert (aborted.phase, aborted.reason) == ("RollingBack", "Aborted")


# --- plan(): the pre-pull Deployment ----------------------------------------------------------------


def observed_of(obj: dict[str, Any], ready: int | None) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = "1"
    if obj["kind"] == "Deployment":
        n = obj["spec"]["replicas"]
        out["status"] = {"replicas": n, "readyReplicas": n if ready is None else ready}
    return out


def reconcile(
    obj: dict[str, Any], obs: Observed, now: str, ready: dict[str, int] | None = None
) -> tuple[dict[str, Any], Observed, list]:
    """One plan at `now`, applied; a Deployment reports `ready[name]` Ready pods (default: all)."""
    for d in obs.deployments:
        d["status"]["readyReplicas"] = (ready or {}).get(d["metadata"]["name"], d["spec"]["replicas"])
    acts = plan(obj, obs, now)
    deps = {d["metadata"]["name"]: d for d in obs.deployments}
    svcs = {s["metadata"]["name"]: s for s in obs.services}
    for a in acts:
        if isinstance(a, Create):
            kind = a.obj["kind"]
            if kind in ("Deployment", "Service"):
                (deps if kind == "Deployment" else svcs)[a.obj["metadata"]["name"]] = observed_of(a.obj, 0)
        elif isinstance(a, Delete) and a.kind in ("Deployment", "Service"):
            (deps if a.kind == "Deployment" else svcs).pop(a.name)
        elif isinstance(a, Patch) and a.kind == "Deployment":
            deps[a.name]["spec"].update(a.body["spec"])
        elif isinstance(a, PatchStatus):
            obj = {**obj, "status": a.status}
    return obj, Observed(list(deps.values()), list(svcs.values()), obs.nodes), acts


def at(minute: int, second: int = 0) -> str:
    return f"2026-01-01T00:{minute:02d}:{second:02d}Z"


def stable_oci() -> tuple[dict[str, Any], Observed]:
    obj, obs, _ = reconcile(oci_md(), Observed(nodes=gpu_nodes(3)), at(0))
    obj, obs, _ = reconcile(obj, obs, at(0, 10))
    assert obj["status"]["phase"] == "Stable"
    obj = copy.deepcopy(obj)
    obj["spec"]["bundle"]["model"] |= {"uri": OCI2, "revision": "r2"}
    obj["spec"]["rollout"] = {"prefetch": {"timeoutSeconds": 300}, "steps": [{"weight": 50}]}
    obj["metadata"]["generation"] = 2
    return obj, obs


def test_new_oci_bundle_is_pulled_onto_every_node_the_canary_may_use_then_deployed() -> None:
    obj, obs = stable_oci()
    old = obj["status"]["stable"]["bundle"]
    obj, obs, acts = reconcile(obj, obs, at(1))
    st = obj["status"]
    new = st["canary"]["bundle"]
    assert st["phase"] == "Prefetching" and new != old
    assert (st["rollout"]["prefetchNodes"], st["rollout"]["prefetchedNodes"]) == (3, 0)
    progressing = next(c for c in st["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "Prefetching" and "pulled on 0/3 nodes" in progressing["message"]
    serving = {d["metadata"]["labels"].get(BUNDLE_LABEL) for d in obs.deployments} - {None}
    assert serving == {old}  # no canary Deployment yet
    [pull] = [d for d in obs.deployments if prefetch.PREFETCH_LABEL in d["metadata"]["labels"]]
    assert pull["metadata"]["name"] == prefetch.name_of("chat", new) and pull["spec"]["replicas"] == 3
    pod = pull["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "model", "image": {"reference": OCI2.removeprefix("oci://"), "pullPolicy": "IfNotPresent"}}
    ]
    [c] = pod["containers"]
    assert c["image"] == obj["spec"]["bundle"]["engine"]["image"] and "resources" in c
    assert "nvidia.com/gpu" not in c["resources"]["requests"]  # a node with busy GPUs still pulls
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}  # where the canary may run
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"  # one pod per node
    assert _restricted_violations(pod) == []
    labels = pull["spec"]["template"]["metadata"]["labels"]
    assert BUNDLE_LABEL not in labels and labels["app.kubernetes.io/name"] != "modeldeploy-serve"
    for svc in obs.services:  # no Service selects a pre-pull pod
        assert not set(svc["spec"]["selector"].items()) <= set(labels.items())
    assert any(isinstance(a, Event) and a.reason == "NewBundle" for a in acts)

    # two of three nodes done: still Prefetching, status says so; an idempotent pass writes no object
    obj, obs, acts = reconcile(obj, obs, at(1, 30), ready={pull["metadata"]["name"]: 2})
    assert obj["status"]["phase"] == "Prefetching" and obj["status"]["rollout"]["prefetchedNodes"] == 2
    assert not [a for a in acts if isinstance(a, Create | Patch | Delete)]

    obj, obs, acts = reconcile(obj, obs, at(2))
    st = obj["status"]
    assert (st["phase"], st["rollout"]["reason"]) == ("Deploying", "Prefetched")
    assert "prefetchNodes" not in st["rollout"]
    assert st["rollout"]["phaseSince"] == at(2)  # loadTimeoutSeconds starts now
    assert any(isinstance(a, Create) and a.obj["metadata"]["labels"].get(BUNDLE_LABEL) == new for a in acts)
    assert any(isinstance(a, Delete) and a.name == pull["metadata"]["name"] for a in acts)
    assert {d["metadata"]["labels"].get(BUNDLE_LABEL) for d in obs.deployments} == {old, new}


def test_prefetch_timeout_through_plan_deletes_the_pull_and_leaves_the_object_degraded() -> None:
    obj, obs = stable_oci()
    obj, obs, _ = reconcile(obj, obs, at(1))
    name = next(
        d["metadata"]["name"] for d in obs.deployments if prefetch.PREFETCH_LABEL in d["metadata"]["labels"]
    )
    obj, obs, _ = reconcile(obj, obs, at(6), ready={name: 1})  # 300 s since 1:00: not over yet
    assert obj["status"]["phase"] == "Prefetching"
    obj, obs, acts = reconcile(obj, obs, at(6, 2), ready={name: 1})
    assert obj["status"]["phase"] == "RollingBack" and obj["status"]["rollout"]["reason"] == "PrefetchTimeout"
    assert any(isinstance(a, Delete) and a.name == name for a in acts)
    obj, obs, _ = reconcile(obj, obs, at(6, 10))
    st = obj["status"]
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert (st["phase"], degraded["status"], degraded["reason"]) == ("Stable", "True", "PrefetchTimeout")
    assert "1/3 nodes" in degraded["message"]
    assert not [d for d in obs.deployments if prefetch.PREFETCH_LABEL in d["metadata"]["labels"]]


def test_prefetch_pod_count_without_a_node_list_is_spec_replicas() -> None:
    spec = ModelDeploymentSpec.model_validate(oci_md(replicas=3)["spec"])
    assert prefetch.pods_wanted(spec, None) == 3
    assert prefetch.pods_wanted(spec, gpu_nodes(5)) == 5
    assert prefetch.pods_wanted(spec, gpu_nodes(2, product="NVIDIA-A100")) == 1  # none fit: Unschedulable


@pytest.mark.parametrize(
    "topology",
    [
        {"gpusPerReplica": 1, "gpuType": "NVIDIA-H200"},
        {"gpusPerReplica": 0, "nodeSelector": {"pool": "cpu"}, "tolerations": []},
        {
            "gpusPerReplica": 2,
            "tensorParallel": 2,
            "nodeSelector": {"zone": "a"},
            "tolerations": [{"key": "pool", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        },
    ],
)
def test_pre_pull_pods_are_placed_and_pull_exactly_as_the_serving_pods(topology: dict[str, Any]) -> None:
    """The pre-pull warms the canary's nodes only with the canary's nodeSelector and tolerations, and a
    private registry only with its imagePullSecrets: both builders share placement.py."""
    obj = oci_md(topology=topology, imagePullSecrets=[{"name": "registry"}])
    if not topology["gpusPerReplica"]:
        obj["spec"]["bundle"]["config"]["device"] = "cpu"
    spec = ModelDeploymentSpec.model_validate(obj["spec"])
    serve = children.deployment(obj, spec, "b" * 12, 2)["spec"]["template"]["spec"]
    pull = prefetch.deployment(obj, spec, "b" * 12, 2)["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "imagePullSecrets"):
        assert pull.get(key) == serve.get(key), key
    assert pull["imagePullSecrets"] == [{"name": "registry"}]
    assert pull["containers"][0]["securityContext"] == serve["containers"][0]["securityContext"]
    assert {k: v for k, v in serve["securityContext"].items() if k != "fsGroup"} == pull["securityContext"]


def test_a_pre_pull_pod_that_cannot_pull_is_filed_apart_from_the_bundle() -> None:
    pod = {
        "metadata": {"uid": "u1", "labels": {prefetch.PREFETCH_LABEL: "abc"}},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "prefetch",
                    "image": "registry.local/x",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
                }
            ],
        },
    }
    _, errors = LoadProbe(8000).probe(("ns", "chat"), [pod])
    assert errors == {
        prefetch.error_key("abc"): "image registry.local/x cannot be pulled (ImagePullBackOff): not found"
    }


def test_prefetch_failure_through_plan_rolls_back_with_prefetch_failed() -> None:
    obj, obs = stable_oci()
    obj, obs, _ = reconcile(obj, obs, at(1))
    new = obj["status"]["canary"]["bundle"]
    view = Observed(
        obs.deployments, obs.services, obs.nodes, load_errors={prefetch.error_key(new): "no such blob"}
    )
    acts = plan(obj, view, at(1, 20))
    st = next(a.status for a in acts if isinstance(a, PatchStatus))
    assert (st["phase"], st["rollout"]["reason"]) == ("RollingBack", "PrefetchFailed")
    assert epoch(st["rollout"]["phaseSince"]) == epoch(at(1, 20))


# --- what the pre-pull pods wait on; which pull failures end Prefetching at once ---------------------

BLOB = "sha256:" + "e" * 64
# containerd v2's words for a registry blob whose bytes were changed after push (same size, other hash),
# as kubelet passes them on: first ErrImagePull, then ImagePullBackOff carrying the last pull's error
DIGEST_MISMATCH = (
    f'rpc error: code = FailedPrecondition desc = failed to pull and unpack image "{OCI2[6:]}": '
    f'failed commit on ref "layer-{BLOB}": unexpected commit digest sha256:{"f" * 64}, expected {BLOB}: '
    "failed precondition"
)
REFUSED = (
    f'rpc error: code = Unavailable desc = failed to pull and unpack image "{OCI2[6:]}": failed to resolve '
    'reference: failed to do request: Head "https://registry.local:5000/v2/models/smollm2/manifests/x": '
    "dial tcp 10.0.0.9:5000: connect: connection refused"
)


def pull_pod(
    bid: str, node: str, reason: str | None, message: str = "", ready: bool = False
) -> dict[str, Any]:
    """A pre-pull pod as the API server returns it: Ready, or its container waiting on `reason`."""
    status: dict[str, Any] = {
        "phase": "Running" if ready else "Pending",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if reason == "Unschedulable":
        status["conditions"].append(
            {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        )
    elif reason is not None:
        waiting = {"reason": reason} | ({"message": message} if message else {})
        status["containerStatuses"] = [{"name": "prefetch", "image": "engine", "state": {"waiting": waiting}}]
    return {
        "metadata": {
            "name": f"pull-{node or 'x'}",
            "uid": f"u-{node}",
            "labels": {prefetch.PREFETCH_LABEL: bid},
        },
        "spec": {"nodeName": node} if node and reason != "Unschedulable" else {},
        "status": status,
    }


def test_waiting_reads_each_unready_pre_pull_pod_pull_errors_first() -> None:
    pods = [
        pull_pod("b1", "gpu-0", None, ready=True),  # pulled: not listed
        pull_pod("b1", "gpu-1", "ContainerCreating"),
        pull_pod("b1", "", "Unschedulable", "0/3 nodes are available: 3 Insufficient memory."),
        pull_pod("b1", "gpu-2", "ImagePullBackOff", f'Back-off pulling image "{OCI2[6:]}": ErrImagePull: x'),
        pull_pod("b2", "gpu-0", "ErrImagePull", DIGEST_MISMATCH),
        {"metadata": {"labels": {BUNDLE_LABEL: "b1"}}, "status": {}},  # a serving pod: not a pre-pull
    ]
    got = prefetch.waiting(pods)
    assert got["b1"] == [
        ("gpu-2", "ImagePullBackOff", f'Back-off pulling image "{OCI2[6:]}": ErrImagePull: x'),
        ("gpu-1", "ContainerCreating", ""),
        ("", "Unschedulable", "0/3 nodes are available: 3 Insufficient memory."),
    ]
    assert got["b2"] == [("gpu-0", "ErrImagePull", DIGEST_MISMATCH)]
    assert prefetch.summary(got["b1"]).startswith("waiting on gpu-2: ImagePullBackOff (Back-off pulling")
    assert "unscheduled: Unschedulable" in prefetch.summary(got["b1"])


@pytest.mark.parametrize(
    ("reason", "message", "ends"),
    [
        ("ErrImagePull", DIGEST_MISMATCH, True),  # a blob modified after push: never pulls
        ("ImagePullBackOff", f'Back-off pulling image "x": ErrImagePull: {DIGEST_MISMATCH}', True),
        ("ErrImagePull", "rpc error: code = NotFound desc = failed to resolve reference: not found", True),
        ("ErrImagePull", "failed to resolve reference: pull access denied, 401 Unauthorized", True),
        ("ImagePullBackOff", 'Back-off pulling image "x"', True),  # kubelet: the attempts keep failing
        ("InvalidImageName", "couldn't parse image name", True),
        ("ErrImagePull", REFUSED, False),  # the registry down for a while: a retry may pull
        ("ImagePullBackOff", f'Back-off pulling image "x": ErrImagePull: {REFUSED}', False),
        ("ErrImagePull", "unexpected status from HEAD request: 503 Service Unavailable", False),
        ("ErrImagePull", "failed to copy: read tcp 10.0.0.2:443: i/o timeout", False),
        ("ErrImagePull", "toomanyrequests: You have reached your pull rate limit", False),
    ],
)
def test_which_pull_failures_end_prefetching_at_once(reason: str, message: str, ends: bool) -> None:
    assert prefetch.terminal(reason, message) is ends
    got = prefetch.failure([("gpu-1", "ContainerCreating", ""), ("gpu-0", reason, message)])
    assert (got == f"node gpu-0: {reason}: {message}"[:1024]) if ends else got is None


def prefetching_oci() -> tuple[dict[str, Any], Observed, str]:
    obj, obs = stable_oci()
    obj, obs, _ = reconcile(obj, obs, at(1))
    assert obj["status"]["phase"] == "Prefetching"
    return obj, obs, obj["status"]["canary"]["bundle"]


def test_a_blob_modified_after_push_ends_prefetching_on_the_first_failed_pull_naming_node_and_cause() -> None:
    obj, obs, new = prefetching_oci()
    name = prefetch.name_of("chat", new)
    waits = {new: [("gpu-1", "ErrImagePull", DIGEST_MISMATCH), ("gpu-0", "ContainerCreating", "")]}
    view = Observed(obs.deployments, obs.services, obs.nodes, prefetch_waiting=waits)
    for d in view.deployments:
        d["status"]["readyReplicas"] = 1 if d["metadata"]["name"] == name else d["spec"]["replicas"]
    acts = plan(obj, view, at(1, 15))  # 15 s in: long before prefetch.timeoutSeconds=300
    st = next(a.status for a in acts if isinstance(a, PatchStatus))
    assert (st["phase"], st["rollout"]["reason"]) == ("RollingBack", "PrefetchFailed")
    assert f"rolling back {new}: node gpu-1: ErrImagePull: " in st["rollout"]["message"]
    assert "unexpected commit digest" in st["rollout"]["message"]
    assert any(isinstance(a, Event) and a.reason == "PrefetchFailed" and "gpu-1" in a.message for a in acts)
    assert any(isinstance(a, Delete) and a.name == name for a in acts)  # the pre-pull goes
    assert {d["metadata"]["labels"].get(BUNDLE_LABEL) for d in view.deployments} - {None} == {
        obj["status"]["stable"]["bundle"]
    }  # no canary Deployment was ever created: the stable cohort is untouched
    assert not [a for a in acts if isinstance(a, Create | Patch) and "prefetch" not in str(a)]
    obj = {**obj, "status": st}
    view = Observed([d for d in view.deployments if d["metadata"]["name"] != name], view.services, view.nodes)
    st = next(a.status for a in plan(obj, view, at(1, 20)) if isinstance(a, PatchStatus))
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert (st["phase"], st["failedBundles"], degraded["reason"]) == ("Stable", [new], "PrefetchFailed")
    assert (
        "node gpu-1: ErrImagePull" in degraded["message"]
        and "unexpected commit digest" in degraded["message"]
    )


def test_a_pull_the_network_may_cure_is_shown_and_held_until_the_timeout_names_it() -> None:
    obj, obs, new = prefetching_oci()
    backoff = f'Back-off pulling image "{OCI2[6:]}": ErrImagePull: {REFUSED}'
    waits = {new: [("gpu-2", "ImagePullBackOff", backoff), ("gpu-0", "ContainerCreating", "")]}
    filed = {prefetch.error_key(new): f"image engine cannot be pulled (ImagePullBackOff): {backoff}"}
    view = Observed(obs.deployments, obs.services, obs.nodes, load_errors=filed, prefetch_waiting=waits)
    name = prefetch.name_of("chat", new)
    obj, _, acts = reconcile(obj, view, at(2), ready={name: 1})
    st = obj["status"]
    assert st["phase"] == "Prefetching"  # not failed: a registry that refuses connections may come back
    assert st["rollout"]["prefetchWaiting"] == [
        {"node": "gpu-2", "reason": "ImagePullBackOff", "message": backoff},
        {"node": "gpu-0", "reason": "ContainerCreating", "message": ""},
    ]
    progressing = next(c for c in st["conditions"] if c["type"] == "Progressing")
    assert "pulled on 1/3 nodes; waiting on gpu-2: ImagePullBackOff" in progressing["message"]
    assert "connection refused" in progressing["message"]
    view = Observed(view.deployments, view.services, view.nodes, load_errors=filed, prefetch_waiting=waits)
    obj, _, acts = reconcile(obj, view, at(6, 2), ready={name: 1})  # 302 s: past timeoutSeconds=300
    st = obj["status"]
    assert (st["phase"], st["rollout"]["reason"]) == ("RollingBack", "PrefetchTimeout")
    assert (
        "1/3 nodes within prefetch.timeoutSeconds=300; waiting on gpu-2: ImagePullBackOff"
        in (st["rollout"]["message"])
    )
    assert "connection refused" in st["rollout"]["message"]
    assert "prefetchWaiting" not in st["rollout"]  # only while Prefetching


def test_prefetch_waiting_leaves_status_once_every_pod_pulled() -> None:
    obj, obs, new = prefetching_oci()
    view = Observed(
        obs.deployments, obs.services, obs.nodes, prefetch_waiting={new: [("gpu-0", "ContainerCreating", "")]}
    )
    obj, obs, _ = reconcile(obj, view, at(1, 30), ready={prefetch.name_of("chat", new): 2})
    assert obj["status"]["rollout"]["prefetchWaiting"] == [
        {"node": "gpu-0", "reason": "ContainerCreating", "message": ""}
    ]
    obj, obs, _ = reconcile(obj, obs, at(2))
    assert obj["status"]["phase"] == "Deploying" and "prefetchWaiting" not in obj["status"]["rollout"]


def test_the_prefetch_timeout_event_names_what_the_pods_still_wait_on() -> None:
    s = advance(STABLE, P, Signals(desired="new"), 0.0).state
    note = "waiting on gpu-1: ErrImagePull (dial tcp: i/o timeout)"
    t = advance(s, P, Signals(desired="new", prefetch=(2, 3), prefetch_waiting=note), 601.0)
    assert t.event is not None and t.event[1] == "PrefetchTimeout"
    assert t.event[2].endswith(f"prefetch.timeoutSeconds=600; {note}")


def test_observe_reads_what_the_pre_pull_pods_wait_on() -> None:
    """observe() lists the pods while a child is not Ready and files each pre-pull pod's waiting reason
    under its bundle: the plan reads nothing else of them."""
    from support.fake_kube import FakeKube

    from modeldeploy.operator.analysis.gate import ConformanceRunner
    from modeldeploy.operator.analysis.scrape import Baselines
    from modeldeploy.operator.controller.observe import NodeCache, Observer

    obj, _ = stable_oci()
    obj["metadata"]["uid"] = "uid-1"
    spec = ModelDeploymentSpec.model_validate(obj["spec"])
    kube = FakeKube()
    dep = prefetch.deployment(obj, spec, "b" * 12, 2) | {"status": {"replicas": 2, "readyReplicas": 1}}
    kube.put(dep)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    for node, reason in (("gpu-0", None), ("gpu-1", "ErrImagePull")):
        pod = pull_pod("b" * 12, node, reason, DIGEST_MISMATCH if reason else "", ready=reason is None)
        pod["metadata"] |= {"namespace": "ns", "labels": pod_labels}
        kube.put(pod | {"kind": "Pod"})
    hold = prefetch.hold_deployment(obj, spec, "c" * 12, ("engine", [("model", "r/m@sha256:00")]), 1)
    held = pull_pod("c" * 12, "gpu-0", None) | {"kind": "Pod"}  # Running, not Ready yet
    held["metadata"] |= {"namespace": "ns", "labels": hold["spec"]["template"]["metadata"]["labels"]}
    held["status"] |= {"phase": "Running", "podIP": "127.0.0.1"}
    kube.put(held)
    observed = Observer(kube, NodeCache(kube), LoadProbe(8000), ConformanceRunner(), Baselines()).observe(obj)
    assert observed.prefetch_waiting == {"b" * 12: [("gpu-1", "ErrImagePull", DIGEST_MISMATCH)]}
    assert observed.loading == {}  # a hold pod serves nothing: never asked for its load progress


# --- keepRollbackTarget: the rollback target's images kept in use -----------------------------------


def after_promotion(keep: bool | None, model: str = OCI) -> tuple[dict[str, Any], Observed, str, str]:
    """Stable on OCI2's bundle with OCI's (or `model`'s) in status.history and its Deployment still
    observed (a cold prior: this pass deletes it); keepRollbackTarget as given."""
    from modeldeploy.operator.rollout.bundle import bundle_id

    old = oci_md()
    old["spec"]["bundle"]["model"]["uri"] = model
    new = oci_md()
    new["spec"]["bundle"]["model"] |= {"uri": OCI2, "revision": "r2"}
    if keep is not None:
        new["spec"]["rollout"] = {"prefetch": {"keepRollbackTarget": keep}}
    old_spec, new_spec = (ModelDeploymentSpec.model_validate(o["spec"]) for o in (old, new))
    old_bid, new_bid = bundle_id(old_spec.bundle), bundle_id(new_spec.bundle)
    deps = [
        observed_of(children.deployment(old, old_spec, old_bid, 1), None),
        observed_of(children.deployment(new, new_spec, new_bid, 2), None),
    ]
    new["status"] = {
        "phase": "Stable",
        "observedGeneration": 1,
        "stable": {"bundle": new_bid},
        "history": [{"bundle": old_bid}],
        "rollout": {"reason": "Promoted"},
    }
    return new, Observed(deps, [], gpu_nodes(3)), old_bid, new_bid


def holds(obs: Observed) -> list[dict[str, Any]]:
    return [d for d in obs.deployments if prefetch.HOLD_LABEL in d["metadata"]["labels"]]


def test_the_rollback_targets_images_are_held_on_every_node_once_no_serving_pod_mounts_them() -> None:
    obj, obs, old, new = after_promotion(keep=True)
    obj, obs, acts = reconcile(obj, obs, at(5))
    gone = deployment_name("chat", old)
    assert any(isinstance(a, Delete) and a.name == gone for a in acts)  # the cold prior's Deployment goes
    [hold] = holds(obs)
    assert hold["metadata"]["name"] == prefetch.hold_name("chat", old) and hold["spec"]["replicas"] == 3
    pod = hold["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "model", "image": {"reference": OCI.removeprefix("oci://"), "pullPolicy": "IfNotPresent"}}
    ]  # the target's artifact, not the spec's
    assert pod["containers"][0]["image"] == obj["spec"]["bundle"]["engine"]["image"]
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["requests"]
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname" and _restricted_violations(pod) == []
    labels = hold["spec"]["template"]["metadata"]["labels"]
    assert BUNDLE_LABEL not in labels and prefetch.PREFETCH_LABEL not in labels  # no Service, no pre-pull
    assert {d["metadata"]["labels"].get(BUNDLE_LABEL) for d in obs.deployments} - {None} == {new}
    # its own template is the record now: an idempotent pass writes nothing, a node more resizes it
    name = hold["metadata"]["name"]

    def writes(acts: list) -> list:
        mine = [a for a in acts if isinstance(a, Patch | Delete) and a.name == name]
        return mine + [
            a for a in acts if isinstance(a, Create) and prefetch.HOLD_LABEL in a.obj["metadata"]["labels"]
        ]

    obj, obs, acts = reconcile(obj, obs, at(6))
    assert not writes(acts)
    obj, obs, acts = reconcile(obj, Observed(obs.deployments, obs.services, gpu_nodes(5)), at(7))
    [patch] = writes(acts)
    assert isinstance(patch, Patch) and holds(obs)[0]["spec"]["replicas"] == 5
    assert holds(obs)[0]["spec"]["template"] == hold["spec"]["template"]


def test_a_new_target_or_turning_it_off_drops_the_hold() -> None:
    obj, obs, old, new = after_promotion(keep=True)
    obj, obs, _ = reconcile(obj, obs, at(5))
    assert len(holds(obs)) == 1
    moved = copy.deepcopy(obj)
    moved["status"]["history"].append({"bundle": "f" * 16})  # a later promotion: another target
    _, after, acts = reconcile(moved, obs, at(6))
    assert not holds(after)  # nothing to build the new target's hold from (its Deployment is gone)
    assert any(isinstance(a, Event) and "no longer the rollback target" in a.message for a in acts)
    off = copy.deepcopy(obj)
    off["spec"]["rollout"]["prefetch"]["keepRollbackTarget"] = False
    _, after, _ = reconcile(off, obs, at(6))
    assert not holds(after)


@pytest.mark.parametrize(("keep", "model"), [(None, OCI), (True, "pvc://models/tiny-llama")])
def test_no_hold_by_default_nor_for_files_outside_the_image_store(keep: bool | None, model: str) -> None:
    obj, obs, _, _ = after_promotion(keep=keep, model=model)
    obj, obs, _ = reconcile(obj, obs, at(5))
    assert not holds(obs)
