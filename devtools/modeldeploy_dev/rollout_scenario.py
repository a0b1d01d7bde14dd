"""ModelDeployment objects and rollout scenarios on a live cluster, shared by the e2e tests and the
benches that drive the same scenarios (bench/rollout_capacity.py).

- manifest / create / get_md / condition / events / wait_md: one ModelDeployment through the API
  server, with a timed-out wait saying what it saw last;
- models_pv / tiny_spec / change_bundle: the tiny (or real) model on the process node through a
  `models` PVC, the spec the rollout e2e and the chaos bench serve it with, and a bundle edit;
- gpu_pool / pool_spec / serve / change / ready_by_bundle / ReadyWatch: node pools of kwok nodes
  with exactly 8 GPUs, labelled and tainted for one namespace alone, so the fit check and the
  scheduler see exactly those GPUs; a 16 x 1 GPU ModelDeployment on them whose canary analysis
  reads a Prometheus stand-in (modeldeploy_dev.fake_prometheus).
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from modeldeploy.operator.api.v1alpha1.bundle import Bundle
from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, KIND, PLURAL, VERSION
from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, bundle_id
from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.cluster.nodes import kwok_node, node_ready
from modeldeploy_dev.e2e_cluster import E2ECluster
from modeldeploy_dev.fake_prometheus import FakePrometheus

IMAGE = "registry.local/modeldeploy-runtime@sha256:" + "5" * 64
FAKE_DIGEST = "sha256:" + "b" * 64
G, V, P = GROUP, VERSION, PLURAL


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "bundle": {
            "engine": {"image": IMAGE},
            "model": {"uri": "https://models.invalid/tiny", "revision": "r1", "digest": FAKE_DIGEST},
            "tokenizer": {"revision": "r1", "digest": FAKE_DIGEST},
            "config": {"maxNumSeqs": 4, "device": "cpu"},
        },
        "replicas": 1,
        "topology": {
            "gpusPerReplica": 1,
            "gpuType": "NVIDIA-H200",
            "nodeSelector": {"modeldeploy.dev/node-kind": "kwok"},
        },
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    }
    base.update(spec)
    return {"apiVersion": f"{G}/{V}", "kind": KIND, "metadata": {"name": name}, "spec": base}


def create(cluster: E2ECluster, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    return K.custom_object(cluster.custom.create_namespaced_custom_object(G, V, ns, P, obj))


def get_md(cluster: E2ECluster, ns: str, name: str) -> dict[str, Any]:
    return K.custom_object(cluster.custom.get_namespaced_custom_object(G, V, ns, P, name))


def condition(md: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in md.get("status", {}).get("conditions", []) if c["type"] == ctype), {})


def events(cluster: E2ECluster, ns: str, name: str) -> list[tuple[str, str]]:
    evs = sorted(
        (e for e in cluster.core.list_namespaced_event(ns).items if e.involved_object.name == name),
        key=K.created,
    )
    # "" for an absent field (the operator always sets both), so callers match text without a None check
    return [(e.reason or "", e.message or "") for e in evs]


def brief(cluster: E2ECluster, ns: str, md: dict[str, Any] | None) -> str:
    """What a timed-out wait saw last: the object's phase, conditions and canary, and its pods."""
    if md is None:
        return "no object read"
    st = md.get("status", {})
    conds = [
        f"{c['type']}={c['status']}({c.get('reason', '')}: {c.get('message', '')})"
        for c in st.get("conditions", [])
    ]
    pods = [
        f"{K.name(p)} {K.pod_status(p).phase} node={K.pod_spec(p).node_name} "
        + ",".join(f"{c.name}:ready={c.ready}" for c in K.pod_status(p).container_statuses or [])
        for p in cluster.core.list_namespaced_pod(ns).items
    ]
    return f"phase={st.get('phase')} canary={st.get('canary')} conditions={conds} pods={pods}"


