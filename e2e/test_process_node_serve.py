"""`modeldeploy serve` on a tiny model as a real pod on the process node."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .conftest import E2ECluster
from .test_process_node import alive, get, pod_pid, proc_pod


def post(url: str, body: dict[str, Any], timeout: float = 60) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read())


def test_serve_pod_loads_turns_ready_answers_and_stops(
    cluster: E2ECluster, namespace: str, tmp_path: Path
) -> None:
    if cluster.process_node is None:
        pytest.skip("external $KUBECONFIG cluster: no process node")
    from modeldeploy.runtime.tiny_model import make_tiny_model

    make_tiny_model(tmp_path / "tiny-llama")
    pv = f"{namespace}-models"
    cluster.core.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "hostPath": {"path": str(tmp_path), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": "models"},
            },
        }
    )
    try:
        cluster.core.create_namespaced_persistent_volume_claim(
            namespace,
            {
                "metadata": {"name": "models"},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
        ready = {
            "httpGet": {"path": "/health/ready", "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 1,
        }
        live = {
            "httpGet": {"path": "/health/live", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 6,
        }
        pod = proc_pod(
            "serve",
            [
                "serve",
                "--model",
                "/models/tiny-llama",
                "--host",
                "0.0.0.0",
                "--port",
                "8000",
                "--device",
                "cpu",
                "--drain-timeout",
                "5",
            ],
            container={
                "ports": [{"name": "http", "containerPort": 8000}],
                "env": [{"name": "MODELDEPLOY_LOAD_DELAY_S", "value": "4"}],
                "readinessProbe": ready,
                "livenessProbe": live,
                "volumeMounts": [{"name": "m", "mountPath": "/models", "readOnly": True}],
            },
            volumes=[{"name": "m", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}],
            terminationGracePeriodSeconds=20,
        )
        cluster.core.create_namespaced_pod(namespace, pod)
        p = cluster.wait(
            lambda: (lambda x: x if x.status.phase == "Running" and x.status.pod_ip else None)(
                cluster.core.read_namespaced_pod("serve", namespace)
            ),
            60,
            "serve pod Running",
        )
        assert p.spec.node_name == cluster.process_node
        ip = p.status.pod_ip
        # loading: the server is up and says 503, and the pod is not Ready
        code, body = cluster.wait(
            lambda: (lambda r: r if r[0] in (200, 503) else None)(get(f"http://{ip}:8000/health/ready")),
            120,
            "serve to listen",
        )
        assert code == 503, body
        conds = {
            c.type: c.status for c in cluster.core.read_namespaced_pod("serve", namespace).status.conditions
        }
        assert conds["Ready"] == "False"
        cluster.wait(
            lambda: (
                {
                    c.type: c.status
                    for c in cluster.core.read_namespaced_pod("serve", namespace).status.conditions
                }.get("Ready")
                == "True"
            ),
            180,
            "serve pod Ready",
        )
        status, out = post(
            f"http://{ip}:8000/v1/completions",
            {"model": "tiny-llama", "prompt": "Kubernetes schedules", "max_tokens": 4},
        )
        assert status == 200 and out["choices"][0]["text"] != "" and out["usage"]["completion_tokens"] == 4, (
            out
        )
        pid = pod_pid(cluster.core.read_namespaced_pod("serve", namespace))
        uid = p.metadata.uid
        cluster.core.delete_namespaced_pod("serve", namespace)
        cluster.wait(
            lambda: not any(x.metadata.uid == uid for x in cluster.core.list_namespaced_pod(namespace).items),
            60,
            "serve pod removed after a clean stop",
        )
        assert not alive(pid)
        logs = cluster.logs_by_uid(uid)
        last = [line for line in logs.splitlines() if line.startswith("--- ") and "stopped" in line][-1]
        assert last.endswith("exit 0"), logs[-3000:]  # stopped by SIGTERM within the grace period
    finally:
        cluster.core.delete_persistent_volume(pv)
