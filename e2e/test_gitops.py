# ruff: noqa: F811  (pytest fixtures imported from test_operator are parameters here)
"""GitOps with a real Argo CD (v3.2.5): ModelDeployments synced from a git remote, each rollout seen
in Argo CD's health and sync status, the resource actions run through its CLI and API.

Argo CD's components run as processes beside the local cluster (modeldeploy_dev.argocd_stack), the
remote is a bare repository read over file://, the operator is the e2e's operator process. A push is
followed by a refresh annotation, which is what a git webhook does (Argo CD polls every 30 s here
otherwise). A watcher samples the Application and the ModelDeployment every 0.25 s throughout, so
the test can say what Argo CD showed at each point and count what nobody should have done: spec
writes by the operator, syncs triggered by drift.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from modeldeploy_dev.argocd_stack import NAMESPACE as ARGO_NS
from modeldeploy_dev.argocd_stack import ArgoCD, GitRemote, available
from modeldeploy_dev.load import Load
from modeldeploy_dev.rollout_scenario import ANALYSIS, tiny_model_pv, tiny_spec

from .conftest import E2ECluster
from .test_operator import Operator, crd_installed, get_md, operator  # noqa: F401  (fixtures)
from .test_rollout import pod_ips, stable_and_ready, stable_errors

NAME = "chat"
OPERATOR_MANAGER = "kopf"  # the field manager of the operator's writes (status, annotations it removes)


@pytest.fixture(scope="module")
def argocd(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArgoCD]:
    if (missing := available()) is not None:
        pytest.fail(f"Argo CD cannot run: {missing}")
    argo = ArgoCD(cluster.kubeconfig, tmp_path_factory.mktemp("argocd"))
    argo.install()
    try:
        argo.start()
        yield argo
    finally:
        argo.stop()
        for name in argo.procs:
            tail = argo.log(name)[-4000:]
            print(f"--- argocd {name} log (tail) ---\n{tail}")


@dataclass
class Seen:
    """One sample of what Argo CD and the object showed."""

    t: float
    sync: str
    revision: str
    health: str
    message: str
    phase: str
    generation: int


@dataclass
class Watcher:
    """Samples the Application's sync and health (and the resource's health message from the API
    server's resource tree) and the ModelDeployment every 0.25 s; bounded to 30 minutes."""

    argo: ArgoCD
    cluster: E2ECluster
    app: str
    ns: str
    samples: list[Seen] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + 1800
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                st = self.argo.application(self.app).get("status", {})
                md = get_md(self.cluster, self.ns, NAME)
            except Exception:  # noqa: BLE001 - the object not created yet; sample again
                self._stop.wait(0.25)
                continue
            self.samples.append(
                Seen(
                    time.monotonic(),
                    st.get("sync", {}).get("status", ""),
                    st.get("sync", {}).get("revision", ""),
                    st.get("health", {}).get("status", ""),
                    st.get("health", {}).get("message", ""),
                    md.get("status", {}).get("phase", ""),
                    md["metadata"]["generation"],
                )
            )
            self._stop.wait(0.25)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def since(self, t: float) -> list[Seen]:
        return [s for s in self.samples if s.t >= t]

    def story(self, t: float = 0.0) -> str:
        """The samples since `t` as the changes Argo CD showed, one line each."""
        lines, last = [], None
        for s in self.since(t):
            key = (s.sync, s.revision[:8], s.health, s.phase, s.generation)
            if key != last:
                at = f"{s.t - t:7.2f}s"
                lines.append(f"{at} {s.sync} at {s.revision[:8]}, {s.health}, {s.phase} gen {s.generation}")
                last = key
        return "\n".join(lines)


def md_yaml(ns: str, obj: dict[str, Any]) -> str:
    obj = copy.deepcopy(obj)
    obj["metadata"]["namespace"] = ns
    return yaml.safe_dump(obj, sort_keys=False)


def application(name: str, remote: GitRemote, path: str, ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": ARGO_NS},
        "spec": {
            "project": "default",
            "source": {"repoURL": remote.url, "targetRevision": "main", "path": path},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": ns},
            # retries take the newest commit (refresh), so a fix pushed after a failed sync is not
            # held up behind the failing revision's retries
            "syncPolicy": {
                "automated": {"prune": True, "selfHeal": True},
                "retry": {
                    "limit": 5,
                    "refresh": True,
                    "backoff": {"duration": "5s", "factor": 2, "maxDuration": "1m"},
                },
            },
        },
    }


