"""e2e fixtures: a real control plane (local kwokctl cluster, or $KUBECONFIG) and a namespace per test.

API for e2e tests (tests that request `cluster` are marked `e2e` automatically):

  cluster (session)           -> E2ECluster
    .kubeconfig: str            path; also exported as $KUBECONFIG for subprocesses you start
    .api: ApiClient             kubernetes client; .core (CoreV1Api), .apps (AppsV1Api), .custom
    .kubectl(*args, input=None, check=True) -> CompletedProcess[str]   (text, captured)
    .helm(*args, check=True)  -> CompletedProcess[str]
    .wait(fn, timeout, what)  -> fn()'s first truthy value (polls every 0.5 s, bounded)
    .process_node: str | None   "proc-0": pods there really run (`modeldeploy ...` commands)
    .process_logs(ns, pod)    -> output of the pod's processes on the process node
    .dump(ns) -> str            events, pod statuses, process logs (printed on test failure)
  namespace (function)        -> str, a fresh namespace labelled
                                 pod-security.kubernetes.io/enforce=restricted; deleted after the
                                 test with the PersistentVolumes claimed from it, dumped first if
                                 the test failed.
  restricted_security_context() (module function) -> container securityContext passing "restricted".

Node labels: modeldeploy.dev/node-kind = kwok (simulated GPU nodes gpu-0..) | process (proc-0); all
carry nvidia.com/gpu.product=NVIDIA-H200, capacity nvidia.com/gpu: 8 and the taint
nvidia.com/gpu=present:NoSchedule. Without $KUBECONFIG the session brings the local cluster up
(`modeldeploy cluster up`, reused if already running) and takes it down at the end only if it
started it (set MODELDEPLOY_KEEP_CLUSTER=1 to keep it). A second cluster on the same machine:
MODELDEPLOY_CLUSTER_NAME=x MODELDEPLOY_CLUSTER_BRIDGE=mdbr1 MODELDEPLOY_CLUSTER_POD_CIDR=10.244.1.0/24.
The process node ignores securityContext (processes run as the invoking user) and cannot serve
`kubectl logs/exec`: use cluster.process_logs().
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from modeldeploy_dev.cluster.local import LocalCluster
from modeldeploy_dev.e2e_cluster import E2ECluster

__all__ = ["E2ECluster", "restricted_security_context"]


def restricted_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)
        if here in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.cluster_bins)  # the whole lane runs after `make cluster-build`


@pytest.fixture(scope="session")
def cluster() -> Iterator[E2ECluster]:
    external = os.environ.get("KUBECONFIG")
    if external:
        yield E2ECluster(external, None)
        return
    local = LocalCluster.existing()  # $MODELDEPLOY_CLUSTER_NAME/_BRIDGE/_POD_CIDR pick another one
    was_running = local.cluster_running() and local.procnode_pid() is not None
    local.up()
    try:
        yield E2ECluster(str(local.kubeconfig), local)
    finally:
        if not was_running and not os.environ.get("MODELDEPLOY_KEEP_CLUSTER"):
            local.down()


@pytest.fixture
def namespace(cluster: E2ECluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{secrets.token_hex(3)}"
    cluster.core.create_namespace(
        {
            "metadata": {
                "name": name,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                    "modeldeploy.dev/e2e": "true",
                },
            }
        }
    )
    # pods need the default ServiceAccount, which the controller-manager creates asynchronously
    cluster.wait(
        lambda: any(
            a.metadata.name == "default" for a in cluster.core.list_namespaced_service_account(name).items
        ),
        30,
        f"default ServiceAccount in {name}",
    )
    yield name
    rep = getattr(request.node, "rep_call", None)
    if (
        rep is None
        or rep.failed
        or getattr(request.node, "rep_setup", None)
        and request.node.rep_setup.failed
    ):
        print(cluster.dump(name))
    cluster.core.delete_namespace(name)
    for pv in cluster.core.list_persistent_volume().items:  # cluster-scoped: a test's model volumes go too
        if pv.spec.claim_ref is not None and pv.spec.claim_ref.namespace == name:
            try:
                cluster.core.delete_persistent_volume(pv.metadata.name)
            except client.ApiException as e:
                if e.status != 404:  # already gone (a test removed its own)
                    raise
