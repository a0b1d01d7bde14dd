"""The real worker node (`modeldeploy cluster up --real-node`): kubelet + containerd v2 + runc + CNI.

A cluster of its own (no process node, no kwok nodes) with the real node `real-0`. The test
workload is probe (realnode/probe/main.go), pushed to the loopback registry and pulled BY DIGEST.
Shows: a pod under the restricted profile runs as its securityContext says; it has an address on
the node's bridge; a ClusterIP Service answers from the host and from another pod (kube-proxy);
the API is reachable from pods through the `kubernetes` Service; `kubectl logs` works; a digest
the registry lacks never runs; `down` leaves no process, mount, netns, link, rule or cgroup.
Then the product as shipped (operator and runtime images built here, by digest): helm install;
the runtime pod Ready, restricted in the kernel's eyes too (/proc), serving through its ClusterIP,
surviving its deletion under streams, a wrong engine digest rolled back; apply -> Ready with the
image cached; two operator replicas with the active one SIGKILLed mid-canary under load (the
standby promotes, each decision Event once), then a slow bundle rolled back by analysis.

Skipped, with the reason, where the node cannot run: not root, no cgroup filesystem, or the
Debian packages (runc, containernetworking-plugins, iptables) or a C compiler missing
(.ci/run installs them). With $KUBECONFIG set the module runs against that cluster only if it is
a `modeldeploy cluster up --real-node` cluster of this machine (then it is neither brought up nor
taken down, and the `down` test skips); any other cluster is skipped, because every test here
looks into the node itself (see EXTERNAL for the list). Identity: MODELDEPLOY_CLUSTER_NAME (+ "-rn"),
MODELDEPLOY_CLUSTER_NODE_BRIDGE, MODELDEPLOY_CLUSTER_NODE_POD_CIDR,
MODELDEPLOY_CLUSTER_REGISTRY_PORT, as for `modeldeploy cluster up --real-node`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from modeldeploy.operator.rollout.children import RUN_AS
from modeldeploy_dev.cluster.local import LocalCluster, cache_root, real_node_settings
from modeldeploy_dev.cluster.realnode import cleanup
from modeldeploy_dev.cluster.realnode.config import SERVICE_CIDR, SERVICE_IP
from modeldeploy_dev.cluster.realnode.oci import push_layout
from modeldeploy_dev.faults import container_pid
from modeldeploy_dev.rollout_scenario import tiny_model_local_pv

from .conftest import E2ECluster, restricted_security_context
from .test_rollout import ANALYSIS

ROOT = Path(__file__).resolve().parents[1]
G, V, P = "serving.modeldeploy.dev", "v1alpha1", "modeldeployments"
STREAMS = 4

pytestmark = [pytest.mark.e2e, pytest.mark.node_bins]


def local_real_node_cluster(kubeconfig: str) -> LocalCluster | None:
    """The local cluster whose kubeconfig this is, if it was brought up with `--real-node` and its
    node's kubelet and containerd run on this machine (what the tests below look into)."""
    kc = Path(kubeconfig).resolve()
    for f in sorted((cache_root() / "run").glob("*/kubeconfig")):
        if f.resolve() == kc:
            c = LocalCluster.existing(f.parent.name)
            node = c.real_node() if c.s.real_node else None
            return c if node is not None and node.pid("kubelet") and node.pid("containerd") else None
    return None


EXTERNAL = (
    "$KUBECONFIG names a cluster whose node is not a real node of this machine; these tests need "
    "what only that node gives: the containers' processes (/proc, `ctr`: uid, capabilities, seccomp, "
    "read-only root, `lo`; the operator SIGKILLed), its bridge (pod and operator /metrics addresses "
    "from the host), a registry it pulls from at 127.0.0.1 over plain HTTP, a `local` PV on this "
    "machine's disk for the model, and its host state for `down`. Point $KUBECONFIG at a "
    "`modeldeploy cluster up --real-node` cluster (without the operator chart installed) or unset it; "
    "a cluster of your own takes README 'On a cluster of your own'"
)


def _why_not() -> str | None:
    if (kc := os.environ.get("KUBECONFIG")) and local_real_node_cluster(kc) is None:
        return EXTERNAL
    if os.geteuid() != 0:
        return "the real node needs root (containerd, runc, bridge, iptables)"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no cgroup filesystem mounted"
    missing = [t for t in ("runc", "iptables-save", "ip", "openssl") if shutil.which(t) is None]
    missing += [
        f"/usr/lib/cni/{p}"
        for p in ("bridge", "host-local", "portmap", "loopback")
        if not Path(f"/usr/lib/cni/{p}").exists()
    ]
    if shutil.which(os.environ.get("CC", "cc")) is None:
        missing.append("a C compiler (cc)")
    if missing:
        return (
            f"real node prerequisites missing: {missing} "
            "(apt-get install runc containernetworking-plugins iptables gcc; .ci/run does)"
        )
    return None


