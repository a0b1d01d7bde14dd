"""Manifest builders for the objects a ModelDeployment owns: pure functions, no I/O.

One Deployment per live bundle runs `modeldeploy serve`; Services `<name>` (all serving
pods), `<name>-stable` and `<name>-canary` (one cohort each, from the first canary on;
plan_services says why) select by labels.
Pods pass Pod Security `restricted` except for file:// models, which need a hostPath
volume and are therefore for development clusters only (documented on the field). An oci://
model is an image volume (`volumes[].image`), which `restricted` allows since Kubernetes v1.33
(kubernetes/kubernetes#130394), or, with pullMethod InitContainer, an emptyDir that
`modeldeploy fetch oci://...` fills.
Every pod mounts a memory-backed emptyDir at /dev/shm (allowed under `restricted`; the root
filesystem stays read-only): sizeLimit topology.shmSize, else 1Gi per tensor-parallel rank.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import urlparse

from modeldeploy.oci import parse_oci_uri
from modeldeploy.operator.api.v1alpha1.bundle import AdapterRef, Artifact
from modeldeploy.operator.api.v1alpha1.modeldeployment import PORT, ModelDeploymentSpec
from modeldeploy.operator.rollout.bundle import (
    BUNDLE_LABEL,
    bundle_labels,
    deployment_name,
    instance_labels,
    selector_labels,
)
from modeldeploy.operator.rollout.placement import (  # noqa: F401  (GPU_PRODUCT_LABEL, RUN_AS re-exported)
    GPU_PRODUCT_LABEL,
    RUN_AS,
    container_security,
    pod_placement,
    pod_security,
    pull_secrets,
)

MODEL_DIR = "/models/model"
ADAPTERS_DIR = "/models/adapters"  # each adapter at ADAPTERS_DIR/<name>, staged like the model
GPU_RESOURCE = "nvidia.com/gpu"
PRESTOP_SLEEP_S = 5  # lets endpoints drop the pod before SIGTERM starts the drain
REGISTRY_CONFIG_DIR = "/var/run/modeldeploy/registry"  # DOCKER_CONFIG of the oci:// fetch init container
REGISTRY_CONFIG_VOLUME = "registry-config"


# the operator's own env holding its gate key (controller/gatekey.py); named here, where the pods'
# MODELDEPLOY_GATE_KEY_SHA256 is written, so plan()'s refusal can name it without importing the controller
GATE_KEY_ENV = "MODELDEPLOY_GATE_KEY"


def owner_reference(md: dict[str, Any]) -> dict[str, Any]:
    meta = md["metadata"]
    return {
        "apiVersion": md.get("apiVersion", "serving.modeldeploy.dev/v1alpha1"),
        "kind": md.get("kind", "ModelDeployment"),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def queue_budget(spec: ModelDeploymentSpec) -> float | None:
    """The runtime's default admission wait budget (--queue-budget): bundle.config.queueBudgetSeconds when
    set (0: none), else the analysis TTFT SLO, so a request that cannot start within it is refused at once."""
    c = spec.bundle.config
    budget = (
        c.queue_budget_seconds
        if c.queue_budget_seconds is not None
        else spec.rollout.analysis.slo.ttft_seconds
    )
    return budget or None


def serve_args(spec: ModelDeploymentSpec, bid: str) -> list[str]:
    """`modeldeploy serve` flags from spec.bundle.config; only flags the runtime defines."""
    c = spec.bundle.config
    args = ["--model", MODEL_DIR, "--host", "0.0.0.0", "--port", str(PORT)]
    args += ["--max-num-seqs", str(c.max_num_seqs), "--max-queue", str(c.max_queue)]
    if c.max_queued_tokens:
        args += ["--max-queued-tokens", str(c.max_queued_tokens)]
    if budget := queue_budget(spec):
        args += ["--queue-budget", f"{budget:g}"]
    if c.max_model_len is not None:
        args += ["--max-model-len", str(c.max_model_len)]
    if c.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(c.max_num_batched_tokens)]
    if c.kv_cache_fraction is not None:
        args += ["--kv-cache-fraction", str(c.kv_cache_fraction)]
    if c.num_kv_blocks is not None:
        args += ["--num-kv-blocks", str(c.num_kv_blocks)]
    if not c.chunked_prefill:
        args += ["--no-chunked-prefill"]
    if c.served_model_name:
        args += ["--served-model-name", c.served_model_name]
    args += ["--device", c.device, "--dtype", c.dtype, "--bundle-id", bid]
    args += ["--model-digest", spec.bundle.model.digest, "--tokenizer-digest", spec.bundle.tokenizer.digest]
    args += ["--model-revision", spec.bundle.model.revision, "--drain-timeout", str(c.drain_timeout_seconds)]
    for a in spec.bundle.adapters or []:
        args += ["--adapter", f"{a.name}={ADAPTERS_DIR}/{a.name}", "--adapter-digest", f"{a.name}={a.digest}"]
        args += ["--adapter-revision", f"{a.name}={a.revision}"]
    if c.max_loras is not None:
        args += ["--max-loras", str(c.max_loras)]
    if c.cuda_graphs:
        args += ["--cuda-graphs"]
    if c.hf_overrides:
        args += ["--hf-overrides", json.dumps(c.hf_overrides, sort_keys=True, separators=(",", ":"))]
    if spec.topology.tensor_parallel > 1:  # only then: a TP=1 pod keeps the args (and template) it had
        args += ["--tensor-parallel-size", str(spec.topology.tensor_parallel)]
    return args  # the API key arrives as env MODELDEPLOY_API_KEY, never on the command line


def model_source(
    model: Artifact, image: str, pull_secret: str | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(volume, init container or None) that put the model files at MODEL_DIR."""
    return artifact_source(model, image, "model", MODEL_DIR, pull_secret)


