"""Shared builders for operator unit tests: a valid ModelDeployment and fake cluster objects."""

from __future__ import annotations

import copy
from typing import Any

from modeldeploy.operator.analysis import promql
from modeldeploy.operator.analysis.sources import analyze_interval
from modeldeploy.operator.analysis.window import AnalysisWindow
from modeldeploy.operator.api.v1alpha1.analysis import Analysis
from modeldeploy.operator.api.v1alpha1.status import AnalysisResult
from modeldeploy.operator.rollout.topology import NodeInfo

IMAGE = "registry.local/modeldeploy@sha256:" + "a" * 64
DIGEST = "sha256:" + "b" * 64


def md(name: str = "chat", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "bundle": {
            "engine": {"image": IMAGE},
            "model": {"uri": "pvc://models/tiny-llama", "revision": "r1", "digest": DIGEST},
            "tokenizer": {"revision": "r1", "digest": DIGEST},
            "config": {"maxNumSeqs": 8},
        },
        "replicas": 2,
        "topology": {"gpusPerReplica": 1, "gpuType": "NVIDIA-H200"},
    }
    base.update(spec)
    return {
        "apiVersion": "serving.modeldeploy.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": base,
    }


def gpu_nodes(n: int = 2, product: str = "NVIDIA-H200", gpus: int = 8) -> list[NodeInfo]:
    return [
        NodeInfo(
            f"gpu-{i}",
            {"nvidia.com/gpu.product": product},
            gpus,
            (("nvidia.com/gpu", "present", "NoSchedule"),),
        )
        for i in range(n)
    ]


def as_observed(obj: dict[str, Any], ready: int | None = None) -> dict[str, Any]:
    """What the API server would return for a created object: our fields plus defaults/status."""
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = "1"
    if obj["kind"] == "Deployment":
        c = out["spec"]["template"]["spec"]["containers"][0]
        c["terminationMessagePath"] = "/dev/termination-log"
        c["startupProbe"]["httpGet"]["scheme"] = "HTTP"
        out["spec"]["revisionHistoryLimit"] = 10
        out["status"] = {
            "replicas": obj["spec"]["replicas"],
            "readyReplicas": obj["spec"]["replicas"] if ready is None else ready,
        }
    else:
        out["spec"]["clusterIP"] = "10.0.0.7"
        out["spec"]["sessionAffinity"] = "None"
    return out


def prometheus_analysis(
    cfg: Analysis,
    namespace: str,
    stable: str,
    canary: str,
    since: float | None,
    step: int | None = None,
    time: str | None = None,
    now: float | None = None,
) -> tuple[AnalysisResult, str]:
    """One interval through the Prometheus source, at `now` when given."""
    assert cfg.prometheus is not None
    src = promql.Prometheus(cfg.prometheus, cfg.interval_seconds)
    if now is not None:
        src.clock = lambda: now
    return analyze_interval(
        src, AnalysisWindow("uid", namespace, stable, canary, since=since), cfg, step=step, time=time
    )


def tp_spec(gpus: int, tp: int, device: str = "auto", adapters: list | None = None) -> dict[str, Any]:
    """A valid spec with the given topology, device and adapters (the tensor-parallel rules' inputs)."""
    obj = md()["spec"]
    obj["topology"] = {"gpusPerReplica": gpus, "tensorParallel": tp}
    obj["bundle"]["config"]["device"] = device
    if adapters is not None:
        obj["bundle"]["adapters"] = adapters
    return obj
