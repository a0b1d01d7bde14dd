"""Manifest builders: serve args, volumes per uri scheme, GPU placement, probes, restricted security."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.operator_fixtures import DIGEST, IMAGE, md
from support.pod_security import _restricted_violations

from modeldeploy.operator.api.v1alpha1.modeldeployment import ModelDeploymentSpec
from modeldeploy.operator.rollout import children
from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, bundle_id, canonical_json, deployment_name


def build(**spec):
    obj = md(**spec)
    s = ModelDeploymentSpec.model_validate(obj["spec"])
    bid = bundle_id(s.bundle)
    return bid, children.deployment(obj, s, bid, s.replicas)


def test_bundle_id_is_stable_under_defaults_and_changes_with_content() -> None:
    a = ModelDeploymentSpec.model_validate(md()["spec"]).bundle
    explicit = md()["spec"]
    explicit["bundle"]["config"]["dtype"] = "auto"  # a default written out is the same bundle
    b = ModelDeploymentSpec.model_validate(explicit).bundle
    changed = md()["spec"]
    changed["bundle"]["model"]["revision"] = "r2"
    c = ModelDeploymentSpec.model_validate(changed).bundle
    assert bundle_id(a) == bundle_id(b) != bundle_id(c) and len(bundle_id(a)) == 16


def test_deployment_runs_modeldeploy_serve_with_config_flags() -> None:
    bid, dep = build()
    assert dep["metadata"]["name"] == deployment_name("chat", bid) == f"chat-{bid[:10]}"
    for obj in (dep["metadata"], dep["spec"]["template"]["metadata"]):
        assert obj["labels"][BUNDLE_LABEL] == bid and obj["labels"]["app.kubernetes.io/instance"] == "chat"
        assert obj["labels"]["app.kubernetes.io/managed-by"] == "modeldeploy-operator"
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["modeldeploy", "serve"] and c["image"] == IMAGE
    args = dict(zip(c["args"][::2], c["args"][1::2], strict=False))
    assert args["--model"] == children.MODEL_DIR and args["--host"] == "0.0.0.0" and args["--port"] == "8000"
    assert args["--max-num-seqs"] == "8" and args["--bundle-id"] == bid and args["--model-digest"] == DIGEST
    assert args["--drain-timeout"] == "30" and "--api-key" not in c["args"]


def test_gpu_limits_selector_tolerations_shm() -> None:
    _, dep = build(
        topology={"gpusPerReplica": 2, "tensorParallel": 2, "gpuType": "NVIDIA-H200", "shmSize": "8Gi"}
    )
    pod = dep["spec"]["template"]["spec"]
    res = pod["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == "2" and res["requests"]["nvidia.com/gpu"] == "2"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_cpu_only_replica_requests_no_gpu() -> None:
    _, dep = build(topology={"gpusPerReplica": 0})
    assert "nvidia.com/gpu" not in dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_probes_sized_from_load_timeout_and_grace_covers_drain() -> None:
    _, dep = build(
        readiness={"loadTimeoutSeconds": 900},
        bundle={**md()["spec"]["bundle"], "config": {"drainTimeoutSeconds": 120}},
    )
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 900
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
    assert pod["terminationGracePeriodSeconds"] >= 120 + c["lifecycle"]["preStop"]["sleep"]["seconds"]


@pytest.mark.parametrize(
    ("uri", "kind", "init"),
    [("pvc://models/llama/v1", "persistentVolumeClaim", False),
     ("file:///srv/models/tiny", "hostPath", False),
     ("https://models.internal/tiny.tar", "emptyDir", True)],
)  # fmt: skip
def test_model_volume_per_scheme(uri: str, kind: str, init: bool) -> None:
    bundle = md()["spec"]["bundle"]
    bundle["model"]["uri"] = uri
    _, dep = build(bundle=bundle)
    pod = dep["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "model")
    assert kind in vol
    if kind == "persistentVolumeClaim":
        assert vol[kind]["claimName"] == "models"
        assert pod["containers"][0]["volumeMounts"][0]["subPath"] == "llama/v1"
    if kind == "hostPath":
        assert vol[kind]["path"] == "/srv/models/tiny"
    if init:
        [ic] = pod["initContainers"]
        assert ic["command"] == ["modeldeploy", "fetch"] and ic["args"] == [
            uri,
            children.MODEL_DIR,
            "--digest",
            DIGEST,
        ]
    else:
        assert "initContainers" not in pod


OCI = "oci://registry.local:5000/models/tiny@sha256:" + "c" * 64


@pytest.mark.parametrize(
    ("uri", "pull"),
    [("pvc://models/tiny", None), ("https://models.internal/tiny", None), (OCI, None),
     (OCI, "ImageVolume"), (OCI, "InitContainer")],
)  # fmt: skip
def test_pods_pass_pod_security_restricted(uri: str, pull: str | None) -> None:
    bundle = md()["spec"]["bundle"]
    bundle["model"]["uri"] = uri
    if pull:
        bundle["model"]["pullMethod"] = pull
    bundle["adapters"] = [{"name": "sql", "uri": OCI, "revision": "a1", "digest": DIGEST}]
    _, dep = build(bundle=bundle, imagePullSecrets=[{"name": "regcred"}])
    pod = dep["spec"]["template"]["spec"]
    assert _restricted_violations(pod) == []
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_restricted_checker_refuses_what_the_admission_plugin_refuses() -> None:
    """The checker can fail: a hostPath or gitRepo volume, a root user, an added capability."""
    _, dep = build()
    pod = dep["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "repo", "gitRepo": {"repository": "x"}})
    pod["containers"][0]["securityContext"]["runAsUser"] = 0
    pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    assert _restricted_violations(pod) == ["volume repo", "capabilities", "runAsUser"]


def test_oci_model_is_a_read_only_image_volume_pinned_by_digest() -> None:
    bundle = md()["spec"]["bundle"]
    bundle["model"]["uri"] = OCI
    _, dep = build(bundle=bundle)
    pod = dep["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "model")
    assert vol == {
        "name": "model",
        "image": {
            "reference": "registry.local:5000/models/tiny@sha256:" + "c" * 64,
            "pullPolicy": "IfNotPresent",
        },
    }
    assert pod["containers"][0]["volumeMounts"][0] == {
        "name": "model",
        "mountPath": children.MODEL_DIR,
        "readOnly": True,
    }
    assert "initContainers" not in pod and "imagePullSecrets" not in pod
    args = pod["containers"][0]["args"]
    assert args[args.index("--model-digest") + 1] == DIGEST  # the runtime still checks the files


def test_oci_init_container_fallback_fetches_with_the_pull_secret_as_docker_config() -> None:
    bundle = md()["spec"]["bundle"]
    bundle["model"] |= {"uri": OCI, "pullMethod": "InitContainer", "insecure": True}
    _, dep = build(bundle=bundle, imagePullSecrets=[{"name": "regcred"}, {"name": "other"}])
    pod = dep["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "model") == {"name": "model", "emptyDir": {}}
    [ic] = pod["initContainers"]
    assert ic["command"] == ["modeldeploy", "fetch"]
    assert ic["args"] == [OCI, children.MODEL_DIR, "--digest", DIGEST, "--insecure"]
    env = {e["name"]: e["value"] for e in ic["env"]}
    assert env["DOCKER_CONFIG"] == children.REGISTRY_CONFIG_DIR
    assert {"name": "registry-config", "mountPath": children.REGISTRY_CONFIG_DIR, "readOnly": True} in ic[
        "volumeMounts"
    ]
    secret = next(v for v in pod["volumes"] if v["name"] == "registry-config")["secret"]
    assert secret == {"secretName": "regcred", "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}
    serve = pod["containers"][0]
    assert all(m["name"] != "registry-config" for m in serve["volumeMounts"])  # credentials: init only


def test_oci_init_container_without_pull_secrets_mounts_no_credentials() -> None:
    bundle = md()["spec"]["bundle"]
    bundle["model"] |= {"uri": OCI, "pullMethod": "InitContainer"}
    _, dep = build(bundle=bundle)
    pod = dep["spec"]["template"]["spec"]
    [ic] = pod["initContainers"]
    assert ic["args"] == [OCI, children.MODEL_DIR, "--digest", DIGEST]
    assert "DOCKER_CONFIG" not in {e["name"] for e in ic["env"]}
    assert all(v["name"] != "registry-config" for v in pod["volumes"])


def test_oci_adapter_is_an_image_volume_at_its_adapter_path() -> None:
    bundle = md()["spec"]["bundle"]
    bundle["adapters"] = [{"name": "sql", "uri": OCI, "revision": "a1", "digest": DIGEST}]
    _, dep = build(bundle=bundle)
    pod = dep["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "adapter-0")
    assert vol["image"]["reference"].endswith("@sha256:" + "c" * 64)
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "adapter-0")
    assert mount == {"name": "adapter-0", "mountPath": f"{children.ADAPTERS_DIR}/sql", "readOnly": True}


def test_objects_without_oci_keep_their_bundle_id_and_pod_template() -> None:
    """The new optional fields default to unset: an existing object is not rolled by an operator upgrade."""
    obj = md()
    s = ModelDeploymentSpec.model_validate(obj["spec"])
    assert "pullMethod" not in canonical_json(s.bundle) and "insecure" not in canonical_json(s.bundle)
    assert "imagePullSecrets" not in children.pod_spec(s, bundle_id(s.bundle))


def test_file_uri_uses_hostpath_which_restricted_rejects() -> None:
    bundle = md()["spec"]["bundle"]
    bundle["model"]["uri"] = "file:///srv/tiny"
    _, dep = build(bundle=bundle)
    assert _restricted_violations(dep["spec"]["template"]["spec"]) == [
        "volume model"
    ]  # documented: dev clusters only


def test_api_key_comes_from_secret_env_not_args() -> None:
    bundle = md()["spec"]["bundle"]
    bundle["config"]["apiKeySecretRef"] = {"name": "chat-key", "key": "token"}
    _, dep = build(bundle=bundle, rollout={"conformanceGate": False})
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["MODELDEPLOY_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "chat-key", "key": "token"}
    assert "--api-key" not in c["args"]


def test_services_select_all_pods_and_each_cohort() -> None:
    obj = md()
    all_svc = children.service(obj, "", None)
    stable = children.service(obj, "stable", "abc")
    canary = children.service(obj, "canary", None)
    assert all_svc["metadata"]["name"] == "chat" and BUNDLE_LABEL not in all_svc["spec"]["selector"]
    assert stable["metadata"]["name"] == "chat-stable" and stable["spec"]["selector"][BUNDLE_LABEL] == "abc"
    assert canary["spec"]["selector"][BUNDLE_LABEL] == "none"  # no canary: selects no pod, never all pods


def test_import_operator_leaves_out_torch_transformers_engine() -> None:
    code = (
        "import sys, modeldeploy.operator, modeldeploy.operator.handlers, modeldeploy.operator.cli, "
        "modeldeploy.fetch\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') "
        "or m.startswith('modeldeploy.runtime')]\n"
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_otlp_endpoint_reaches_the_pods_and_leaves_the_bundle_alone() -> None:
    from pydantic import ValidationError

    plain = build()
    traced_md = md(observability={"otlpEndpoint": "http://otel-collector.monitoring:4318"})
    spec = ModelDeploymentSpec.model_validate(traced_md["spec"])
    assert bundle_id(spec.bundle) == bundle_id(ModelDeploymentSpec.model_validate(md()["spec"]).bundle)
    env = {e["name"]: e.get("value") for e in children.pod_spec(spec, "b")["containers"][0]["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4318"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in str(plain)  # unset: no export, the runtime builds no tracer
    with pytest.raises(ValidationError, match="otlp_endpoint|otlpEndpoint"):
        ModelDeploymentSpec.model_validate(md(observability={"otlpEndpoint": "otel-collector:4318"})["spec"])


def _serve(dep: dict) -> dict:
    return dep["spec"]["template"]["spec"]["containers"][0]


def _shm(dep: dict) -> tuple[dict, dict]:
    pod = dep["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "shm")
    mount = next(m for m in _serve(dep)["volumeMounts"] if m["name"] == "shm")
    return volume, mount


@pytest.mark.parametrize(("gpus", "tp"), [(2, 2), (4, 4), (8, 4)])
def test_tensor_parallel_reaches_the_serve_args(gpus: int, tp: int) -> None:
    _, dep = build(topology={"gpusPerReplica": gpus, "tensorParallel": tp})
    args = _serve(dep)["args"]
    i = args.index("--tensor-parallel-size")
    assert args[i + 1] == str(tp) and args.count("--tensor-parallel-size") == 1


def test_tensor_parallel_one_adds_no_flag_so_existing_pods_keep_their_template() -> None:
    _, dep = build(topology={"gpusPerReplica": 2, "tensorParallel": 1})
    assert "--tensor-parallel-size" not in _serve(dep)["args"]
    volume, _ = _shm(dep)
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}  # the value before TP existed


def test_tensor_parallel_on_cpu_ranks() -> None:
    bundle = md()["spec"]["bundle"]
    bundle["config"]["device"] = "cpu"
    _, dep = build(bundle=bundle, topology={"gpusPerReplica": 0, "tensorParallel": 2})
    c = _serve(dep)
    args = dict(zip(c["args"][::2], c["args"][1::2], strict=False))
    assert args["--tensor-parallel-size"] == "2" and args["--device"] == "cpu"
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert _shm(dep)[0]["emptyDir"]["sizeLimit"] == "2Gi"


@pytest.mark.parametrize(
    ("topology", "size"),
    [
        ({"gpusPerReplica": 2, "tensorParallel": 2}, "2Gi"),
        ({"gpusPerReplica": 8, "tensorParallel": 8}, "8Gi"),
        ({"gpusPerReplica": 8, "tensorParallel": 4}, "4Gi"),  # per rank, not per GPU
        ({"gpusPerReplica": 4, "tensorParallel": 4, "shmSize": "16Gi"}, "16Gi"),  # set wins
        ({"gpusPerReplica": 4, "tensorParallel": 4, "shmSize": "512Mi"}, "512Mi"),  # even when smaller
        ({"gpusPerReplica": 1, "shmSize": 2147483648}, "2147483648"),
    ],
)
def test_dev_shm_is_memory_backed_and_sized_per_rank(topology: dict, size: str) -> None:
    _, dep = build(topology=topology)
    volume, mount = _shm(dep)
    assert volume == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    assert mount == {"name": "shm", "mountPath": "/dev/shm"}  # writable, unlike the root filesystem


def test_bad_shm_size_is_rejected_by_the_api_types() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not a Kubernetes quantity"):
        build(topology={"gpusPerReplica": 1, "shmSize": "lots"})


def test_tensor_parallel_pod_stays_pod_security_restricted_with_a_read_only_root() -> None:
    _, dep = build(topology={"gpusPerReplica": 4, "tensorParallel": 4, "shmSize": "8Gi"})
    pod = dep["spec"]["template"]["spec"]
    assert _restricted_violations(pod) == []
    for c in pod["containers"] + pod.get("initContainers", []):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_tensor_parallel_flag_is_one_the_runtime_parses() -> None:
    import argparse

    pytest.importorskip("torch")
    from modeldeploy.runtime.server import cli

    p = argparse.ArgumentParser()
    cli.configure(p)
    if "--tensor-parallel-size" not in p._option_string_actions:
        pytest.skip("the runtime's serve parser has no --tensor-parallel-size yet")
    s = ModelDeploymentSpec.model_validate(md(topology={"gpusPerReplica": 2, "tensorParallel": 2})["spec"])
    cfg = cli.build_config(p.parse_args(children.serve_args(s, "bid0")))
    assert cfg.engine.tensor_parallel_size == 2


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_the_analysis_ttft_slo_is_the_runtimes_default_queue_budget() -> None:
    def args(config: dict | None = None, slo: dict | None = None) -> list[str]:
        obj = md()
        obj["spec"]["bundle"]["config"].update(config or {})
        if slo is not None:
            obj["spec"]["rollout"] = {"analysis": {"slo": slo}}
        return children.serve_args(ModelDeploymentSpec.model_validate(obj["spec"]), "bid0")

    assert _flag(args(), "--queue-budget") == "1"  # the default SLO: ttftSeconds 1.0
    assert _flag(args(slo={"ttftSeconds": 2.5}), "--queue-budget") == "2.5"
    assert _flag(args({"queueBudgetSeconds": 0.25}, slo={"ttftSeconds": 2.5}), "--queue-budget") == "0.25"
    assert "--queue-budget" not in args({"queueBudgetSeconds": 0})  # 0: no server budget, headers still apply
    assert (
        "--max-queued-tokens" not in args()
        and _flag(args({"maxQueuedTokens": 4096}), "--max-queued-tokens") == "4096"
    )
    # unset, the new fields leave the bundle id as it was; the SLO is not part of the bundle
    plain = ModelDeploymentSpec.model_validate(md()["spec"]).bundle
    assert "queueBudgetSeconds" not in canonical_json(plain) and "maxQueuedTokens" not in canonical_json(
        plain
    )
    _, slow_slo = build(rollout={"analysis": {"slo": {"ttftSeconds": 3}}})
    bid, default = build()
    assert slow_slo["metadata"]["labels"][BUNDLE_LABEL] == bid and slow_slo != default


def test_queue_budget_flags_are_ones_the_runtime_parses() -> None:
    import argparse

    pytest.importorskip("torch")
    from modeldeploy.runtime.server import cli

    p = argparse.ArgumentParser()
    cli.configure(p)
    obj = md()
    obj["spec"]["bundle"]["config"]["maxQueuedTokens"] = 512
    obj["spec"]["rollout"] = {"analysis": {"slo": {"ttftSeconds": 1.5}}}
    cfg = cli.build_config(
        p.parse_args(children.serve_args(ModelDeploymentSpec.model_validate(obj["spec"]), "b"))
    )
    assert cfg.queue_budget_s == 1.5 and cfg.max_queued_tokens == 512


def test_hf_overrides_reach_the_runtime_and_are_part_of_the_bundle() -> None:
    """bundle.config.hfOverrides is the config-regression knob a canary must be able to carry: it
    reaches `serve --hf-overrides` as the JSON object the runtime parses, and it changes the bundle
    id (a numerics change is a new bundle); unset, the bundle id is the one it always was."""
    import argparse

    obj = md()
    obj["spec"]["bundle"]["config"]["hfOverrides"] = {"rope_theta": 10000.0, "rms_norm_eps": 1e-3}
    s = ModelDeploymentSpec.model_validate(obj["spec"])
    plain = ModelDeploymentSpec.model_validate(md()["spec"])
    assert "hfOverrides" not in canonical_json(plain.bundle)
    assert bundle_id(s.bundle) != bundle_id(plain.bundle)
    args = children.serve_args(s, "b")
    assert _flag(args, "--hf-overrides") == '{"rms_norm_eps":0.001,"rope_theta":10000.0}'
    assert "--hf-overrides" not in children.serve_args(plain, "b")
    pytest.importorskip("torch")
    from modeldeploy.runtime.server import cli

    p = argparse.ArgumentParser()
    cli.configure(p)
    cfg = cli.build_config(p.parse_args(args))
    assert cfg.engine.hf_overrides == {"rope_theta": 10000.0, "rms_norm_eps": 1e-3}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"rope theta": 1}, "is not a config.json field name"), ({"a": "x" * 5000}, "at most 4096 bytes")],
)
def test_bad_hf_overrides_are_refused_naming_the_field(overrides: dict, message: str) -> None:
    from pydantic import ValidationError

    obj = md()
    obj["spec"]["bundle"]["config"]["hfOverrides"] = overrides
    with pytest.raises(ValidationError, match=message) as e:
        ModelDeploymentSpec.model_validate(obj["spec"])
    assert "hf_overrides" in str(e.value) or "hfOverrides" in str(e.value)


@pytest.mark.parametrize(
    "rollout", [{}, {"conformanceGate": True}, {"conformanceGate": False, "analysis": {"quality": {}}}]
)
def test_an_api_key_with_the_operators_gates_is_a_valid_spec(rollout: dict) -> None:
    """The gates authenticate with the operator's own token (controller/gatekey.py), so the API types
    accept the combination; an operator without a gate key refuses it in plan() (test_operator_plan)."""
    obj = md(rollout=rollout)
    obj["spec"]["bundle"]["config"]["apiKeySecretRef"] = {"name": "chat-key", "key": "token"}
    ModelDeploymentSpec.model_validate(obj["spec"])


def test_a_keyed_pod_gets_the_gate_tokens_digest_and_an_open_pod_does_not() -> None:
    digest = "ab" * 32
    keyed = md()
    keyed["spec"]["bundle"]["config"]["apiKeySecretRef"] = {"name": "chat-key", "key": "token"}
    for obj, want in ((keyed, digest), (md(), None)):
        s = ModelDeploymentSpec.model_validate(obj["spec"])
        dep = children.deployment(obj, s, bundle_id(s.bundle), 1, digest)
        env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert (env.get("MODELDEPLOY_GATE_KEY_SHA256") or {}).get("value") == want
