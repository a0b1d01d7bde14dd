"""The real worker node (`modeldeploy cluster up --real-node`): kubelet + containerd v2 + runc + CNI.

A cluster of its own (no process node, no kwok nodes) with the real node `real-0`. The test
workload is probe (realnode/probe/main.go), pushed to the loopback registry and pulled BY DIGEST.
Shows: a pod under the restricted profile runs as its securityContext says; it has an address on
the node's bridge; a ClusterIP Service answers from the host and from another pod (kube-proxy);
the API is reachable from pods through the `kubernetes` Service; `kubectl logs` works; a digest
the registry lacks never runs; `down` leaves no process, mount, netns, link, rule or cgroup.

Skipped, with the reason, where the node cannot run: not root, no cgroup filesystem, or the
Debian packages (runc, containernetworking-plugins, iptables) or a C compiler missing
(.ci/run installs them). Identity: MODELDEPLOY_CLUSTER_NAME (+ "-rn"),
MODELDEPLOY_CLUSTER_NODE_BRIDGE, MODELDEPLOY_CLUSTER_NODE_POD_CIDR,
MODELDEPLOY_CLUSTER_REGISTRY_PORT, as for `modeldeploy cluster up --real-node`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from modeldeploy_dev.cluster.local import LocalCluster, Settings
from modeldeploy_dev.cluster.realnode import cleanup
from modeldeploy_dev.cluster.realnode.config import SERVICE_CIDR, SERVICE_IP
from modeldeploy_dev.cluster.realnode.oci import push_layout

from .conftest import E2ECluster, restricted_security_context

ROOT = Path(__file__).resolve().parents[1]
G, V, P = "serving.modeldeploy.dev", "v1alpha1", "modeldeployments"
STREAMS = 4

pytestmark = pytest.mark.e2e


def _why_not() -> str | None:
    if os.environ.get("KUBECONFIG"):
        return "external $KUBECONFIG: the real node is part of the local cluster"
    if os.geteuid() != 0:
        return "the real node needs root (containerd, runc, bridge, iptables)"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no cgroup filesystem mounted"
    missing = [t for t in ("runc", "iptables-save", "ip", "openssl") if shutil.which(t) is None]
    if not Path("/usr/lib/cni/bridge").exists():
        missing.append("/usr/lib/cni/bridge")
    if shutil.which(os.environ.get("CC", "cc")) is None:
        missing.append("a C compiler (cc)")
    if missing:
        return f"real node prerequisites missing: {missing} (apt-get install runc containernetworking-plugins iptables gcc; .ci/run does)"
    return None


def settings() -> Settings:
    s = Settings(gpu_nodes=0, process_node="", real_node=True)
    s.name = f"{s.name}-rn"
    s.bridge, s.pod_cidr = s.node_bridge, s.node_pod_cidr  # no process node: its fields are unused
    return s


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
    c = LocalCluster(settings())
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
    k.wait(lambda: any(a.metadata.name == "default" for a in k.core.list_namespaced_service_account(name).items),
           60, "default ServiceAccount")  # fmt: skip
    yield name
    k.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", check=False, timeout=150)


@pytest.fixture(scope="module")
def probe_ref(rn) -> str:
    c, _, _ = rn
    return push_layout(c.real_node().bins.probe_tar, c.registry().host, "modeldeploy/probe")


def probe_pod(name: str, image: str, args: list[str], labels: dict[str, str] | None = None,
              restart: str = "Always") -> dict:  # fmt: skip
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
        "spec": {"containers": [c], "restartPolicy": restart, "terminationGracePeriodSeconds": 5,
                 "automountServiceAccountToken": False},
    }  # fmt: skip


def pod_ready(k: E2ECluster, ns: str, name: str):  # noqa: ANN201
    p = k.core.read_namespaced_pod(name, ns)
    return p if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []) else None


def test_pod_pulled_by_digest_runs_restricted_and_serves_through_a_cluster_ip(rn, ns, probe_ref) -> None:
    c, k, _ = rn
    assert "@sha256:" in probe_ref and probe_ref.startswith("127.0.0.1:")
    k.core.create_namespaced_pod(ns, probe_pod("web", probe_ref, ["serve", ":8080"], {"app": "web"}))
    pod = k.wait(lambda: pod_ready(k, ns, "web"), 180, "pod web Ready")
    assert pod.spec.node_name == "real-0"
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(c.s.node_pod_cidr)
    cs = pod.status.container_statuses[0]
    assert cs.image_id.endswith(probe_ref.split("@")[1]), cs.image_id  # the bits pulled are the pinned ones

    # the container really runs as the securityContext says: uid 1000 and no capabilities
    pid = _container_pid(c, cs.container_id)
    status = Path(f"/proc/{pid}/status").read_text()
    assert re.search(r"^Uid:\s+1000\s", status, re.M), status
    assert re.search(r"^CapEff:\s+0+$", status, re.M), status
    assert re.search(r"^Seccomp:\s+2$", status, re.M), status  # RuntimeDefault = filter mode

    svc = k.core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },  # fmt: skip
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
    k.wait(lambda: k.core.read_namespaced_pod("client", ns).status.phase in ("Succeeded", "Failed"), 120,
           "client pod to finish")  # fmt: skip
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
    k.wait(lambda: k.core.read_namespaced_pod("api", ns).status.phase in ("Succeeded", "Failed"), 120,
           "api pod to finish")  # fmt: skip
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
def images(rn) -> Callable[[str], str]:
    """images(name) -> the reference by digest of the operator or runtime image, built on the
    debootstrapped base and pushed to the node's registry on first use (Docker's layer cache and
    the registry make later builds cheap)."""
    from modeldeploy_dev.cluster.realnode import images as img

    if why := img.engine_ready():
        pytest.skip(f"cannot build the images: {why}")
    c, _, _ = rn
    refs: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in refs:
            (b,) = img.build_all(c.registry().host, [name])
            print(
                f"[images] {b.ref} build {b.build_s:.0f}s push {b.push_s:.0f}s size {b.size_bytes / 1e6:.0f} MB"
            )
            refs[name] = b.ref
        return refs[name]

    return get


def test_operator_image_carries_no_torch_and_no_test_code(images) -> None:
    """On the built image, as pushed: the base install only, no test infrastructure."""
    code = (
        "import importlib.util as u, importlib.metadata as m, sys, modeldeploy.operator.handlers;"
        "print(sorted(n for n in ('torch', 'transformers', 'modeldeploy_dev', 'modeldeploy.e2e', 'pytest')"
        " if u.find_spec(n.split('.')[0]) and u.find_spec(n)), 'torch' in sys.modules,"
        " sorted(d.metadata['Name'] for d in m.distributions() if d.metadata['Name'].startswith('modeldeploy')))"
    )
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
                        images("operator"), "-c", code], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "False", "['modeldeploy']"], r.stdout


def local_pv_with_tiny_model(k: E2ECluster, ns: str, root: Path) -> str:
    """A `local` PersistentVolume on real-0 holding a tiny model, claimed as `models` in ns;
    returns the model digest."""
    from modeldeploy.digest import dir_digest
    from modeldeploy.runtime.tiny_model import make_tiny_model

    (root / "models").mkdir(parents=True, exist_ok=True)
    (root / "models").chmod(0o755)
    model = make_tiny_model(root / "models" / "tiny-llama")
    # readable by the pod's user: kubelet applies no fsGroup ownership to a read-only volume
    # (seen here: PermissionError on model.safetensors, written 0600)
    for f in [model, *model.rglob("*")]:
        f.chmod(0o755 if f.is_dir() else 0o644)
    pv = f"{ns}-models"
    affinity = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["real-0"]}]}]}}  # fmt: skip
    k.core.create_persistent_volume({"metadata": {"name": pv}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
        "persistentVolumeReclaimPolicy": "Retain", "local": {"path": str(root / "models")},
        "nodeAffinity": affinity, "claimRef": {"namespace": ns, "name": "models"}}})  # fmt: skip
    k.core.create_namespaced_persistent_volume_claim(ns, {"metadata": {"name": "models"}, "spec": {
        "accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
        "resources": {"requests": {"storage": "1Gi"}}}})  # fmt: skip
    return dir_digest(model)


def tiny_md(name: str, engine: str, model_digest: str) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "modeldeployment-tiny.yaml").read_text())
    doc["metadata"]["name"] = name
    b = doc["spec"]["bundle"]
    b["engine"]["image"] = engine
    b["model"] = {"uri": "pvc://models/tiny-llama", "revision": "seed0", "digest": model_digest}
    b["tokenizer"] = {"revision": "seed0", "digest": model_digest}
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
    k.helm("install", "mdop", str(ROOT / "charts" / "modeldeploy-operator"), "-n", op_ns,
           "--set", f"image.repository={repo}", "--set", f"image.digest={digest}",
           "--wait", "--timeout", "5m", timeout=330)  # fmt: skip
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
    for verb, what in (("get", "secrets"), ("list", "secrets"), ("create", "pods"), ("delete", "nodes"),
                       ("create", "clusterrolebindings"), ("update", "modeldeployments.serving.modeldeploy.dev"),
                       ("delete", "customresourcedefinitions")):  # fmt: skip
        assert not can(verb, what, "-A"), f"the operator's ServiceAccount may {verb} {what}"


def test_runtime_image_by_digest_serves_a_chat_through_the_cluster_ip(
    rn, ns, images, operator_release, tmp_path
) -> None:
    """`kubectl apply` a ModelDeployment whose engine is the runtime image by digest and whose
    model is on a local PV: the operator (the helm-installed pod) makes the Deployment, the
    runtime pod passes its startup probe, a chat completion through the ClusterIP answers, streams
    in flight survive the pod's deletion, and a wrong engine digest is rolled back naming the image."""
    import httpx

    _, k, _ = rn
    model_digest = local_pv_with_tiny_model(k, ns, tmp_path)
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
        svc = k.core.read_namespaced_service("tiny", ns)
        base = f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"

        def models() -> str | None:  # kube-proxy programs the new endpoint asynchronously
            try:
                return httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
            except httpx.TransportError:
                return None

        model = k.wait(models, 60, f"{base}/v1/models through the ClusterIP")
        r = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
            "model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0, r.text

        # the serving pod deleted under streaming load: kubelet's SIGTERM, the preStop hook and the
        # grace period let every in-flight stream finish
        started, results, ended = threading.Barrier(STREAMS + 1, timeout=120), [], []

        def stream() -> None:
            body = {"model": model, "messages": [{"role": "user", "content": "count"}], "max_tokens": 160,
                    "stream": True, "ignore_eos": True}  # fmt: skip
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
        k.wait(lambda: md_ready(k, ns, "tiny"), 600, "tiny Ready again after the pod deletion")
        k.wait(models, 60, "the replacement pod through the ClusterIP")

        # a wrong engine digest: the pod cannot pull it, so those bits never run, and the rollout
        # rolls back to the bundle that serves, naming the image
        stable = md_ready(k, ns, "tiny")["status"]["stable"]["bundle"]
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
        r = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
            "model": model, "messages": [{"role": "user", "content": "again"}], "max_tokens": 4})  # fmt: skip
        assert r.status_code == 200, r.text  # the prior bundle still serves
    finally:
        k.kubectl("delete", "-n", ns, "modeldeployments", "--all", "--wait=true", check=False, timeout=180)
        k.kubectl("delete", "pv", f"{ns}-models", "--wait=false", check=False)


def test_down_leaves_nothing_behind(rn, probe_ref) -> None:
    """Last in this module: down with a pod still running, then nothing of the node remains."""
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


def _container_pid(c: LocalCluster, container_id: str) -> int:
    cid = container_id.split("://", 1)[1]
    out = c.real_node().ctr("tasks", "ls").stdout
    for line in out.splitlines()[1:]:
        f = line.split()
        if f and f[0] == cid:
            return int(f[1])
    raise AssertionError(f"container {cid} not in `ctr tasks ls`:\n{out}")