class Api:
    """Argo CD's REST API as the admin user (what the UI and the CLI call)."""

    def __init__(self, argo: ArgoCD) -> None:
        self.base = f"http://127.0.0.1:{argo.ports['server']}/api/v1"
        r = httpx.post(
            f"{self.base}/session", json={"username": "admin", "password": argo.password}, timeout=30
        )
        r.raise_for_status()
        self.headers = {"Authorization": f"Bearer {r.json()['token']}"}

    def resource_health(self, app: str, kind: str, name: str) -> dict[str, Any]:
        tree = httpx.get(f"{self.base}/applications/{app}/resource-tree", headers=self.headers, timeout=30)
        tree.raise_for_status()
        node = next(n for n in tree.json().get("nodes", []) if n["kind"] == kind and n["name"] == name)
        return node.get("health", {})

    def run_action(self, app: str, ns: str, action: str, params: dict[str, str]) -> httpx.Response:
        body = {
            "name": app,
            "namespace": ns,
            "resourceName": NAME,
            "group": "serving.modeldeploy.dev",
            "kind": "ModelDeployment",
            "version": "v1alpha1",
            "action": action,
            "resourceActionParameters": [{"name": k, "value": v} for k, v in params.items()],
        }
        return httpx.post(
            f"{self.base}/applications/{app}/resource/actions/v2", json=body, headers=self.headers, timeout=30
        )


def app_state(argo: ArgoCD, app: str) -> tuple[str, str, str]:
    st = argo.application(app).get("status", {})
    return (
        st.get("sync", {}).get("status", ""),
        st.get("sync", {}).get("revision", ""),
        st.get("health", {}).get("status", ""),
    )


def wait_app(
    cluster: E2ECluster, argo: ArgoCD, app: str, sync: str, revision: str, health: str, timeout: float
) -> None:
    cluster.wait(
        lambda: app_state(argo, app) == (sync, revision, health) or None,
        timeout,
        f"Application {app} {sync} at {revision[:8]} and {health} (last: {app_state(argo, app)})",
    )


