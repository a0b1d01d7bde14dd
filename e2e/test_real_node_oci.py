"""oci:// models on the real node: `modeldeploy model push` to the node's registry, an image
volume in a restricted namespace, and a second bundle pre-pulled, canaried and promoted; the three
corrupt artifacts that must never serve (a registry blob modified after push, a weights file
truncated in the node's snapshot, a manifest holding another model than the bundle pins); and the
real model in a container, where the quality gate rolls back a 3-bit re-quantized canary.

The real node's kubelet is Kubernetes v1.36 (devtools/modeldeploy_dev/cluster/versions.env) with no
feature-gate overrides in its KubeletConfiguration (realnode/config.py), so ImageVolume is on by
default (beta, on by default since v1.35), and containerd v2.4 serves image volumes through the CRI.
Pod Security `restricted` admits `volumes[].image` since v1.33. The registry is on loopback, so
containerd pulls it over plain HTTP as it does the probe and runtime images.

Uses test_real_node's fixtures (the cluster, a restricted namespace, the runtime image by digest, the
helm-installed operator); with $KUBECONFIG naming a running `--real-node` cluster it reuses that one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from . import test_real_node as real
from .test_real_node import md_ready, tiny_md

# test_real_node's fixtures, used here as they are there (module scope: this module's own instances)
rn, ns, images, operator_release = real.rn, real.ns, real.images, real.operator_release

G, V, P = "serving.modeldeploy.dev", "v1alpha1", "modeldeployments"

pytestmark = [pytest.mark.e2e, pytest.mark.node_bins]


def push(model: Path, registry: str, repo: str) -> str:
    """`modeldeploy model push -q`: the oci://...@sha256 URI it prints."""
    out = subprocess.run(
        [sys.executable, "-m", "modeldeploy", "model", "push", "-q", str(model), f"{registry}/{repo}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.strip()
    assert out.startswith(f"oci://{registry}/{repo}@sha256:"), out
    return out


def oci_md(name: str, engine: str, uri: str, model_digest: str) -> dict:
    doc = tiny_md(name, engine, model_digest)
    b = doc["spec"]["bundle"]
    b["model"] = {"uri": uri, "revision": f"sha256-{uri[-12:]}", "digest": model_digest}
    b["tokenizer"] = {"revision": f"sha256-{uri[-12:]}", "digest": model_digest}
    doc["spec"]["rollout"] = {
        "steps": [{"weight": 50, "pauseSeconds": 0}],
        "prefetch": {"timeoutSeconds": 300},
    }
    return doc


def status(k, ns: str, name: str) -> dict:  # noqa: ANN001
    return k.custom.get_namespaced_custom_object(G, V, ns, P, name).get("status") or {}


def chat(base: str) -> httpx.Response:
    model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)


def test_oci_model_serves_from_an_image_volume_and_a_second_push_is_prefetched_canaried_promoted(
    rn, ns, images, operator_release, tmp_path
) -> None:
    from modeldeploy.digest import dir_digest
    from modeldeploy.runtime.tiny_model import make_tiny_model

    c, k, _ = rn
    registry = c.registry().host
    first, second = make_tiny_model(tmp_path / "a", seed=0), make_tiny_model(tmp_path / "b", seed=1)
    uri1, uri2 = push(first, registry, "models/tiny"), push(second, registry, "models/tiny")
    assert uri1 != uri2
    assert push(first, registry, "models/tiny") == uri1  # reproducible: the same directory, the same digest
    runtime = images("runtime")

    t0 = time.monotonic()
    doc = oci_md("ocitiny", runtime, uri1, dir_digest(first))
    k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    k.wait(lambda: md_ready(k, ns, "ocitiny"), 600, "ModelDeployment ocitiny Ready")
    print(f"[timing] apply (oci://, cold) -> Ready {time.monotonic() - t0:.1f}s")
    pod = next(p for p in k.core.list_namespaced_pod(ns).items if p.metadata.name.startswith("ocitiny-"))
    vol = next(v for v in pod.spec.volumes if v.name == "model")
    assert vol.image.reference == uri1.removeprefix("oci://"), vol  # an image volume, in a restricted ns
    svc = k.core.read_namespaced_service("ocitiny", ns)
    base = f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"
    r = k.wait(lambda: _answer(base), 60, f"a chat completion through {base}")
    assert r.json()["usage"]["completion_tokens"] > 0, r.text
    stable = status(k, ns, "ocitiny")["stable"]["bundle"]

    # a second push: Prefetching (one pre-pull pod on real-0), then the canary, the conformance gate
    # (Verifying -> Canary), a manual promote, Stable on the new bundle
    doc = oci_md("ocitiny", runtime, uri2, dir_digest(second))
    t1 = time.monotonic()
    k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    seen: set[str] = set()

    def in_canary() -> dict | None:
        st = status(k, ns, "ocitiny")
        seen.add(st.get("phase", ""))
        if st.get("phase") == "Prefetching":
            assert st["rollout"]["prefetchNodes"] == 1, st["rollout"]
        assert st.get("phase") != "RollingBack" and st.get("rollout", {}).get("reason") not in (
            "PrefetchTimeout",
            "PrefetchFailed",
            "ConformanceFailed",
        ), st.get("rollout")
        return st if st.get("phase") == "Canary" else None

    k.wait(in_canary, 600, "the second bundle in its canary step", interval=0.2)
    took = time.monotonic() - t1
    print(f"[timing] apply (second push) -> canary step {took:.1f}s; phases seen {sorted(seen)}")
    events = k.kubectl("get", "events", "-n", ns, "-o", "jsonpath={.items[*].reason}").stdout.split()
    assert "Prefetched" in events and "NewBundle" in events, events
    pulls = k.apps.list_namespaced_deployment(ns, label_selector="modeldeploy.dev/prefetch").items
    assert not pulls, [d.metadata.name for d in pulls]  # the pre-pull Deployment goes once the canary is
    k.kubectl("annotate", "-n", ns, "md", "ocitiny", "modeldeploy.dev/promote=true", "--overwrite")

    def promoted() -> dict | None:
        st = status(k, ns, "ocitiny")
        return st if st.get("phase") == "Stable" and st["stable"]["bundle"] != stable else None

    st = k.wait(promoted, 300, "the second bundle promoted")
    assert not st.get("failedBundles"), st
    r = k.wait(lambda: _answer(base), 60, "a chat completion from the promoted bundle")
    assert r.status_code == 200, r.text


def _answer(base: str) -> httpx.Response | None:
    try:
        r = chat(base)
    except httpx.TransportError:
        return None  # kube-proxy programs a new endpoint asynchronously
    return r if r.status_code == 200 else None


def watch_rollback(
    k,  # noqa: ANN001
    ns: str,
    name: str,
    base: str,
    stable: str,
    limit: float = 240,
) -> tuple[int, list[str], set[str], dict, float]:
    """Chat with the stable cohort through its Service every half second until `name` is Stable again
    with a failed bundle (or `limit` s: prefetch.timeoutSeconds is 300, so a rollback before it is
    the named failure). Returns (answers, failures, canary bundles seen as Deployments, status, s)."""
    from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, INSTANCE_LABEL

    t0 = time.monotonic()
    served, failed, canaries, st = 0, [], set(), {}
    selector = f"{INSTANCE_LABEL}={name}"
    while time.monotonic() < t0 + limit:
        try:
            r = chat(base)
        except httpx.HTTPError as e:
            failed.append(repr(e))
        else:
            if r.status_code == 200:
                served += 1
            else:
                failed.append(f"{r.status_code} {r.text[:200]}")
        deps = k.apps.list_namespaced_deployment(ns, label_selector=selector).items
        canaries |= {d.metadata.labels.get(BUNDLE_LABEL) for d in deps} - {stable, None}
        st = status(k, ns, name)
        if st.get("phase") == "Stable" and st.get("failedBundles"):
            break
        time.sleep(0.5)
    return served, failed, canaries, st, time.monotonic() - t0


def serve_stable(k, ns: str, name: str, runtime: str, uri: str, model: Path) -> tuple[str, str]:  # noqa: ANN001
    """Apply `name` on `uri` and wait until it is Ready and answers: (stable bundle, Service URL)."""
    from modeldeploy.digest import dir_digest

    k.kubectl("delete", "md", name, "-n", ns, "--ignore-not-found", "--wait=true")
    doc = oci_md(name, runtime, uri, dir_digest(model))
    k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    k.wait(lambda: md_ready(k, ns, name), 600, f"ModelDeployment {name} Ready")
    stable = status(k, ns, name)["stable"]["bundle"]
    svc = k.core.read_namespaced_service(name, ns)
    base = f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"
    k.wait(lambda: _answer(base), 60, f"a chat completion through {base}")
    return stable, base


def blob_path(storage: Path, digest: str) -> Path:
    """Where distribution's filesystem driver keeps a blob's bytes (shared by every repository)."""
    algo, hexd = digest.split(":", 1)
    return storage / "docker" / "registry" / "v2" / "blobs" / algo / hexd[:2] / hexd / "data"


def test_a_registry_blob_modified_after_push_is_refused_and_the_rollout_rolls_back_with_stable_serving(
    rn, ns, images, operator_release, tmp_path
) -> None:
    """Corrupt artifact, first case. The weights layer of a pushed artifact is overwritten in the
    registry's storage with bytes of the same length (the registry serves them under the old digest);
    containerd hashes what it fetches and refuses the blob, so the pre-pull pod never gets its image
    volume. The operator must name that pull error as PrefetchFailed well before
    prefetch.timeoutSeconds, roll back to the stable bundle (Degraded=True PrefetchFailed, the bundle in
    failedBundles), never create the canary Deployment, and the stable cohort must answer every request
    meanwhile. The blob is restored from the model directory at the end, whatever happens: the
    registry's storage outlives the cluster.

    Not verified by its author (no cluster or Docker in that session): the kubelet's exact wording for a
    failed image-volume pull (asserted loosely: a digest named in the message)."""
    from modeldeploy.digest import dir_digest
    from modeldeploy.oci.artifact import pack
    from modeldeploy.operator.rollout.bundle import INSTANCE_LABEL
    from modeldeploy.runtime.tiny_model import make_tiny_model

    c, k, _ = rn
    reg = c.registry()
    good = make_tiny_model(tmp_path / "good", seed=0)
    # a seed of its own: its weights layer is a blob no other test's artifact shares
    bad = make_tiny_model(tmp_path / "bad", seed=37)
    uri_good, uri_bad = push(good, reg.host, "models/tiny"), push(bad, reg.host, "models/tiny-corrupt")
    art = pack(bad)
    weights = art.layers[-1]  # one layer per *.safetensors, after the small files' layer
    path = blob_path(reg.storage, weights.digest)
    assert path.is_file() and path.stat().st_size == weights.size, path
    runtime, name = images("runtime"), "ocicorrupt"

    def apply(uri: str, model: Path) -> None:
        manifest = oci_md(name, runtime, uri, dir_digest(model))
        k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))

    try:
        flipped = bytearray(path.read_bytes())
        flipped[len(flipped) // 2] ^= 0xFF  # same length, another sha256: what a disk or an attacker does
        path.write_bytes(bytes(flipped))

        stable, base = serve_stable(k, ns, name, runtime, uri_good, good)
        apply(uri_bad, bad)
        served, failed, canaries, st, took = watch_rollback(k, ns, name, base, stable)
        print(f"[timing] apply (modified blob) -> rolled back {took:.1f}s; {served} stable answers meanwhile")
        rollout = st.get("rollout") or {}
        degraded = next((c for c in st.get("conditions", []) if c["type"] == "Degraded"), {})
        assert st.get("phase") == "Stable" and st["stable"]["bundle"] == stable, st
        assert (degraded.get("status"), degraded.get("reason")) == ("True", "PrefetchFailed"), degraded
        assert "digest" in degraded.get("message", "") and "node " in degraded.get("message", ""), degraded
        assert rollout.get("reason") == "PrefetchFailed" and len(st["failedBundles"]) == 1, rollout
        assert not canaries, canaries  # the canary Deployment never existed: nothing waited on the pull
        assert not failed and served > 0, failed  # the stable cohort untouched: every request answered
        events = k.kubectl("get", "events", "-n", ns, "-o", "jsonpath={.items[*].reason}").stdout.split()
        assert "PrefetchFailed" in events, events
        pulls = k.apps.list_namespaced_deployment(ns, label_selector="modeldeploy.dev/prefetch").items
        assert not [d for d in pulls if d.metadata.labels.get(INSTANCE_LABEL) == name], pulls
    finally:
        # the layer as `model push` made it, so a later push (which skips a blob the registry has) is sound
        path.write_bytes(b"".join(weights.chunks()))
        k.kubectl("delete", "md", name, "-n", ns, "--ignore-not-found", "--wait=false")


def canary_refused_for_its_digest(st: dict, stable: str, expected: str) -> dict:
    """The rollout's end when the canary's runtime refused the files it was given: Stable on the old
    bundle, Degraded=True CanaryFailed in the runtime's own words (the digest it expected, "digest
    mismatch"), the bundle in failedBundles. Returns the Degraded condition."""
    degraded = next((c for c in st.get("conditions", []) if c["type"] == "Degraded"), {})
    assert st.get("phase") == "Stable" and st["stable"]["bundle"] == stable, st
    assert (degraded.get("status"), degraded.get("reason")) == ("True", "CanaryFailed"), degraded
    message = degraded.get("message", "")
    assert "digest mismatch" in message.lower() and expected in message, degraded
    assert len(st.get("failedBundles") or []) == 1, st
    return degraded


def test_a_weights_file_truncated_on_the_node_never_serves_and_the_rollout_rolls_back(
    rn, ns, images, operator_release, tmp_path
) -> None:
    """Corrupt artifact, second case. The artifact is pulled into the node's containerd (what a
    pre-pull does: its layers unpacked into overlayfs snapshots), then its weights file is truncated
    there, as a failing disk or a careless hand would. The registry is sound, so containerd has
    nothing to refuse and the image volume mounts; the runtime hashes the mounted files against the
    bundle's model digest before it reports Ready, refuses them, and the canary fails naming the
    digest. The stable cohort answers every request meanwhile. The file is restored at the end (the
    node's snapshots outlive the test when the cluster is reused)."""
    import hashlib
    import os

    from modeldeploy.digest import dir_digest
    from modeldeploy.runtime.tiny_model import make_tiny_model

    c, k, _ = rn
    node, reg = c.real_node(), c.registry()
    good = make_tiny_model(tmp_path / "good", seed=0)
    bad = make_tiny_model(tmp_path / "bad", seed=41)  # its own weights blob and snapshot
    uri_good, uri_bad = push(good, reg.host, "models/tiny"), push(bad, reg.host, "models/tiny-truncated")
    runtime, name = images("runtime"), "ocitruncated"
    node.ctr("images", "pull", "--local", "--plain-http", uri_bad.removeprefix("oci://"))
    weights = (bad / "model.safetensors").read_bytes()
    want = hashlib.sha256(weights).hexdigest()
    snapshots = node.lay.containerd_root / "io.containerd.snapshotter.v1.overlayfs" / "snapshots"
    hits = [
        f
        for f in snapshots.glob("*/fs/model.safetensors")
        if f.stat().st_size == len(weights) and hashlib.sha256(f.read_bytes()).hexdigest() == want
    ]
    assert len(hits) == 1, (hits, sorted(snapshots.glob("*/fs/*"))[:20])
    try:
        os.truncate(hits[0], len(weights) // 2)
        stable, base = serve_stable(k, ns, name, runtime, uri_good, good)
        doc = oci_md(name, runtime, uri_bad, dir_digest(bad))
        k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
        served, failed, _, st, took = watch_rollback(k, ns, name, base, stable)
        print(f"[timing] apply (truncated on the node) -> rolled back {took:.1f}s; {served} stable answers")
        canary_refused_for_its_digest(st, stable, dir_digest(bad))
        assert not failed and served > 0, failed  # the stable cohort untouched: every request answered
    finally:
        hits[0].write_bytes(weights)
        k.kubectl("delete", "md", name, "-n", ns, "--ignore-not-found", "--wait=false")


def test_a_manifest_pointing_at_another_model_never_serves_and_the_rollout_rolls_back(
    rn, ns, images, operator_release, tmp_path
) -> None:
    """Corrupt artifact, third case. The bundle names an artifact by a sound registry digest, but the
    artifact holds another model than the bundle's model digest pins (a copy-paste of the wrong
    `oci://` line). Registry, containerd and the image volume all agree; only the runtime's check of
    the files against the model digest can tell, and it must, before Ready: the canary fails naming
    both digests, the rollout rolls back, and the stable cohort answers every request."""
    from modeldeploy.digest import dir_digest
    from modeldeploy.runtime.tiny_model import make_tiny_model

    c, k, _ = rn
    reg = c.registry()
    good = make_tiny_model(tmp_path / "good", seed=0)
    other = make_tiny_model(tmp_path / "other", seed=43)  # what the artifact holds
    meant = make_tiny_model(tmp_path / "meant", seed=44)  # what the bundle pins (never pushed)
    uri_good, uri_other = push(good, reg.host, "models/tiny"), push(other, reg.host, "models/tiny-other")
    runtime, name = images("runtime"), "ociwrong"
    try:
        stable, base = serve_stable(k, ns, name, runtime, uri_good, good)
        doc = oci_md(name, runtime, uri_other, dir_digest(meant))
        k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
        served, failed, _, st, took = watch_rollback(k, ns, name, base, stable)
        print(f"[timing] apply (another model) -> rolled back {took:.1f}s; {served} stable answers")
        degraded = canary_refused_for_its_digest(st, stable, dir_digest(meant))
        assert dir_digest(other) in degraded["message"], degraded  # what the volume actually held
        assert not failed and served > 0, failed
    finally:
        k.kubectl("delete", "md", name, "-n", ns, "--ignore-not-found", "--wait=false")


def test_the_real_model_from_oci_serves_in_a_container_and_the_quality_gate_rolls_back_a_3bit_canary(
    rn, ns, images, operator_release
) -> None:
    """Issues 36 and 37 on the real node: the real model (SmolLM2-135M-Instruct, 516 MiB of float32)
    pushed with `modeldeploy model push`, mounted as an image volume into the runtime container, Ready
    and answering; then a canary whose linear weights are re-quantized to 3 bits (pushed the same
    way: its own manifest digest and model digest) is pre-pulled, passes conformance (it is neither
    slower nor failing), and the quality gate, run by the helm-installed operator from its own pod
    against the two containers, rolls it back with QualityFailed before any traffic weight. The
    stable cohort answers every request meanwhile."""
    from modeldeploy.digest import dir_digest
    from modeldeploy_dev import model_variants
    from modeldeploy_dev.real_model import MODEL_DIGEST, bundle_config, cached_real_model

    from .test_rollout_quality import (
        PICK,
        SERVED,
        assert_quality_rollback,
        eval_items,
        figures,
        quality_analysis,
        variant,
    )

    c, k, _ = rn
    reg = c.registry()
    real = cached_real_model()
    rtn3 = variant(real, "smollm2-rtn3-g32", lambda o: model_variants.requantize(real, o, bits=3, group=32))
    t0 = time.monotonic()
    uri_real, uri_rtn3 = push(real, reg.host, "models/smollm2"), push(rtn3, reg.host, "models/smollm2-rtn3")
    print(f"[timing] the real model and its 3-bit copy pushed (516 MiB each): {time.monotonic() - t0:.1f}s")
    runtime, name = images("runtime"), "ocireal"
    items = eval_items()

    def doc(uri: str, digest: str) -> dict:
        d = oci_md(name, runtime, uri, digest)
        spec = d["spec"]
        spec["bundle"]["config"] = bundle_config(SERVED)
        spec["resources"] = {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
        spec["rollout"]["analysis"] = quality_analysis(items)
        spec["rollout"]["progressDeadlineSeconds"] = 900
        return d

    try:
        k.kubectl("delete", "md", name, "-n", ns, "--ignore-not-found", "--wait=true")
        t0 = time.monotonic()
        k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc(uri_real, MODEL_DIGEST)))
        k.wait(lambda: md_ready(k, ns, name), 600, f"ModelDeployment {name} Ready on the real model")
        print(f"[timing] apply (real model, oci://, cold) -> Ready {time.monotonic() - t0:.1f}s")
        stable = status(k, ns, name)["stable"]["bundle"]
        svc = k.core.read_namespaced_service(name, ns)
        base = f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"
        r = k.wait(lambda: _answer(base), 120, f"a chat completion through {base}")
        assert r.json()["model"] == SERVED and r.json()["choices"][0]["message"]["content"].strip(), r.text

        t0 = time.monotonic()
        k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc(uri_rtn3, dir_digest(rtn3))))
        served, failed, _, st, took = watch_rollback(k, ns, name, base, stable, limit=900)
        print(f"[timing] apply (3-bit canary) -> rolled back {took:.1f}s; {served} stable answers meanwhile")
        md = k.custom.get_namespaced_custom_object(G, V, ns, P, name)
        q = assert_quality_rollback(md, stable)
        assert q["items"] == len(PICK), q
        acc = figures(q)["accuracy"]
        assert acc["stable"] >= 0.75 and acc["canary"] < acc["stable"], q  # the real model knows its set
        assert not failed and served > 0, failed  # the stable cohort untouched: every request answered
    finally:
        k.kubectl("delete", "md", name, "-n", ns, "--ignore-not-found", "--wait=false")
