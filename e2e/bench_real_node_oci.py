"""oci:// model timings on the real node, as a bench: pre-pull time against artifact size, and a pod's
apply -> Ready cold (nothing cached) against warm (pre-pulled), at three artifact sizes.

  MODELDEPLOY_BENCH_OUT=/tmp/model_artifacts_node.json \
      .venv/bin/pytest -s -p no:cacheprovider e2e/bench_real_node_oci.py

Not part of `make test` (pytest collects `test_*.py` only; this file runs when named). It uses
test_real_node's fixtures (the real-node cluster, a restricted namespace, the runtime image by
digest, the helm-installed operator), so it brings that cluster up as the e2e module does.

Each size is the tiny model plus a `padding.dat` of random bytes (the model's files are what the
runtime hashes against the bundle's digest, so the padding is part of what is pulled, unpacked,
mounted and verified, as a larger checkpoint would be; the weights the engine loads stay the same,
so load time is constant and the differences are the artifact's). Fresh seeds per size: no blob is
shared with another size or test. Per size, three measurements:

1. pre-pull, then a warm canary: a stable deployment on a small artifact; the bundle switches to
   the sized one; Prefetching (one pre-pull pod on real-0) -> the canary pod created -> Ready. The
   canary pod's own creation -> Ready is the warm start.
2. cold apply: the artifact removed from the node's containerd (`ctr images rm --sync`: image,
   content and snapshots), then a new deployment on it: apply -> Ready, pod creation -> Ready.
3. warm apply: that deployment deleted and applied again, the artifact still on the node.

Prints a markdown table and writes the figures as JSON to $MODELDEPLOY_BENCH_OUT. Asserts only that
every step got where it must (no timing is asserted: the machine is shared).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from . import test_real_node as real
from .test_real_node import md_ready
from .test_real_node_oci import oci_md, push, status

rn, ns, images, operator_release = real.rn, real.ns, real.images, real.operator_release

OUT = os.environ.get("MODELDEPLOY_BENCH_OUT")
SIZES_MIB = [int(x) for x in os.environ.get("MODELDEPLOY_BENCH_SIZES_MIB", "0,256,1024").split(",")]

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not OUT, reason="a bench: set MODELDEPLOY_BENCH_OUT")]


def padded(root: Path, seed: int, pad_mib: int) -> Path:
    from modeldeploy.runtime.tiny_model import make_tiny_model

    d = make_tiny_model(root / f"m{seed}", seed=seed)
    with (d / "padding.dat").open("wb") as f:
        for _ in range(pad_mib):
            f.write(os.urandom(1 << 20))
    return d


def size_of(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def pod_start(k, ns: str, name: str, bundle: str | None = None) -> tuple[float, float] | None:  # noqa: ANN001
    """(creation, Ready) wall times of the one Ready pod of `name` (of `bundle` if given), or None."""
    from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL, INSTANCE_LABEL

    sel = f"{INSTANCE_LABEL}={name}" + (f",{BUNDLE_LABEL}={bundle}" if bundle else "")
    for p in k.core.list_namespaced_pod(ns, label_selector=sel).items:
        ready = next((c for c in p.status.conditions or [] if c.type == "Ready" and c.status == "True"), None)
        if ready is not None:
            return p.metadata.creation_timestamp.timestamp(), ready.last_transition_time.timestamp()
    return None


def apply(k, ns: str, doc: dict) -> float:  # noqa: ANN001
    k.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    return time.time()


def fresh(k, ns: str, name: str, doc: dict) -> dict[str, float]:  # noqa: ANN001
    """Apply a new deployment and wait until Ready: apply -> Ready and its pod's creation -> Ready."""
    t0 = apply(k, ns, doc)
    k.wait(lambda: md_ready(k, ns, name), 900, f"{name} Ready")
    t1 = time.time()
    created, ready = k.wait(lambda: pod_start(k, ns, name), 60, f"{name}'s Ready pod")
    return {"apply_to_ready_s": round(t1 - t0, 1), "pod_created_to_ready_s": round(ready - created, 1)}


def test_prefetch_and_cold_vs_warm_start_against_artifact_size(rn, ns, images, operator_release, tmp_path):
    from modeldeploy.digest import dir_digest

    c, k, _ = rn
    runtime = images("runtime")
    base = padded(tmp_path, 60, 0)
    small = oci_md("", runtime, push(base, c.registry().host, "models/bench-base"), dir_digest(base))
    rows: list[dict] = []
    for i, mib in enumerate(SIZES_MIB):
        rows.append(measure(c, k, ns, runtime, small, padded(tmp_path, 61 + i, mib), mib))
        print(f"[bench] {rows[-1]}", flush=True)
    report = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "loadavg": os.getloadavg(),
        "rows": rows,
    }
    assert OUT
    Path(OUT).write_text(json.dumps(report, indent=1) + "\n")
    print(markdown(rows))


def named(doc: dict, name: str) -> dict:
    out = json.loads(json.dumps(doc))
    out["metadata"]["name"] = name
    return out


