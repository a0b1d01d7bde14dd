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
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

from modeldeploy_dev.cluster.local import LocalCluster
from modeldeploy_dev.wait import wait_until

T = TypeVar("T")


def restricted_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


class E2ECluster:
    def __init__(self, kubeconfig: str, local: LocalCluster | None) -> None:
        self.kubeconfig = kubeconfig
        self.local = local
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.process_node = local.s.process_node if local else None
        bins = local.bins if local else None
        self._kubectl = str(bins.kubectl) if bins else (shutil.which("kubectl") or "kubectl")
        self._helm = str(bins.helm) if bins else (shutil.which("helm") or "helm")

    def _run(
        self, exe: str, args: tuple[str, ...], input: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        r = subprocess.run(
            [exe, *args], input=input, text=True, capture_output=True, env=env, timeout=timeout
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"{Path(exe).name} {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
            )
        return r

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self._run(self._kubectl, args, input, check, timeout)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self._run(self._helm, args, None, check, timeout)

    @staticmethod
    def wait(fn: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
        return wait_until(fn, timeout, interval, what)

    def process_logs(self, namespace: str, pod: str) -> str:
        if self.local is None:
            return ""
        try:
            uid = self.core.read_namespaced_pod(pod, namespace).metadata.uid
        except client.ApiException:
            return ""
        return self.logs_by_uid(uid)

    def logs_by_uid(self, uid: str) -> str:
        d = self.local.procnode_dir / "pods" / uid if self.local else None
        if d is None or not d.exists():
            return ""
        return "\n".join(
            f"== {f.name}\n{f.read_text(errors='replace')[-20000:]}" for f in sorted(d.glob("*.log"))
        )

    def dump(self, namespace: str) -> str:
        out = [f"===== dump of namespace {namespace}"]
        try:
            evs = self.core.list_namespaced_event(namespace).items
            evs.sort(key=lambda e: str(e.last_timestamp or e.event_time or e.metadata.creation_timestamp))
            out += ["--- events"] + [
                f"{e.type} {e.reason} {e.involved_object.kind}/{e.involved_object.name}: {e.message}"
                for e in evs
            ]
            out.append("--- pods")
            for p in self.core.list_namespaced_pod(namespace).items:
                conds = {c.type: c.status for c in p.status.conditions or []}
                out.append(
                    f"{p.metadata.name} node={p.spec.node_name} phase={p.status.phase} ip={p.status.pod_ip} "
                    f"conditions={conds} message={p.status.message}"
                )
                for cs in p.status.container_statuses or []:
                    out.append(
                        f"  {cs.name} ready={cs.ready} restarts={cs.restart_count} state={cs.state.to_dict()}"
                    )
                if p.spec.node_name and p.spec.node_name == self.process_node:
                    out.append(self.logs_by_uid(p.metadata.uid))
        except Exception as e:  # a dump must never hide the original failure
            out.append(f"(dump incomplete: {e})")
        if self.local is not None:
            log = self.local.procnode_dir / "procnode.log"
            if log.exists():
                out += ["--- process node log (tail)", *log.read_text(errors="replace").splitlines()[-40:]]
        return "\n".join(out)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)


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
