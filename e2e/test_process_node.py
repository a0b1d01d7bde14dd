"""The process node runs `modeldeploy` pods for real: IPs, probes, Services, restarts, shutdown."""

from __future__ import annotations

import ipaddress
import json
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from modeldeploy_dev.cluster.nodes import NODE_KIND
from modeldeploy_dev.procnode.pids import alive

from .conftest import E2ECluster, restricted_security_context

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def proc_pod(name: str, args: list[str], **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.invalid/modeldeploy-runtime@sha256:" + "2" * 64,
        "command": ["modeldeploy"],
        "args": args,
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "GREETING", "value": "hello from $(POD_IP)"},
        ],
        "securityContext": restricted_security_context(),
        **spec.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {NODE_KIND: "process"},
            "tolerations": [GPU_TOLERATION],
            "containers": [container],
            **spec,
        },
    }


def get(url: str, timeout: float = 3) -> tuple[int, bytes]:
    """Only pod IPs on the host-local bridge are contacted."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:  # not listening yet
        return 0, str(e).encode()


def pod_pid(p: Any) -> int:
    cid = p.status.container_statuses[0].container_id
    assert cid.startswith("process://"), cid
    return int(cid.removeprefix("process://"))


@pytest.fixture
def require_process_node(cluster: E2ECluster) -> str:
    if cluster.process_node is None:
        pytest.skip("external $KUBECONFIG cluster: no process node")
    return cluster.process_node


def test_pod_gets_ip_probes_endpoints_and_stops_on_delete(
    cluster: E2ECluster, namespace: str, require_process_node: str
) -> None:
    probe = {"httpGet": {"path": "/health/ready", "port": "http"}, "periodSeconds": 1, "failureThreshold": 1}
    live = {"httpGet": {"path": "/health/live", "port": 8080}, "periodSeconds": 2}
    pod = proc_pod(
        "ts",
        ["cluster", "testserver", "--port", "8080", "--ready-after", "4"],
        container={"readinessProbe": probe, "livenessProbe": live},
        terminationGracePeriodSeconds=10,
    )
    cluster.core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "ts"},
            "spec": {"selector": {"app": "ts"}, "ports": [{"port": 80, "targetPort": "http"}]},
        },
    )
    cluster.core.create_namespaced_pod(namespace, pod)

    def running() -> Any:
        p = cluster.core.read_namespaced_pod("ts", namespace)
        return p if p.status.phase == "Running" and p.status.pod_ip else None

    p = cluster.wait(running, 60, "pod ts Running with an IP")
    assert p.spec.node_name == require_process_node
    assert ipaddress.ip_address(p.status.pod_ip) in ipaddress.ip_network(cluster.local.s.pod_cidr)
    ip = p.status.pod_ip
    # while "loading" the server answers 503 and the pod is not Ready
    code, _ = cluster.wait(
        lambda: (lambda r: r if r[0] in (200, 503) else None)(get(f"http://{ip}:8080/health/ready")),
        20,
        "the process to listen",
    )
    conds = {c.type: c.status for c in cluster.core.read_namespaced_pod("ts", namespace).status.conditions}
    if code == 503:
        assert conds["Ready"] == "False"
    cluster.wait(
        lambda: (
            {
                c.type: c.status for c in cluster.core.read_namespaced_pod("ts", namespace).status.conditions
            }.get("Ready")
            == "True"
        ),
        30,
        "pod ts Ready",
    )
    status, body = get(f"http://{ip}:8080/")
    info = json.loads(body)
    assert status == 200 and info["env"]["POD_IP"] == ip and info["env"]["GREETING"] == f"hello from {ip}"
    assert info["env"]["HOSTNAME"] == "ts"

    def ready_endpoint() -> Any:
        es = (
            client.DiscoveryV1Api(cluster.api)
            .list_namespaced_endpoint_slice(namespace, label_selector="kubernetes.io/service-name=ts")
            .items
        )
        return [e for s in es for e in (s.endpoints or []) if ip in e.addresses and e.conditions.ready]

    cluster.wait(ready_endpoint, 30, "EndpointSlice of Service ts to list the pod IP as ready")

    p = cluster.core.read_namespaced_pod("ts", namespace)
    pid = pod_pid(p)
    assert alive(pid)
    cluster.core.delete_namespaced_pod("ts", namespace)
    uid = p.metadata.uid

    def gone() -> bool:
        return not any(x.metadata.uid == uid for x in cluster.core.list_namespaced_pod(namespace).items)

    cluster.wait(gone, 40, "pod ts to be removed after its process stopped")
    assert not alive(pid)
    logs = cluster.logs_by_uid(uid)
    assert "SIGTERM received, shutting down" in logs and "testserver stopped cleanly" in logs, logs
    assert "exit 0" in logs.splitlines()[-1]


def test_restart_policy(cluster: E2ECluster, namespace: str, require_process_node: str) -> None:
    args = ["cluster", "testserver", "--port", "8080", "--exit-after", "0.5", "--exit-code", "3"]
    cluster.core.create_namespaced_pod(namespace, proc_pod("always", args, restartPolicy="Always"))
    cluster.core.create_namespaced_pod(namespace, proc_pod("never", args, restartPolicy="Never"))

    def restarted() -> Any:
        cs = cluster.core.read_namespaced_pod("always", namespace).status.container_statuses or []
        return cs[0] if cs and cs[0].restart_count >= 2 else None

    cs = cluster.wait(restarted, 60, "pod 'always' to be restarted twice")
    assert cs.last_state.terminated.exit_code == 3

    def failed() -> Any:
        p = cluster.core.read_namespaced_pod("never", namespace)
        return p if p.status.phase == "Failed" else None

    p = cluster.wait(failed, 30, "pod 'never' to fail")
    cs = p.status.container_statuses[0]
    assert (
        cs.restart_count == 0 and cs.state.terminated.exit_code == 3 and cs.state.terminated.reason == "Error"
    )


def test_grace_period_then_sigkill(cluster: E2ECluster, namespace: str, require_process_node: str) -> None:
    pod = proc_pod(
        "stubborn",
        ["cluster", "testserver", "--port", "8080", "--ignore-sigterm"],
        terminationGracePeriodSeconds=2,
    )
    cluster.core.create_namespaced_pod(namespace, pod)
    p = cluster.wait(
        lambda: (lambda x: x if x.status.phase == "Running" else None)(
            cluster.core.read_namespaced_pod("stubborn", namespace)
        ),
        60,
        "pod stubborn Running",
    )
    # wait until the process has installed its SIGTERM handler (it logs "listening" after that)
    cluster.wait(lambda: "listening" in cluster.logs_by_uid(p.metadata.uid), 30, "testserver to listen")
    pid = pod_pid(p)
    cluster.core.delete_namespaced_pod("stubborn", namespace)
    cluster.wait(
        lambda: (
            not any(
                x.metadata.uid == p.metadata.uid for x in cluster.core.list_namespaced_pod(namespace).items
            )
        ),
        40,
        "pod removed",
    )
    assert not alive(pid)
    logs = cluster.logs_by_uid(p.metadata.uid)
    assert "SIGTERM received (ignored)" in logs
    assert "stopped (grace 2s) exit -9" in logs, logs  # SIGKILL after the grace period


def test_pvc_volume_maps_to_local_path(
    cluster: E2ECluster, namespace: str, require_process_node: str, tmp_path: Any
) -> None:
    (tmp_path / "hello.txt").write_text("weights would live here\n")
    tmp_path.chmod(0o755)
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
        pod = proc_pod(
            "vol",
            ["cluster", "testserver", "--port", "8080", "--file", "/models/hello.txt"],
            container={"volumeMounts": [{"name": "m", "mountPath": "/models", "readOnly": True}]},
            volumes=[{"name": "m", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}],
        )
        cluster.core.create_namespaced_pod(namespace, pod)
        p = cluster.wait(
            lambda: (lambda x: x if x.status.phase == "Running" and x.status.pod_ip else None)(
                cluster.core.read_namespaced_pod("vol", namespace)
            ),
            60,
            "pod vol Running",
        )
        code, body = cluster.wait(
            lambda: (lambda r: r if r[0] == 200 else None)(get(f"http://{p.status.pod_ip}:8080/file")),
            20,
            "GET /file",
        )
        assert body == b"weights would live here\n"
    finally:
        cluster.core.delete_persistent_volume(pv)


def test_unsupported_command_is_reported_not_run(
    cluster: E2ECluster, namespace: str, require_process_node: str
) -> None:
    pod = proc_pod("sh", [], container={"command": ["/bin/sh", "-c", "sleep 1000"]})
    cluster.core.create_namespaced_pod(namespace, pod)

    def reported() -> Any:
        cs = cluster.core.read_namespaced_pod("sh", namespace).status.container_statuses or []
        return (
            cs[0]
            if cs and cs[0].state.waiting and cs[0].state.waiting.reason == "ProcessNodeUnsupported"
            else None
        )

    cs = cluster.wait(reported, 30, "ProcessNodeUnsupported status")
    assert "/bin/sh" in cs.state.waiting.message


def test_init_containers_run_first_and_a_failing_one_fails_the_pod(
    cluster: E2ECluster, namespace: str, require_process_node: str
) -> None:
    job = ["cluster", "testserver", "--port", "8081", "--exit-after", "0.5"]
    init = {
        "name": "init",
        "image": "registry.invalid/x@sha256:" + "3" * 64,
        "command": ["modeldeploy"],
        "args": job,
        "securityContext": restricted_security_context(),
    }
    cluster.core.create_namespaced_pod(
        namespace, proc_pod("ok", ["cluster", "testserver", "--port", "8080"], initContainers=[init])
    )
    bad = {**init, "args": [*job, "--exit-code", "1"]}
    cluster.core.create_namespaced_pod(
        namespace,
        proc_pod(
            "bad", ["cluster", "testserver", "--port", "8080"], initContainers=[bad], restartPolicy="Never"
        ),
    )

    def running(name: str) -> Any:
        p = cluster.core.read_namespaced_pod(name, namespace)
        return p if p.status.phase == "Running" and p.status.container_statuses[0].state.running else None

    p = cluster.wait(lambda: running("ok"), 60, "pod ok Running after its init container")
    init_state = p.status.init_container_statuses[0].state.terminated
    assert init_state.exit_code == 0 and init_state.reason == "Completed"
    assert p.status.container_statuses[0].state.running.started_at >= init_state.finished_at
    assert {c.type: c.status for c in p.status.conditions}["Initialized"] == "True"

    p = cluster.wait(
        lambda: (lambda x: x if x.status.phase == "Failed" else None)(
            cluster.core.read_namespaced_pod("bad", namespace)
        ),
        60,
        "pod bad Failed",
    )
    assert p.status.init_container_statuses[0].state.terminated.exit_code == 1
    assert p.status.container_statuses[0].state.running is None  # the main container never ran
    assert {c.type: c.status for c in p.status.conditions}["Initialized"] == "False"


def test_liveness_failure_restarts_the_container(
    cluster: E2ECluster, namespace: str, require_process_node: str
) -> None:
    live = {"httpGet": {"path": "/no-such-path", "port": 8080}, "periodSeconds": 1, "failureThreshold": 2}
    cluster.core.create_namespaced_pod(
        namespace,
        proc_pod(
            "sick",
            ["cluster", "testserver", "--port", "8080"],
            container={"livenessProbe": live},
            terminationGracePeriodSeconds=5,
        ),
    )

    def restarted() -> Any:
        cs = cluster.core.read_namespaced_pod("sick", namespace).status.container_statuses or []
        return cs[0] if cs and cs[0].restart_count >= 1 else None

    cs = cluster.wait(restarted, 60, "a liveness restart")
    assert "Liveness probe failed" in cs.last_state.terminated.message
    assert "status 404" in cs.last_state.terminated.message