def measure(c, k, ns: str, runtime: str, small: dict, model: Path, mib: int) -> dict:  # noqa: ANN001
    """The three measurements of one artifact size (see the module docstring)."""
    from modeldeploy.digest import dir_digest

    node, digest = c.real_node(), dir_digest(model)
    t0 = time.time()
    uri = push(model, c.registry().host, f"models/bench-{mib}m")
    row: dict = {"padding_mib": mib, "artifact_bytes": size_of(model), "push_s": round(time.time() - t0, 1)}

    # 1. pre-pull then a warm canary
    name = f"pre{mib}"
    fresh(k, ns, name, named(small, name))
    stable = status(k, ns, name)["stable"]["bundle"]
    t0 = apply(k, ns, oci_md(name, runtime, uri, digest))
    marks: dict[str, float] = {}

    def canary_ready() -> tuple[float, float] | None:
        st = status(k, ns, name)
        phase = st.get("phase", "")
        assert phase != "RollingBack" and not st.get("failedBundles"), st
        if phase == "Prefetching":
            marks.setdefault("prefetch_start", time.time())
        elif "prefetch_start" in marks:
            marks.setdefault("prefetch_end", time.time())
        bundle = (st.get("canary") or {}).get("bundle")
        return pod_start(k, ns, name, bundle) if bundle and bundle != stable else None

    created, ready = k.wait(canary_ready, 900, f"{name}'s canary pod Ready", interval=0.2)
    row["prefetch_s"] = round(marks.get("prefetch_end", 0) - marks.get("prefetch_start", 0), 1)
    row["apply_to_canary_ready_s"] = round(ready - t0, 1)
    row["canary_pod_created_to_ready_s"] = round(ready - created, 1)
    k.kubectl("delete", "md", name, "-n", ns, "--wait=true", timeout=300)

    # 2. cold apply: the artifact gone from the node first
    ref = uri.removeprefix("oci://")
    k.wait(lambda: not _pods(k, ns), 300, "no pod left in the namespace")
    manifest = ref.split("@", 1)[1]
    gone = forget(node, manifest)
    assert gone and manifest not in node.ctr("images", "ls").stdout, gone
    name = f"cold{mib}"
    row |= {f"cold_{key}": v for key, v in fresh(k, ns, name, oci_md(name, runtime, uri, digest)).items()}
    row["cold_kubelet_says"] = pulled(k, ns, name, manifest)

    # 3. warm apply: the same deployment again, the artifact still on the node
    k.kubectl("delete", "md", name, "-n", ns, "--wait=true", timeout=300)
    k.wait(lambda: not _pods(k, ns), 300, "no pod left in the namespace")
    assert ref in node.ctr("images", "ls", "-q").stdout, "the kubelet dropped the artifact"
    row |= {f"warm_{key}": v for key, v in fresh(k, ns, name, oci_md(name, runtime, uri, digest)).items()}
    row["warm_kubelet_says"] = pulled(k, ns, name, manifest)
    k.kubectl("delete", "md", name, "-n", ns, "--wait=true", timeout=300)
    return row


def forget(node, manifest: str) -> list[str]:  # noqa: ANN001 - RealNode
    """Remove every image record of the artifact from the node's containerd, content and snapshots
    with them (`--sync`): the CRI keeps it under its reference and under its config digest, and
    content one record still holds makes the next "pull" a manifest fetch."""
    lines = node.ctr("images", "ls").stdout.splitlines()[1:]
    names = [line.split()[0] for line in lines if manifest in line]
    for n in names:
        node.ctr("images", "rm", "--sync", n, check=False)
    return names


def pulled(k, ns: str, pod_prefix: str, manifest: str) -> list[str]:  # noqa: ANN001
    """What the kubelet's events say about the artifact for the pods of `pod_prefix`: its own pull
    timing where it pulled, "already present" where it did not."""
    items = json.loads(k.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    return [
        e.get("message", "")
        for e in items
        if e.get("reason") in ("Pulled", "Pulling")
        and e.get("involvedObject", {}).get("name", "").startswith(pod_prefix)
        and manifest[7:19] in e.get("message", "")
    ]


def _pods(k, ns: str) -> list:  # noqa: ANN001
    return k.core.list_namespaced_pod(ns).items


def markdown(rows: list[dict]) -> str:
    cols = [
        ("artifact MiB", lambda r: f"{r['artifact_bytes'] / 2**20:.0f}"),
        ("push s", lambda r: r["push_s"]),
        ("pre-pull s", lambda r: r["prefetch_s"]),
        ("apply -> canary Ready s", lambda r: r["apply_to_canary_ready_s"]),
        ("canary pod start (warm) s", lambda r: r["canary_pod_created_to_ready_s"]),
        ("cold apply -> Ready s", lambda r: r["cold_apply_to_ready_s"]),
        ("cold pod start s", lambda r: r["cold_pod_created_to_ready_s"]),
        ("warm apply -> Ready s", lambda r: r["warm_apply_to_ready_s"]),
        ("warm pod start s", lambda r: r["warm_pod_created_to_ready_s"]),
    ]
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(f(r)) for _, f in cols) + " |" for r in rows]
    return "\n".join(lines)