def host_state() -> dict[str, set[str]]:
    """Host state only the node writes (other engineers' clusters and Docker builds change the
    rest of this shared machine meanwhile): kube-proxy/CNI iptables rules, CNI network
    namespaces, kubelet's and the node directory's mounts."""
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout.splitlines()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return {
        "rules": {r for r in rules if re.search(r"KUBE-|CNI-|realnode", r)},
        "netns": {n.split()[0] for n in netns if n.startswith("cni-")},
        "mounts": {m.split()[4] for m in mounts if re.search(r"/kubelet/|/realnode/", m.split()[4])},
    }


@pytest.fixture(scope="module")
def rn() -> Iterator[tuple[LocalCluster, E2ECluster, dict[str, set[str]]]]:
    if why := _why_not():
        pytest.skip(why)
    if kc := os.environ.get("KUBECONFIG"):  # a real-node cluster already up: used, never taken down
        c = local_real_node_cluster(kc)
        yield c, E2ECluster(kc, c), host_state()
        return
    c = LocalCluster(real_node_settings())
    c.down()  # a leftover of an interrupted run
    c.build()  # build-node.sh: cached after the first run
    before = host_state()
    c.up()
    try:
        yield c, E2ECluster(str(c.kubeconfig), c), before
    finally:
        c.down()


@pytest.fixture
def ns(rn) -> Iterator[str]:
    c, k, _ = rn
    name = f"rn-{os.urandom(3).hex()}"
    k.core.create_namespace(
        {"metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    k.wait(
        lambda: any(a.metadata.name == "default" for a in k.core.list_namespaced_service_account(name).items),
        60,
        "default ServiceAccount",
    )
    yield name
    k.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", check=False, timeout=150)


@pytest.fixture(scope="module")
def probe_ref(rn) -> str:
    c, _, _ = rn
    return push_layout(c.real_node().bins.probe_tar, c.registry().host, "modeldeploy/probe")


def probe_pod(
    name: str, image: str, args: list[str], labels: dict[str, str] | None = None, restart: str = "Always"
) -> dict:
    c = {
        "name": "probe",
        "image": image,
        "args": args,
        "securityContext": {**restricted_security_context(), "readOnlyRootFilesystem": True},
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
    }
    if args[0] == "serve":
        c["ports"] = [{"containerPort": 8080}]
        c["readinessProbe"] = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "containers": [c],
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": False,
        },
    }


def is_ready(p: Any) -> bool:  # a kubernetes V1Pod
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])


def pod_ready(k: E2ECluster, ns: str, name: str):  # noqa: ANN201
    p = k.core.read_namespaced_pod(name, ns)
    return p if is_ready(p) else None


def test_pod_pulled_by_digest_runs_restricted_and_serves_through_a_cluster_ip(rn, ns, probe_ref) -> None:
    c, k, _ = rn
    assert "@sha256:" in probe_ref and probe_ref.startswith("127.0.0.1:")
    k.core.create_namespaced_pod(ns, probe_pod("web", probe_ref, ["serve", ":8080"], {"app": "web"}))
    pod = k.wait(lambda: pod_ready(k, ns, "web"), 180, "pod web Ready")
    assert pod.spec.node_name == "real-0"
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(c.s.node_pod_cidr)
    cs = pod.status.container_statuses[0]
    assert cs.image_id.endswith(probe_ref.split("@")[1]), cs.image_id  # the bits pulled are the pinned ones

    # the container really runs as the securityContext says: uid 1000, no capabilities, seccomp
    # filter, read-only root; and containerd's CNI loopback network brought `lo` up
    assert_runs_restricted(c, cs.container_id, 1000)

    svc = k.core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    ip = svc.spec.cluster_ip
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(SERVICE_CIDR)

    def from_host() -> str | None:
        try:
            with urllib.request.urlopen(f"http://{ip}/", timeout=3) as r:
                return r.read().decode()
        except OSError:
            return None

    body = k.wait(from_host, 60, f"http://{ip}/ from the host (kube-proxy)")
    assert body.startswith("web "), body

    # from another pod, through the same ClusterIP
    k.core.create_namespaced_pod(
        ns, probe_pod("client", probe_ref, ["get", f"http://{ip}/"], restart="Never")
    )
    k.wait(
        lambda: k.core.read_namespaced_pod("client", ns).status.phase in ("Succeeded", "Failed"),
        120,
        "client pod to finish",
    )
    logs = k.kubectl("logs", "-n", ns, "client").stdout  # apiserver -> kubelet, with a CA client cert
    assert k.core.read_namespaced_pod("client", ns).status.phase == "Succeeded", logs
    assert logs.startswith("web "), logs
    assert ipaddress.ip_address(logs.split()[1].rsplit(":", 1)[0]) in ipaddress.ip_network(c.s.node_pod_cidr)