def adapter_source(
    index: int, adapter: AdapterRef, image: str, pull_secret: str | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    """(volume, init container or None, serve container mount) for one LoRA adapter: staged
    exactly like the model (fetched and digest-verified, an image volume, or a read-only claim/host path)."""
    name, path = f"adapter-{index}", f"{ADAPTERS_DIR}/{adapter.name}"
    volume, init = artifact_source(adapter, image, name, path, pull_secret)
    return volume, init, _mount(volume, adapter.uri, path)


def image_volume(artifact: Artifact | AdapterRef) -> bool:
    """Whether the artifact is mounted as an image volume: oci:// unless pullMethod InitContainer."""
    return artifact.uri.startswith("oci://") and artifact.pull_method != "InitContainer"


def image_volumes(spec: ModelDeploymentSpec) -> list[tuple[str, str]]:
    """(volume name, image reference) of every image volume a serving pod mounts: what a pre-pull pulls."""
    named = [
        ("model", spec.bundle.model),
        *((f"adapter-{i}", a) for i, a in enumerate(spec.bundle.adapters or [])),
    ]
    return [(n, parse_oci_uri(a.uri).reference) for n, a in named if image_volume(a)]


def registry_config_volume(secret: str) -> dict[str, Any]:
    """The first imagePullSecret's .dockerconfigjson as config.json: the registry credentials of
    `modeldeploy fetch oci://` (DOCKER_CONFIG). Kubelet mounts it; the operator never reads it."""
    items = [{"key": ".dockerconfigjson", "path": "config.json"}]
    return {"name": REGISTRY_CONFIG_VOLUME, "secret": {"secretName": secret, "items": items}}


def _mount(volume: dict[str, Any], uri: str, path: str) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": volume["name"], "mountPath": path, "readOnly": True}
    sub = urlparse(uri).path.lstrip("/")
    if volume.get("persistentVolumeClaim") and sub:
        mount["subPath"] = sub
    return mount


def artifact_source(
    artifact: Artifact | AdapterRef,
    image: str,
    volume_name: str,
    path: str,
    pull_secret: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(volume, init container or None) that put an artifact's files at `path`.

    oci:// is an image volume by default: the kubelet pulls it by digest with the pod's imagePullSecrets
    and keeps it in the node's image store (what pre-pull warms); the runtime still checks the files
    against the model digest. pullMethod InitContainer fetches it like http(s):// (every blob and the
    model digest verified), with `pull_secret` (the first imagePullSecret) as its registry credentials."""
    u = urlparse(artifact.uri)
    if u.scheme == "pvc":
        return {"name": volume_name, "persistentVolumeClaim": {"claimName": u.netloc, "readOnly": True}}, None
    if u.scheme == "file":
        return {"name": volume_name, "hostPath": {"path": u.path, "type": "Directory"}}, None
    if image_volume(artifact):
        ref = parse_oci_uri(artifact.uri).reference
        return {"name": volume_name, "image": {"reference": ref, "pullPolicy": "IfNotPresent"}}, None
    args = [artifact.uri, path, "--digest", artifact.digest]
    mounts: list[dict[str, Any]] = [{"name": volume_name, "mountPath": path}]
    env = [{"name": "HOME", "value": "/tmp"}]
    if u.scheme == "oci":
        args += ["--insecure"] if artifact.insecure else []
        if pull_secret is not None:
            mounts.append(
                {"name": REGISTRY_CONFIG_VOLUME, "mountPath": REGISTRY_CONFIG_DIR, "readOnly": True}
            )
            env.append({"name": "DOCKER_CONFIG", "value": REGISTRY_CONFIG_DIR})
    init = {
        "name": f"fetch-{volume_name}",
        "image": image,
        "command": ["modeldeploy", "fetch"],
        "args": args,
        "volumeMounts": mounts,
        "securityContext": container_security(),
        "env": env,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    }
    return {"name": volume_name, "emptyDir": {}}, init


def _quantities(d: dict[str, int | str]) -> dict[str, str]:
    return {k: str(v) for k, v in d.items()}


def pod_spec(spec: ModelDeploymentSpec, bid: str, gate_key_sha256: str | None = None) -> dict[str, Any]:
    """`gate_key_sha256`: the operator's gate token's digest, given to a keyed pod so the operator's
    gates can ask it (controller/gatekey.py); unused without an API key."""
    topo, c = spec.topology, spec.bundle.config
    image = spec.bundle.engine.image
    secret = spec.image_pull_secrets[0].name if spec.image_pull_secrets else None
    volume, init = model_source(spec.bundle.model, image, secret)
    mount = _mount(volume, spec.bundle.model.uri, MODEL_DIR)
    adapters = [adapter_source(i, a, image, secret) for i, a in enumerate(spec.bundle.adapters or [])]
    requests = _quantities(spec.resources.requests)
    limits = _quantities(spec.resources.limits)
    if topo.gpus_per_replica:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(topo.gpus_per_replica)
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
        {"name": "MODELDEPLOY_BUNDLE", "value": bid},
    ]
    if spec.observability.otlp_endpoint:
        env.append({"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": spec.observability.otlp_endpoint})
    if c.api_key_secret_ref is not None:
        ref = c.api_key_secret_ref
        env.append(
            {"name": "MODELDEPLOY_API_KEY", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
        if gate_key_sha256 is not None:
            env.append({"name": "MODELDEPLOY_GATE_KEY_SHA256", "value": gate_key_sha256})
    http = lambda path: {"httpGet": {"path": path, "port": "http"}}  # noqa: E731
    period = 5
    container = {
        "name": "serve",
        "image": image,
        "command": ["modeldeploy", "serve"],
        "args": serve_args(spec, bid),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": env,
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": [
            mount,
            *(m for _, _, m in adapters),
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "startupProbe": http("/health/ready")
        | {
            "periodSeconds": period,
            "failureThreshold": math.ceil(spec.readiness.load_timeout_seconds / period),
        },
        "readinessProbe": http("/health/ready") | {"periodSeconds": period, "failureThreshold": 2},
        "livenessProbe": http("/health/live") | {"periodSeconds": 10, "failureThreshold": 3},
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
        "securityContext": container_security(),
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": c.drain_timeout_seconds + PRESTOP_SLEEP_S + 10,
        "securityContext": pod_security(fs_group=True),
        "containers": [container],
        "volumes": [
            volume,
            *(v for v, _, _ in adapters),
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(topo.shm_size_limit())}},
            {"name": "tmp", "emptyDir": {}},
        ],
        **pod_placement(spec),
    }
    inits = [c for c in (init, *(i for _, i, _ in adapters)) if c is not None]
    if inits:
        pod["initContainers"] = inits
    if any(m["name"] == REGISTRY_CONFIG_VOLUME for c in inits for m in c["volumeMounts"]):
        assert secret is not None
        pod["volumes"].append(registry_config_volume(secret))
    return pod | pull_secrets(spec)


def deployment(
    md: dict[str, Any], spec: ModelDeploymentSpec, bid: str, replicas: int, gate_key_sha256: str | None = None
) -> dict[str, Any]:
    name, ns = md["metadata"]["name"], md["metadata"]["namespace"]
    labels = bundle_labels(name, bid, spec.bundle.model.revision)
    match = selector_labels(name) | {BUNDLE_LABEL: bid}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(name, bid),
            "namespace": ns,
            "labels": labels,
            "ownerReferences": [owner_reference(md)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec(spec, bid, gate_key_sha256)},
        },
    }


def service(md: dict[str, Any], suffix: str, bid: str | None) -> dict[str, Any]:
    """`<name>` (bid None: every serving pod; a bid: that bundle's pods only, e.g. while a canary
    waits for its conformance gate) or `<name>-<suffix>` for one cohort's bundle."""
    name, ns = md["metadata"]["name"], md["metadata"]["namespace"]
    selector = selector_labels(name)
    if suffix or bid is not None:
        # a cohort with no bundle selects nothing rather than everything
        selector = selector | {BUNDLE_LABEL: bid or "none"}
    labels = instance_labels(name) | ({"modeldeploy.dev/cohort": suffix} if suffix else {})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{name}-{suffix}" if suffix else name,
            "namespace": ns,
            "labels": labels,
            "ownerReferences": [owner_reference(md)],
        },
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