def wait_md(
    cluster: E2ECluster, ns: str, name: str, ok: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> dict[str, Any]:
    """The ModelDeployment once `ok(object)` holds; a timeout says what status and pods it saw last."""
    last: list[dict[str, Any]] = []

    def pred() -> dict[str, Any] | None:
        m = get_md(cluster, ns, name)
        last[:] = [m]
        return m if ok(m) else None

    try:
        return cluster.wait(pred, timeout, what)
    except TimeoutError as e:
        raise TimeoutError(f"{e}; last seen: {brief(cluster, ns, last[0] if last else None)}") from e


ANALYSIS: dict[str, Any] = {
    "intervalSeconds": 5,
    "minSamples": 8,
    "maxTtftP95Ratio": 3.0,
    "maxInterTokenP95Ratio": 3.0,
    "maxErrorRate": 0.05,
    "minGoodputRatio": 0.5,
    "slo": {"ttftSeconds": 5.0, "interTokenSeconds": 1.0},
}


def models_pv(
    core: Any,
    ns: str,
    host_dir: Path,
    size: str = "1Gi",
    labels: dict[str, str] | None = None,
    node: str | tuple[str, ...] | None = None,
) -> None:
    """PV `<ns>-models` + PVC `models` in `ns` (`core`: a CoreV1Api): `host_dir` (model directories,
    or symlinks to them) read-only, so a bundle names a model as `pvc://models/<dir>`. A hostPath
    volume for the process node; with `node`, a `local` volume bound to that real node, or to any of
    several real nodes of this machine, which share its filesystem (kubelet mounts it into the
    container)."""
    pv = f"{ns}-models"
    source: dict[str, Any] = {"hostPath": {"path": str(host_dir), "type": "Directory"}}
    if node is not None:
        nodes = [node] if isinstance(node, str) else list(node)
        term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}
        affinity = {"required": {"nodeSelectorTerms": [term]}}
        source = {"local": {"path": str(host_dir)}, "nodeAffinity": affinity}
    core.create_persistent_volume(
        {
            "metadata": {"name": pv, "labels": labels or {}},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                **source,
                "claimRef": {"namespace": ns, "name": "models"},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": "models"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": size}},
            },
        },
    )


def tiny_model_pv(cluster: E2ECluster, ns: str, tmp: Path) -> str:
    """The tiny random model written under tmp/models/tiny-llama behind the `models` PVC; returns
    its digest."""
    from modeldeploy.digest import dir_digest
    from modeldeploy.runtime.tiny_model import make_tiny_model

    model = make_tiny_model(tmp / "models" / "tiny-llama")
    models_pv(cluster.core, ns, tmp / "models")
    return dir_digest(model)


def tiny_model_local_pv(
    cluster: E2ECluster, ns: str, root: Path, node: str | tuple[str, ...] = "real-0"
) -> str:
    """The tiny model under root/models/tiny-llama behind the `models` PVC as a `local` volume on the
    real node `node`; returns its digest. Readable by the pod's user: kubelet applies no fsGroup
    ownership to a read-only volume (seen: PermissionError on model.safetensors, written 0600)."""
    from modeldeploy.digest import dir_digest
    from modeldeploy.runtime.tiny_model import make_tiny_model

    (root / "models").mkdir(parents=True, exist_ok=True)
    (root / "models").chmod(0o755)
    model = make_tiny_model(root / "models" / "tiny-llama")
    for f in [model, *model.rglob("*")]:
        f.chmod(0o755 if f.is_dir() else 0o644)
    models_pv(cluster.core, ns, root / "models", node=node)
    return dir_digest(model)


def tiny_spec(
    name: str,
    digest: str,
    config: dict[str, Any] | None = None,
    topology: dict[str, Any] | None = None,
    **rollout: Any,
) -> dict[str, Any]:
    """A ModelDeployment serving the tiny model from the `models` PVC on the process node: one step
    of 50 % with a 5 s pause, the analysis above; `config`, `topology` and `rollout` fields win."""
    spec = manifest(name)["spec"]
    spec["bundle"]["model"] = {"uri": "pvc://models/tiny-llama", "revision": "seed0", "digest": digest}
    spec["bundle"]["tokenizer"] = {"revision": "seed0", "digest": digest}
    spec["bundle"]["config"] = {
        "maxNumSeqs": 8,
        "maxQueue": 64,
        "device": "cpu",
        "servedModelName": "tiny-llama",
    } | (config or {})
    spec["topology"]["nodeSelector"] = {"modeldeploy.dev/node-kind": "process"}
    spec["topology"].update(topology or {})
    spec["readiness"] = {"loadTimeoutSeconds": 180}
    spec["rollout"] = {
        "steps": [{"weight": 50, "pauseSeconds": 5}],
        "analysis": ANALYSIS,
        "progressDeadlineSeconds": 600,
        "keepPrevious": {"replicas": 1, "seconds": 600},
    } | rollout
    return manifest(name, **spec)