def test_pods_reach_the_api_through_the_kubernetes_service(rn, ns, probe_ref) -> None:
    """The in-cluster path the operator pod takes: https://10.0.0.1 (the `kubernetes` Service,
    DNATed by kube-proxy to the apiserver on the bridge), verified against the ServiceAccount's
    ca.crt, so the serving certificate names the Service IP."""
    _, k, _ = rn
    ca = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    body = probe_pod("api", probe_ref, ["get", f"https://{SERVICE_IP}/healthz", ca], restart="Never")
    body["spec"]["automountServiceAccountToken"] = True
    k.core.create_namespaced_pod(ns, body)
    k.wait(
        lambda: k.core.read_namespaced_pod("api", ns).status.phase in ("Succeeded", "Failed"),
        120,
        "api pod to finish",
    )
    logs = k.kubectl("logs", "-n", ns, "api").stdout
    assert k.core.read_namespaced_pod("api", ns).status.phase == "Succeeded", logs
    assert logs == "ok", logs


def test_a_digest_the_registry_lacks_never_runs(rn, ns, probe_ref) -> None:
    _, k, _ = rn
    repo = probe_ref.split("@")[0]
    wrong = f"{repo}@sha256:{'0' * 64}"
    k.core.create_namespaced_pod(ns, probe_pod("wrong", wrong, ["serve", ":8080"]))

    def pull_failed():  # noqa: ANN202
        cs = k.core.read_namespaced_pod("wrong", ns).status.container_statuses or []
        w = cs[0].state.waiting if cs else None
        return w if w and w.reason in ("ErrImagePull", "ImagePullBackOff") else None

    w = k.wait(pull_failed, 120, "ErrImagePull")
    assert "0" * 64 in (w.message or ""), w.message
    assert k.core.read_namespaced_pod("wrong", ns).status.container_statuses[0].container_id is None


@pytest.fixture(scope="module")
def images(rn) -> Iterator[Callable[[str], str]]:
    """images(name) -> the reference by digest of the operator or runtime image, built on the
    debootstrapped base and pushed to the node's registry on first use (Docker's layer cache and
    the registry make later builds cheap). A Docker engine is started for the module when none
    answers (images.docker_engine)."""
    from modeldeploy_dev.cluster.realnode import images as img

    with img.docker_engine() as why:
        if why:
            pytest.skip(f"cannot build the images: {why}")
        c, _, _ = rn
        refs: dict[str, str] = {}

        def get(name: str) -> str:
            if name not in refs:
                refs[name] = img.build_runtime_or_operator(c.registry().host, name)
            return refs[name]

        yield get


def test_operator_image_carries_no_torch_and_no_test_code(images) -> None:
    """On the built image, as pushed: the base install only, no test infrastructure."""
    code = (
        "import importlib.util as u, importlib.metadata as m, sys, modeldeploy.operator.handlers;"
        "print(sorted(n for n in ('torch', 'transformers', 'modeldeploy_dev', 'modeldeploy.e2e', 'pytest')"
        " if u.find_spec(n.split('.')[0]) and u.find_spec(n)), 'torch' in sys.modules,"
        " sorted(d.metadata['Name'] for d in m.distributions()"
        " if d.metadata['Name'].startswith('modeldeploy')))"
    )
    r = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "python3",
            images("operator"),
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "False", "['modeldeploy']"], r.stdout


