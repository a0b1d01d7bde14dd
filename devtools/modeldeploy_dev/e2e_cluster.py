"""The e2e tests' handle on a cluster: API clients, kubectl and helm bound to its kubeconfig,
bounded waits, and the process node's logs. e2e/conftest.py's `cluster` fixture makes one;
benches that drive a live cluster (bench/rollout_capacity.py) make their own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kubernetes import client, config

from modeldeploy_dev import kubeobj as K
from modeldeploy_dev.cluster.local import LocalCluster
from modeldeploy_dev.wait import wait_until

T = TypeVar("T")


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
    def wait(fn: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5) -> T:
        return wait_until(fn, timeout, interval, what)

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        """Wait until each CRD (`crd/NAME` or NAME) is Established. Not `kubectl wait`: on a CRD the
        API server has just created, before it writes any status, that fails at once ("accessor
        error: <nil>") instead of waiting (seen on a freshly started cluster)."""
        names = [c.removeprefix("crd/") for c in crds]
        jsonpath = '{.status.conditions[?(@.type=="Established")].status}'

        def established() -> bool:
            for n in names:
                r = self.kubectl("get", "crd", n, "-o", f"jsonpath={jsonpath}", check=False)
                if r.returncode != 0 or r.stdout.strip() != "True":
                    return False
            return True

        self.wait(established, timeout, f"CRDs {names} Established")

    def process_logs(self, namespace: str, pod: str) -> str:
        if self.local is None:
            return ""
        try:
            uid = K.uid(self.core.read_namespaced_pod(pod, namespace))
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
                st, node = K.pod_status(p), K.pod_spec(p).node_name
                conds = {c.type: c.status for c in st.conditions or []}
                out.append(
                    f"{K.name(p)} node={node} phase={st.phase} ip={st.pod_ip} "
                    f"conditions={conds} message={st.message}"
                )
                for cs in st.container_statuses or []:
                    state = cs.state.to_dict() if cs.state is not None else None
                    out.append(f"  {cs.name} ready={cs.ready} restarts={cs.restart_count} state={state}")
                if node and node == self.process_node:
                    out.append(self.logs_by_uid(K.uid(p)))
        except Exception as e:  # a dump must never hide the original failure
            out.append(f"(dump incomplete: {e})")
        if self.local is not None:
            log = self.local.procnode_dir / "procnode.log"
            if log.exists():
                out += ["--- process node log (tail)", *log.read_text(errors="replace").splitlines()[-40:]]
        return "\n".join(out)