def test_bundles_from_git_roll_out_and_back_as_argocd_shows(
    cluster: E2ECluster, namespace: str, operator: Operator, argocd: ArgoCD, tmp_path: Path
) -> None:
    if cluster.process_node is None:
        pytest.skip("external $KUBECONFIG cluster: no process node")
    ns, app = namespace, f"md-{namespace[-12:]}"
    digest = tiny_model_pv(cluster, ns, tmp_path)
    remote = GitRemote(tmp_path / "git")
    path = f"apps/{ns}/{NAME}.yaml"
    spec = tiny_spec(NAME, digest)
    commits = [remote.commit({path: md_yaml(ns, spec)}, "chat: the tiny model, maxNumSeqs 8")]
    argocd.kubectl("apply", "-f", "-", input=json.dumps(application(app, remote, f"apps/{ns}", ns)))
    api = Api(argocd)
    # canary analysis needs traffic: 4 workers throughout (the slow bundle gets 4 more)
    with Watcher(argocd, cluster, app, ns) as watch, Load(cluster.api, ns, NAME, max_seconds=1500) as load:
        wait_app(cluster, argocd, app, "Synced", commits[-1], "Healthy", 300)
        first = get_md(cluster, ns, NAME)
        assert stable_and_ready(first), first.get("status")
        base = first["status"]["stable"]["bundle"]
        stable_ips = pod_ips(cluster, ns, base)

        # 1. a good bundle committed: synced, canary, promoted; Progressing then Healthy, Synced throughout
        good = copy.deepcopy(spec)
        good["spec"]["bundle"]["config"]["maxNumSeqs"] = 6
        t_push = time.monotonic()
        commits.append(remote.commit({path: md_yaml(ns, good)}, "chat: maxNumSeqs 6"))
        argocd.refresh(app)
        wait_app(cluster, argocd, app, "Synced", commits[-1], "Healthy", 300)
        t_healthy = time.monotonic()
        md = get_md(cluster, ns, NAME)
        assert md["status"]["stable"]["bundle"] != base and md["status"]["history"][-1]["bundle"] == base
        good_id = md["status"]["stable"]["bundle"]
        stable_ips |= pod_ips(cluster, ns, good_id)
        # from the sync of the new commit on: Synced, through Progressing to Healthy
        story = watch.story(t_push)
        print(f"Argo CD, git push -> promoted:\n{story}")
        pushed = [s for s in watch.since(t_push) if s.revision == commits[-1]]
        synced = next(i for i, s in enumerate(pushed) if s.sync == "Synced")
        after = pushed[synced:]
        assert {"Progressing", "Healthy"} <= {s.health for s in after}, story
        assert {s.sync for s in after} == {"Synced"}, story
        assert "Canary" in {s.phase for s in after}, story
        print(f"[timing] git push -> Argo CD Healthy on the promoted bundle: {t_healthy - t_push:.1f}s")

        # 2. a slow bundle committed: rolled back by the operator, Degraded in Argo CD with the reason;
        # git revert: Healthy again
        slow = copy.deepcopy(good)
        slow["spec"]["bundle"]["config"]["maxNumSeqs"] = 1
        slow["spec"]["rollout"]["analysis"] = ANALYSIS | {"maxTtftP95Ratio": 1.5, "minSamples": 10}
        with Load(cluster.api, ns, NAME, workers=4, max_seconds=400):
            commits.append(remote.commit({path: md_yaml(ns, slow)}, "chat: maxNumSeqs 1"))
            argocd.refresh(app)
            wait_app(cluster, argocd, app, "Synced", commits[-1], "Degraded", 400)
        md = get_md(cluster, ns, NAME)
        assert md["status"]["stable"]["bundle"] == good_id and len(md["status"]["failedBundles"]) == 1
        health = api.resource_health(app, "ModelDeployment", NAME)
        assert health["status"] == "Degraded" and "AnalysisFailed" in health["message"], health
        print(f"Argo CD shows the rollback: {health}")
        commits.append(remote.revert(commits[-1]))
        argocd.refresh(app)
        wait_app(cluster, argocd, app, "Synced", commits[-1], "Healthy", 120)
        assert get_md(cluster, ns, NAME)["status"]["stable"]["bundle"] == good_id

        # 3. a step that waits for a human: Suspended; the `promote` action (CLI) resumes it
        held = copy.deepcopy(good)
        held["spec"]["bundle"]["config"]["maxNumSeqs"] = 5
        held["spec"]["rollout"]["steps"] = [{"weight": 50, "pauseSeconds": 3, "awaitPromotion": True}]
        commits.append(remote.commit({path: md_yaml(ns, held)}, "chat: maxNumSeqs 5, promoted by hand"))
        argocd.refresh(app)
        wait_app(cluster, argocd, app, "Synced", commits[-1], "Suspended", 300)
        listed = argocd.run_cli(
            "app", "actions", "list", app, "--kind", "ModelDeployment", "--resource-name", NAME
        )
        assert "promote" in listed and "rollback-to" in listed, listed
        argocd.run_cli(
            "app", "actions", "run", app, "promote", "--kind", "ModelDeployment", "--resource-name", NAME,
            "--namespace", ns,
        )  # fmt: skip
        wait_app(cluster, argocd, app, "Synced", commits[-1], "Healthy", 180)
        md = get_md(cluster, ns, NAME)
        held_id = md["status"]["stable"]["bundle"]
        stable_ips |= pod_ips(cluster, ns, held_id)
        assert held_id not in (base, good_id) and "modeldeploy.dev/promote" not in md["metadata"].get(
            "annotations", {}
        )

        # 4. rollback-to through the API, with its parameter: the prior bundle serves, Argo CD says
        # Degraded (git still names the newer one) until git is reverted
        refused = api.run_action(app, ns, "rollback-to", {"bundle": "0000000000000000"})
        assert refused.status_code >= 400 and "not in status.history" in refused.text, refused.text
        assert api.run_action(app, ns, "rollback-to", {"bundle": good_id}).status_code == 200
        wait_app(cluster, argocd, app, "Synced", commits[-1], "Degraded", 120)
        assert get_md(cluster, ns, NAME)["status"]["stable"]["bundle"] == good_id
        commits.append(remote.revert(commits[-1]))
        argocd.refresh(app)
        wait_app(cluster, argocd, app, "Synced", commits[-1], "Healthy", 120)

        # 5. an invalid commit: refused by the CRD schema, Argo CD shows the message, nothing lost
        bad = copy.deepcopy(good)
        bad["spec"]["replicas"] = -1
        commits.append(remote.commit({path: md_yaml(ns, bad)}, "chat: replicas -1"))
        argocd.refresh(app)

        def refused_sync() -> dict[str, Any] | None:
            # Argo CD retries a failed automated sync (phase Running between tries), the reason kept
            op = argocd.application(app).get("status", {}).get("operationState", {})
            return op if "is invalid" in op.get("message", "") else None

        op = cluster.wait(refused_sync, 120, "the invalid commit's sync to fail")
        revs = {
            op.get("syncResult", {}).get("revision"),
            op.get("operation", {}).get("sync", {}).get("revision"),
        }
        assert commits[-1] in revs, op
        message = op.get("message", "")
        assert "spec.replicas" in message and "greater than or equal to 0" in message, message
        print(f"Argo CD on the invalid commit: {message}")
        md = get_md(cluster, ns, NAME)
        assert (
            md["spec"]["replicas"] == 1
            and stable_and_ready(md)
            and md["status"]["stable"]["bundle"] == good_id
        )
        commits.append(remote.revert(commits[-1]))
        argocd.refresh(app)
        wait_app(cluster, argocd, app, "Synced", commits[-1], "Healthy", 120)

        # 6. a hand edit: selfHeal puts git's spec back; the operator ends Stable on git's bundle
        generation = get_md(cluster, ns, NAME)["metadata"]["generation"]
        t_edit = time.monotonic()
        edit = {"spec": {"bundle": {"config": {"maxNumSeqs": 3}}}}
        cluster.custom.patch_namespaced_custom_object(
            "serving.modeldeploy.dev", "v1alpha1", ns, "modeldeployments", NAME, edit
        )
        cluster.wait(
            lambda: get_md(cluster, ns, NAME)["metadata"]["generation"] >= generation + 2 or None,
            60,
            "selfHeal to revert the hand edit",
        )
        wait_app(cluster, argocd, app, "Synced", commits[-1], "Healthy", 240)
        md = get_md(cluster, ns, NAME)
        assert (
            md["spec"]["bundle"]["config"]["maxNumSeqs"] == 6 and md["status"]["stable"]["bundle"] == good_id
        )

    # the stable cohort answered every request through all of it (the slow canary's 429s aside)
    print(f"load by pod ip (stable: {sorted(stable_ips)}): {load.by_ip()}")
    assert not stable_errors(load, stable_ips), (load.by_ip(), load.transport_errors)
    # nobody fought: the operator never owned a spec field, every sync in the history was of a new commit
    managers = {m["manager"]: m for m in md["metadata"].get("managedFields", [])}
    for name, m in managers.items():
        if "f:spec" in json.dumps(m.get("fieldsV1", {})):
            assert name.startswith("argocd"), (name, m)
    history = argocd.application(app)["status"].get("history", [])
    revisions = [h["revision"] for h in history]
    print(f"sync operations in the history: {len(revisions)} for {len(set(revisions))} revisions")
    assert len(revisions) == len(set(revisions)) and set(revisions) <= set(commits), (revisions, commits)
    # drift, as Argo CD saw it: OutOfSync at a revision it had already synced. None before the hand
    # edit (the operator's status writes, annotations it removes and the CRD's defaults are not
    # drift); the hand edit's own (selfHeal reverted it: the generation moved twice, above) is shown
    synced: set[str] = set()
    drift = []
    for s in watch.samples:
        if s.sync == "Synced":
            synced.add(s.revision)
        elif s.sync == "OutOfSync" and s.revision in synced:
            drift.append(s)
    print(f"drift samples before the hand edit: {sum(s.t < t_edit for s in drift)}, after: {len(drift)}")
    assert not [s for s in drift if s.t < t_edit], watch.story()