def tiny_md(name: str, engine: str, model_digest: str) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "modeldeployment-tiny.yaml").read_text())
    doc["metadata"]["name"] = name
    b = doc["spec"]["bundle"]
    b["engine"]["image"] = engine
    b["model"] = {"uri": "pvc://models/tiny-llama", "revision": "seed0", "digest": model_digest}
    b["tokenizer"] = {"revision": "seed0", "digest": model_digest}
    # The example's bounds are the real model's (maxModelLen 2048); the tiny model serves its own 1024.
    b.get("config", {}).pop("maxModelLen", None)
    doc["spec"]["topology"] = {"gpusPerReplica": 0, "nodeSelector": {"modeldeploy.dev/node-kind": "real"}}
    doc["spec"]["readiness"] = {"loadTimeoutSeconds": 300}
    return doc


def md_ready(k: E2ECluster, ns: str, name: str):  # noqa: ANN201
    md = k.custom.get_namespaced_custom_object(
        "serving.modeldeploy.dev", "v1alpha1", ns, "modeldeployments", name
    )
    conds = {c["type"]: c for c in md.get("status", {}).get("conditions", [])}
    return md if conds.get("Ready", {}).get("status") == "True" else None


@pytest.fixture(scope="module")
def operator_release(rn, images) -> Iterator[str]:
    """`helm install` of charts/modeldeploy-operator with the operator image by digest, in a
    namespace of its own labelled enforce=restricted; yields that namespace."""
    _, k, _ = rn
    op_ns = f"rn-op-{os.urandom(3).hex()}"
    k.core.create_namespace(
        {"metadata": {"name": op_ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    repo, digest = images("operator").split("@")
    t0 = time.monotonic()
    k.helm(
        "install",
        "mdop",
        str(ROOT / "charts" / "modeldeploy-operator"),
        "-n",
        op_ns,
        "--set",
        f"image.repository={repo}",
        "--set",
        f"image.digest={digest}",
        "--wait",
        "--timeout",
        "5m",
        timeout=330,
    )
    print(f"[timing] helm install -> operator Ready {time.monotonic() - t0:.1f}s")
    yield op_ns
    k.helm("uninstall", "mdop", "-n", op_ns, "--wait", check=False)
    k.kubectl("delete", "namespace", op_ns, "--wait=false", check=False)


def test_helm_installed_operator_pod_is_ready_on_the_real_node(rn, images, operator_release) -> None:
    """The operator as shipped: a pod on real-0 in a restricted namespace, image by digest, with
    its ServiceAccount's RBAC only (no Secrets, no writes to what it does not manage)."""
    _, k, _ = rn
    pods = k.core.list_namespaced_pod(operator_release).items
    assert len(pods) == 1 and pods[0].spec.node_name == "real-0", [p.metadata.name for p in pods]
    op = pods[0]
    assert op.spec.containers[0].image == images("operator")
    cs = op.status.container_statuses[0]
    assert cs.ready and cs.image_id.endswith(images("operator").split("@")[1]), cs

    # only its ServiceAccount's RBAC: no Secrets, nothing it does not manage
    sa = f"system:serviceaccount:{operator_release}:{op.spec.service_account_name}"

    def can(*args: str) -> bool:
        r = k.kubectl("auth", "can-i", *args, f"--as={sa}", check=False)
        assert r.stdout.strip() in ("yes", "no"), r.stdout + r.stderr
        return r.stdout.strip() == "yes"

    assert can("patch", "deployments.apps", "-n", "default")  # what it manages (the control)
    for verb, what in (
        ("get", "secrets"),
        ("list", "secrets"),
        ("create", "pods"),
        ("delete", "nodes"),
        ("create", "clusterrolebindings"),
        ("update", "modeldeployments.serving.modeldeploy.dev"),
        ("delete", "customresourcedefinitions"),
    ):
        assert not can(verb, what, "-A"), f"the operator's ServiceAccount may {verb} {what}"


def test_runtime_image_by_digest_serves_a_chat_through_the_cluster_ip(
    rn, ns, images, operator_release, tmp_path
) -> None:
    """`kubectl apply` a ModelDeployment whose engine is the runtime image by digest and whose
    model is on a local PV: the operator (the helm-installed pod) makes the Deployment, the
    runtime pod passes its startup probe, a chat completion through the ClusterIP answers, streams
    in flight survive the pod's deletion, and a wrong engine digest is rolled back naming the image."""
    import httpx

    c, k, _ = rn
    model_digest = tiny_model_local_pv(k, ns, tmp_path)
    runtime = images("runtime")
    try:
        t0 = time.monotonic()
        k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(tiny_md("tiny", runtime, model_digest)))
        k.wait(lambda: md_ready(k, ns, "tiny"), 900, "ModelDeployment tiny Ready")
        print(f"[timing] kubectl apply -> runtime Ready {time.monotonic() - t0:.1f}s")
        pod = next(p for p in k.core.list_namespaced_pod(ns).items if p.metadata.name.startswith("tiny-"))
        assert pod.spec.node_name == "real-0"
        serve = pod.status.container_statuses[0]
        assert serve.ready and serve.image_id.endswith(runtime.split("@")[1]), serve
        assert pod.spec.containers[0].startup_probe.http_get.path == "/health/ready"
        # the runtime really runs under the securityContext the operator generated (uid 65532)
        sc = pod.spec.containers[0].security_context
        assert sc.read_only_root_filesystem and sc.run_as_user == RUN_AS, sc
        assert_runs_restricted(c, serve.container_id, RUN_AS)
        svc = k.core.read_namespaced_service("tiny", ns)
        base = f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"

        def models() -> str | None:  # kube-proxy programs the new endpoint asynchronously
            try:
                return httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
            except httpx.TransportError:
                return None

        model = k.wait(models, 60, f"{base}/v1/models through the ClusterIP")
        r = httpx.post(
            f"{base}/v1/chat/completions",
            timeout=120,
            json={"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8},
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0, r.text

        # the serving pod deleted under streaming load: kubelet's SIGTERM, the preStop hook and the
        # grace period let every in-flight stream finish
        started, results, ended = threading.Barrier(STREAMS + 1, timeout=120), [], []

        def stream() -> None:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "count"}],
                "max_tokens": 160,
                "stream": True,
                "ignore_eos": True,
            }
            try:
                with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=180) as r:
                    chunks = r.iter_text()
                    first = next(chunks, "")
                    started.wait()
                    results.append((r.status_code, "[DONE]" in first + "".join(chunks)))
                    ended.append(time.monotonic())
            except Exception as e:  # noqa: BLE001 - every failure is a result to report
                results.append((repr(e), False))

        threads = [threading.Thread(target=stream) for _ in range(STREAMS)]
        for t in threads:
            t.start()
        started.wait()  # every stream has its first bytes
        k.core.delete_namespaced_pod(pod.metadata.name, ns)
        deleted = time.monotonic()
        for t in threads:
            t.join(240)
        assert results == [(200, True)] * STREAMS, results
        assert max(ended) > deleted, "every stream ended before the deletion: the test proved nothing"

        # status read right after the deletion can still be the one from before it (the operator has
        # not seen the drop yet): wait for the replacement pod, then for status to say Ready with it
        def replacement():  # noqa: ANN202
            return next(
                (
                    p
                    for p in k.core.list_namespaced_pod(ns).items
                    if p.metadata.name.startswith("tiny-")
                    and p.metadata.name != pod.metadata.name
                    and is_ready(p)
                ),
                None,
            )

        k.wait(replacement, 600, "a replacement pod Ready after the pod deletion")
        k.wait(lambda: md_ready(k, ns, "tiny"), 120, "tiny Ready again after the pod deletion")
        k.wait(models, 60, "the replacement pod through the ClusterIP")

        # a wrong engine digest: the pod cannot pull it, so those bits never run, and the rollout
        # rolls back to the bundle that serves, naming the image
        stable = k.wait(lambda: md_ready(k, ns, "tiny"), 120, "tiny Ready")["status"]["stable"]["bundle"]
        wrong = runtime.split("@")[0] + "@sha256:" + "0" * 64
        patch = {"spec": {"bundle": {"engine": {"image": wrong}}}}
        k.kubectl("patch", "md", "tiny", "-n", ns, "--type=merge", "-p", json.dumps(patch))
        ran: list[str] = []

        def rolled_back():  # noqa: ANN202
            for p in k.core.list_namespaced_pod(ns).items:
                for cs in p.status.container_statuses or []:
                    if cs.image == wrong and (cs.container_id or cs.state.running):
                        ran.append(p.metadata.name)
            md = k.custom.get_namespaced_custom_object(G, V, ns, P, "tiny")
            conds = {c["type"]: c for c in md.get("status", {}).get("conditions", [])}
            deg = conds.get("Degraded", {})
            done = md["status"].get("phase") == "Stable" and deg.get("status") == "True"
            return md if done else None

        md = k.wait(rolled_back, 600, "rollback of the wrong engine digest")
        deg = next(c for c in md["status"]["conditions"] if c["type"] == "Degraded")
        assert wrong in deg["message"] and "cannot be pulled" in deg["message"], deg
        assert md["status"]["stable"]["bundle"] == stable
        assert ran == [], f"pods ran the wrong image: {ran}"
        events = k.core.list_namespaced_event(ns).items
        assert any(wrong in (e.message or "") and e.reason == "CanaryFailed" for e in events), [
            (e.reason, e.message) for e in events
        ]
        r = httpx.post(
            f"{base}/v1/chat/completions",
            timeout=120,
            json={"model": model, "messages": [{"role": "user", "content": "again"}], "max_tokens": 4},
        )
        assert r.status_code == 200, r.text  # the prior bundle still serves

        # apply -> Ready once more, the runtime image now in the node's containerd: no pull
        k.kubectl("delete", "md", "tiny", "-n", ns, "--wait=true", timeout=180)
        k.wait(
            lambda: (
                not [p for p in k.core.list_namespaced_pod(ns).items if p.metadata.name.startswith("tiny-")]
            ),
            180,
            "tiny's pods gone",
        )
        t0 = time.monotonic()
        k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(tiny_md("tiny", runtime, model_digest)))
        k.wait(lambda: md_ready(k, ns, "tiny"), 600, "ModelDeployment tiny Ready again (image cached)")
        print(
            f"[timing] kubectl apply -> runtime Ready, image cached on the node {time.monotonic() - t0:.1f}s"
        )
        pod = next(p for p in k.core.list_namespaced_pod(ns).items if p.metadata.name.startswith("tiny-"))
        pulls = [
            e.message
            for e in k.core.list_namespaced_event(ns).items
            if e.involved_object.name == pod.metadata.name and e.reason in ("Pulling", "Pulled")
        ]
        assert pulls and all("already present on machine" in m for m in pulls), pulls
    finally:
        k.kubectl("delete", "-n", ns, "modeldeployments", "--all", "--wait=true", check=False, timeout=180)
        k.kubectl("delete", "pv", f"{ns}-models", "--wait=false", check=False)