def change_bundle(cluster: E2ECluster, ns: str, name: str, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Apply `edit` to a copy of spec.bundle and patch the object with it."""
    spec = copy.deepcopy(get_md(cluster, ns, name)["spec"])
    edit(spec["bundle"])
    cluster.custom.patch_namespaced_custom_object(G, V, ns, P, name, {"spec": spec})


def stable_and_ready(m: dict[str, Any]) -> bool:
    return m.get("status", {}).get("phase") == "Stable" and condition(m, "Ready").get("status") == "True"


POOL = "modeldeploy.dev/pool"
REPLICAS, MIN_AVAILABLE = 16, 12  # 75 % of 16, the default minAvailable


@contextmanager
def gpu_pool(cluster: E2ECluster, ns: str, nodes: int) -> Iterator[str]:
    """`nodes` kwok nodes of 8 GPUs that only this namespace's ModelDeployment selects and tolerates."""
    names = [f"{ns}-gpu-{i}" for i in range(nodes)]
    for n in names:
        body = kwok_node(n)
        body["metadata"]["labels"][POOL] = ns
        body["spec"]["taints"].append({"key": POOL, "value": ns, "effect": "NoSchedule"})
        cluster.core.create_node(K.body(body))
    try:
        cluster.wait(
            lambda: all(node_ready(cluster.core.read_node(n)) for n in names),
            60,
            f"pool nodes {names} Ready",
        )
        yield ns
    finally:
        for n in names:
            try:
                cluster.core.delete_node(n)
            except ApiException as e:
                if e.status != 404:
                    raise


def pool_spec(name: str, pool: str, prom: FakePrometheus, **rollout: Any) -> dict[str, Any]:
    spec = manifest(name)["spec"]
    spec["replicas"] = REPLICAS
    spec["topology"]["nodeSelector"] = {POOL: pool}
    spec["topology"]["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": POOL, "operator": "Equal", "value": pool, "effect": "NoSchedule"},
    ]
    spec["readiness"] = {"loadTimeoutSeconds": 120}
    spec["rollout"] = {
        "conformanceGate": False,  # kwok pods serve nothing to run the suite against
        "steps": [{"weight": 25, "pauseSeconds": 0}, {"weight": 50, "pauseSeconds": 0}],
        "analysis": {
            "intervalSeconds": 5,
            "minSamples": 20,
            "maxTtftP95Ratio": 1.5,
            "prometheus": {"address": prom.address},
        },
        "progressDeadlineSeconds": 600,
    } | rollout
    return spec


def ready_by_bundle(cluster: E2ECluster, ns: str, name: str) -> Counter[str]:
    """Ready pods that are not terminating, per bundle id."""
    pods = cluster.core.list_namespaced_pod(ns, label_selector=f"app.kubernetes.io/instance={name}").items
    return Counter(
        (K.meta(p).labels or {}).get(BUNDLE_LABEL, "")
        for p in pods
        if K.meta(p).deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in K.pod_status(p).conditions or [])
    )


class ReadyWatch:
    """Counts Ready pods every 0.1 s in a thread (bounded: at most `max_samples` polls); keeps the minimum."""

    def __init__(self, cluster: E2ECluster, ns: str, name: str, max_samples: int = 3000) -> None:
        self.cluster, self.ns, self.name, self.max_samples = cluster, ns, name, max_samples
        self.samples: list[Counter[str]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for _ in range(self.max_samples):
            if self._stop.is_set():
                return
            try:
                self.samples.append(ready_by_bundle(self.cluster, self.ns, self.name))
            except ApiException:
                self.errors += 1
            self._stop.wait(0.1)

    @property
    def minimum(self) -> int:
        return min(sum(c.values()) for c in self.samples)

    def __enter__(self) -> ReadyWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def serve(cluster: E2ECluster, ns: str, name: str, spec: dict[str, Any]) -> str:
    """Create the ModelDeployment, wait for all replicas Ready on the stable bundle; its bundle id."""
    create(cluster, ns, manifest(name, **spec))
    md = wait_md(cluster, ns, name, stable_and_ready, 120, f"{name} Stable and Ready")
    stable = md["status"]["stable"]["bundle"]
    cluster.wait(lambda: ready_by_bundle(cluster, ns, name)[stable] == spec["replicas"], 60, "all pods Ready")
    return stable


def change(cluster: E2ECluster, ns: str, name: str, max_num_seqs: int, slow: set[str] | None = None) -> str:
    """Patch spec.bundle (a serving config change); the new bundle id, as the operator computes it,
    added to `slow` (if given) before the operator can see the change."""
    spec = copy.deepcopy(get_md(cluster, ns, name)["spec"])
    spec["bundle"]["config"]["maxNumSeqs"] = max_num_seqs
    bid = bundle_id(Bundle.model_validate(spec["bundle"]))
    if slow is not None:
        slow.add(bid)
    cluster.custom.patch_namespaced_custom_object(G, V, ns, P, name, {"spec": spec})
    return bid