def peers(k: E2ECluster) -> dict[str, dict]:
    """The live entries of the chart's ClusterKopfPeering `modeldeploy`: pod name -> kopf's record."""
    body = k.custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", "modeldeploy")
    now = dt.datetime.now(dt.UTC)
    return {
        pid: info
        for pid, info in (body.get("status") or {}).items()
        if dt.datetime.fromisoformat(info["lastseen"]) + dt.timedelta(seconds=info["lifetime"]) > now
    }


def operator_metric(ip: str, name: str, **labels: str) -> float:
    """One sample of an operator pod's /metrics (0 when absent: counters appear on first use)."""
    with urllib.request.urlopen(f"http://{ip}:8080/metrics", timeout=5) as r:
        for fam in text_string_to_metric_families(r.read().decode()):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(a) == b for a, b in labels.items()):
                    return s.value
    return 0.0


def test_operator_leader_killed_mid_canary_under_load_then_a_slow_bundle_rolled_back(
    rn, ns, images, operator_release, tmp_path
) -> None:
    """Two operator replicas (helm --set replicaCount=2, kopf peering): one active. SIGKILL of the
    active one's process in the canary step, under closed-loop load: the standby takes over, the
    good bundle is promoted, every decision Event is posted once, no request fails. Then a slow
    bundle (one sequence slot under 8-way load) is rolled back by analysis (TTFT), stable unharmed.
    Prints the rollout wall times, to set beside the process node's (bench/results/real_node.md)."""
    from modeldeploy_dev.load import Load

    c, k, _ = rn
    op_ns, chart = operator_release, str(ROOT / "charts" / "modeldeploy-operator")
    t0 = time.monotonic()
    k.helm(
        "upgrade",
        "mdop",
        chart,
        "-n",
        op_ns,
        "--reuse-values",
        "--set",
        "replicaCount=2",
        "--wait",
        "--timeout",
        "5m",
        timeout=330,
    )
    print(f"[timing] helm upgrade replicaCount=2 -> both operator pods Ready {time.monotonic() - t0:.1f}s")

    def two_peers():  # noqa: ANN202 - both pods Ready and both in the peering object
        pods = {
            p.metadata.name: p
            for p in k.core.list_namespaced_pod(op_ns).items
            if p.metadata.deletion_timestamp is None and pod_ready(k, op_ns, p.metadata.name)
        }
        live = peers(k)
        return (pods, live) if len(pods) == 2 and set(pods) <= set(live) else None

    pods, live = k.wait(two_peers, 120, "2 operator pods Ready, both peering")
    assert len({live[n]["priority"] for n in pods}) == 2, live  # equal priorities would pause both
    leader = max(pods, key=lambda n: live[n]["priority"])
    (standby,) = set(pods) - {leader}

    digest = tiny_model_local_pv(k, ns, tmp_path)
    doc = tiny_md("ha", images("runtime"), digest)
    doc["spec"]["bundle"]["config"] = {
        "maxNumSeqs": 8,
        "maxQueue": 64,
        "device": "cpu",
        "servedModelName": "tiny-llama",
    }
    # the step and analysis of e2e/test_rollout.py's serve_tiny: the wall times compare with the
    # process node's
    doc["spec"]["rollout"] = {
        "steps": [{"weight": 50, "pauseSeconds": 5}],
        "analysis": ANALYSIS,
        "progressDeadlineSeconds": 900,
        "keepPrevious": {"replicas": 0},
    }
    try:
        t0 = time.monotonic()
        k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
        k.wait(lambda: md_ready(k, ns, "ha"), 600, "ModelDeployment ha Ready")
        print(
            "[timing] kubectl apply -> runtime Ready (image cached, 2 operator replicas) "
            f"{time.monotonic() - t0:.1f}s"
        )
        old = k.custom.get_namespaced_custom_object(G, V, ns, P, "ha")["status"]["stable"]["bundle"]

        def phase(*want: str):  # noqa: ANN202
            md = k.custom.get_namespaced_custom_object(G, V, ns, P, "ha")
            return md if md.get("status", {}).get("phase") in want else None

        def set_config(**kv: int) -> None:
            spec = k.custom.get_namespaced_custom_object(G, V, ns, P, "ha")["spec"]
            k.custom.patch_namespaced_custom_object(
                G, V, ns, P, "ha", {"spec": {"bundle": {"config": {**spec["bundle"]["config"], **kv}}}}
            )

        with Load(k.api, ns, "ha", workers=4) as load:
            t0 = time.monotonic()
            set_config(maxNumSeqs=6)
            k.wait(lambda: phase("Canary"), 600, "ha in its canary step")
            op = k.core.read_namespaced_pod(leader, op_ns)
            os.kill(container_pid(c, op.status.container_statuses[0].container_id), signal.SIGKILL)
            killed = time.monotonic()
            done = k.wait(lambda: phase("Stable"), 600, "ha Stable after the leader's kill")
            good_s = time.monotonic() - t0
        st = done["status"]
        assert st["stable"]["bundle"] != old and not st.get("failedBundles"), (st, events(k, ns, "ha"))
        print(f"[timing] good bundle change -> promoted, leader killed {killed - t0:.1f}s in: {good_s:.1f}s")
        reasons = Counter(r for r, _ in events(k, ns, "ha"))
        for r in ("NewBundle", "CanaryReady", "ConformancePassed", "Promoted"):
            assert reasons[r] == 1, (r, reasons)  # each decision exactly once across the takeover
        seen = load.by_ip()
        print(f"[load] promotion across the leader's kill, by pod ip: {dict(seen)}")
        assert not {ip: n for ip, n in seen.items() if set(n) - {200}}, (seen, load.transport_errors)
        assert sum(sum(n.values()) for n in seen.values()) > 20, seen

        # the standby took over: the promotion is its decision; the killed one came back as standby
        ips = {n: k.core.read_namespaced_pod(n, op_ns).status.pod_ip for n in (leader, standby)}
        assert operator_metric(ips[standby], "modeldeploy_operator_events_total", reason="Promoted") == 1
        k.wait(
            lambda: (lambda p: p and p.status.container_statuses[0].restart_count >= 1)(
                pod_ready(k, op_ns, leader)
            ),
            120,
            "the killed operator container restarted and Ready",
        )
        live = k.wait(
            lambda: (lambda p: p if leader in p and standby in p else None)(peers(k)),
            90,
            "the restarted replica back in the peering",
        )
        assert live[standby]["priority"] > live[leader]["priority"], live  # the older process stays active
        assert operator_metric(ips[leader], "modeldeploy_operator_events_total", reason="Promoted") == 0

        # a slow bundle: one sequence slot under 8-way load; analysis (TTFT p95) rolls it back
        analysis = ANALYSIS | {"maxTtftP95Ratio": 1.5, "minSamples": 10}
        k.custom.patch_namespaced_custom_object(
            G, V, ns, P, "ha", {"spec": {"rollout": {"analysis": analysis}}}
        )
        stable = st["stable"]["bundle"]
        stable_ips = {
            p.status.pod_ip
            for p in k.core.list_namespaced_pod(ns, label_selector=f"modeldeploy.dev/bundle={stable}").items
        }
        with Load(k.api, ns, "ha", workers=8) as load:
            t0 = time.monotonic()
            set_config(maxNumSeqs=1)
            md = k.wait(
                lambda: (lambda m: m if m and m["status"].get("failedBundles") else None)(phase("Stable")),
                600,
                "slow bundle rolled back",
            )
            slow_s = time.monotonic() - t0
        print(f"[timing] slow bundle change -> rolled back by analysis: {slow_s:.1f}s")
        deg = next(x for x in md["status"]["conditions"] if x["type"] == "Degraded")
        # the whole decision trail in the message: a gate failure names its check only in full there
        assert deg["status"] == "True" and deg["reason"] == "AnalysisFailed", (
            deg,
            events(k, ns, "ha"),
            load.by_ip(),
        )
        assert md["status"]["stable"]["bundle"] == stable, md["status"]
        ttft = next(m for m in md["status"]["lastAnalysis"]["metrics"] if m["metric"] == "ttft_p95_seconds")
        assert ttft["verdict"] == "Fail" and ttft["canary"] > ttft["threshold"], ttft
        seen = load.by_ip()
        print(f"[load] slow canary and its rollback, by pod ip (stable {stable_ips}): {dict(seen)}")
        assert not {ip: n for ip, n in seen.items() if ip in stable_ips and set(n) - {200}}, seen
        reasons = Counter(r for r, _ in events(k, ns, "ha"))
        assert reasons["AnalysisFailed"] == 1 and reasons["NewBundle"] == 2, reasons
    finally:
        k.kubectl("delete", "-n", ns, "modeldeployments", "--all", "--wait=true", check=False, timeout=180)
        k.kubectl("delete", "pv", f"{ns}-models", "--wait=false", check=False)


def events(k: E2ECluster, ns: str, name: str) -> list[tuple[str, str]]:
    evs = sorted(
        (e for e in k.core.list_namespaced_event(ns).items if e.involved_object.name == name),
        key=lambda e: e.metadata.creation_timestamp,
    )
    return [(e.reason, e.message) for e in evs]


def test_down_leaves_nothing_behind(rn, probe_ref) -> None:
    """Last in this module: down with a pod still running, then nothing of the node remains."""
    if os.environ.get("KUBECONFIG"):
        pytest.skip("$KUBECONFIG's cluster is not this module's to take down")
    c, k, before = rn
    k.core.create_namespaced_pod("default", probe_pod("left", probe_ref, ["serve", ":8080"]))
    k.wait(lambda: pod_ready(k, "default", "left"), 180, "pod left Ready")
    base, bridge = c.real_node().lay.base, c.s.node_bridge
    links = cleanup.links(bridge)  # the bridge and the running pods' veths
    assert len(links) >= 2 and cleanup.mounts(base) and cleanup.processes(base), "nothing to clean up?"
    c.down()
    assert cleanup.leftovers(base, bridge) == []
    gone = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert not [n for n in links if f" {n}:" in gone or f" {n}@" in gone], gone
    after = host_state()
    for key in before:
        assert after[key] - before[key] == set(), f"{key} left behind: {sorted(after[key] - before[key])}"
    assert not base.exists()
    assert not c.registry().pid()


def assert_runs_restricted(c: LocalCluster, container_id: str, uid: int) -> None:
    """What the kernel says of the container's main process (not what the API says): every uid
    is `uid` (non-root), no effective or permitted capability, no_new_privs, seccomp in filter
    mode (RuntimeDefault), `/` mounted read-only, and `lo` UP in its network namespace."""
    assert uid != 0
    pid = container_pid(c, container_id)
    status = Path(f"/proc/{pid}/status").read_text()
    assert re.search(rf"^Uid:\s+{uid}\s+{uid}\s+{uid}\s+{uid}$", status, re.M), status
    assert re.search(r"^CapEff:\s+0+$", status, re.M), status
    assert re.search(r"^CapPrm:\s+0+$", status, re.M), status
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), status
    assert re.search(r"^Seccomp:\s+2$", status, re.M), status  # 2 = SECCOMP_MODE_FILTER
    mounts = [m.split() for m in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]
    roots = [m for m in mounts if m[4] == "/"]
    assert roots and "ro" in roots[-1][5].split(","), roots  # the topmost mount on / of its mount namespace
    lo = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "ip", "-o", "link", "show", "lo"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.search(r"<[^>]*\bUP\b", lo), lo
