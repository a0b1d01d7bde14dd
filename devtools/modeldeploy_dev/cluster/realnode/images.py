"""`make images`: build the runtime and operator images and push them to the loopback registry,
printing the `repo@sha256:` references a cluster pins.

No registry outside this machine is reachable, so both build on a debootstrapped Debian bookworm
(python3 3.11 + venv), `docker import`ed once as modeldeploy-base:bookworm (the same base
tests/runtime/server/test_server_docker.py uses). pip inside the builds reaches PyPI. The runtime
image is built with EXTRAS=runtime (no CuPy): the real node has no GPU. PyPI's Linux torch wheel is the CUDA
build, so the image still carries the CUDA user-space wheels (a CPU-only torch is not on PyPI).
Build times and sizes go to stdout as JSON (bench/results/real_node.md records them).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from modeldeploy.oci.registry import RegistryClient

ROOT = Path(__file__).resolve().parents[4]
BASE = "modeldeploy-base:bookworm"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def context_of(dockerfile: str) -> list[str]:
    """The build context is exactly what the Dockerfile COPYs from it (sources of `COPY a b dest`,
    not `COPY --from=...`), so nothing else of the repository can slip into an image. A path
    inside another one listed (src/modeldeploy/kernels/cpu inside src) comes with it and is not
    listed again."""
    names: set[str] = set()
    for line in (ROOT / dockerfile).read_text().splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "COPY" and not words[1].startswith("--"):
            names |= {w.rstrip("/") for w in words[1:-1]}
    return sorted(n for n in names if not any(a in names for a in map(str, Path(n).parents) if a != "."))


@dataclass
class Built:
    name: str
    ref: str  # host/repo@sha256:...
    build_s: float
    push_s: float
    size_bytes: int  # uncompressed, as `docker image inspect` reports


def docker(*args: str, timeout: float = 600, input_: bytes | None = None) -> str:
    r = subprocess.run(["docker", *args], capture_output=True, timeout=timeout, input=input_)
    if r.returncode != 0:
        raise RuntimeError(
            f"docker {' '.join(args[:3])} failed ({r.returncode}): {r.stderr.decode()[-3000:]}"
        )
    return r.stdout.decode()


def engine_ready() -> str | None:
    """None when a Docker engine answers, else why not (the caller starts one or reports it)."""
    if shutil.which("docker") is None:
        return "no docker CLI (apt-get install docker.io; .ci/run does)"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "no Docker engine answers `docker info` (start dockerd)"
    return None


@contextlib.contextmanager
def docker_engine(timeout: float = 60, dockerd: str | None = None) -> Iterator[str | None]:
    """A Docker engine for the duration: yields None once one answers, else why none can be had (no
    CLI or no dockerd installed: the caller skips or reports). Starts dockerd when none answers
    (CI's `make test` has none running) and stops only the one it started; one that it started and
    that does not answer within `timeout` raises RuntimeError (installed but broken is a failure,
    never a skip)."""
    dockerd = dockerd or shutil.which("dockerd") or "/usr/sbin/dockerd"
    log = Path(tempfile.gettempdir()) / "modeldeploy-dockerd.log"
    started: subprocess.Popen[bytes] | None = None
    if engine_ready() and shutil.which("docker") and Path(dockerd).exists():
        with open(log, "ab") as out:
            started = subprocess.Popen([dockerd], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while engine_ready() and started.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
    why = engine_ready()
    if why and started is not None:
        state = f"exited with {started.returncode}" if started.poll() is not None else "not answering"
        if started.poll() is None:
            started.terminate()
            started.wait(60)
        raise RuntimeError(f"the dockerd started here {state} after up to {timeout:.0f}s (see {log}): {why}")
    try:
        yield why
    finally:
        if started is not None:
            started.terminate()
            started.wait(60)


def base_image() -> str:
    if subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode == 0:
        return BASE
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(debootstrap).exists():
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap; .ci/run does)")
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                "bookworm",
                str(rootfs),
                "http://deb.debian.org/debian",
            ],
            check=True,
            timeout=1200,
            capture_output=True,
        )
        if HOST_CA.exists():  # pip in the build trusts what the host trusts
            shutil.copy(HOST_CA, rootfs / "etc/ssl/certs/ca-certificates.crt")
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True)
        docker("import", "-", BASE, input_=tar.stdout)
    return BASE


# The runtime image's build arguments, shared with tests/runtime/server/test_server_docker.py: the same
# Dockerfile, context and arguments give Docker's layer cache a full hit, so the image the
# container test built in tier 1 is the one the real node pushes in tier 2 (one pip install of
# torch's wheels per CI run instead of two: ~8 min).
RUNTIME_ARGS = {"EXTRAS": "runtime"}


def build(dockerfile: str, tag: str, build_args: dict[str, str], timeout: float = 3600) -> float:
    """Build `dockerfile` on the local base as `tag` from a context of exactly what it COPYs;
    return the seconds it took (a layer-cache hit takes seconds)."""
    with tempfile.TemporaryDirectory() as ctx:
        for n in [*context_of(dockerfile), dockerfile]:
            src = ROOT / n
            if src.is_dir():
                shutil.copytree(src, Path(ctx) / n, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy(src, Path(ctx) / n)
        args = ["build", "-f", dockerfile, "-t", tag, "--build-arg", f"BASE_IMAGE={base_image()}"]
        for k, v in build_args.items():
            args += ["--build-arg", f"{k}={v}"]
        if HOST_CA.exists():
            args += ["--build-arg", f"PIP_CERT={HOST_CA}"]
        t0 = time.monotonic()
        docker(*args, ctx, timeout=timeout)
        return time.monotonic() - t0


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"  # uncompressed


def push_uncompressed(tag: str, registry: str, repo: str) -> str:
    """Push the local image `tag` to `registry`/`repo` as an OCI image whose layers are plain tars,
    and return its manifest digest.

    Why: `docker push` gzips each layer on one core, which for the 6.3 GB runtime image took
    ~280 of a cold CI run's seconds (bench/results/ci.md), and containerd gunzips it again. A
    plain-tar layer is a standard OCI layer type whose digest is the layer's diff_id and the
    config's digest is the image ID: `docker save`'s archive streams into the registry, which
    checks each digest as it stores it (no copy on disk here), and a push the registry already
    holds sends only the manifest. `make images` keeps `docker push` (what users run); the tests
    push the operator image that way too."""
    info = json.loads(docker("image", "inspect", tag))[0]
    cfg_digest, diff_ids = info["Id"], info["RootFS"]["Layers"]
    with RegistryClient(registry) as rc:
        rc.authorize(repo, "pull,push")
        held = {d: rc.blob_size(repo, d) for d in [cfg_digest, *diff_ids]}
        sizes = {d: n for d, n in held.items() if n is not None}
        if len(sizes) < len(held):
            sizes = _upload_from_save(rc, tag, repo, cfg_digest, diff_ids, set(sizes))
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": cfg_digest, "size": sizes[cfg_digest]},
                "layers": [{"mediaType": OCI_LAYER_TAR, "digest": d, "size": sizes[d]} for d in diff_ids],
            },
            separators=(",", ":"),
        ).encode()
        rc.put_manifest(repo, tag.rpartition(":")[2], manifest, OCI_MANIFEST)
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def _upload_from_save(
    rc: RegistryClient, tag: str, repo: str, cfg_digest: str, diff_ids: list[str], present: set[str]
) -> dict[str, int]:
    """Stream `docker save`'s archive (docker 20.10's layout: <id>/layer.tar per layer, the config
    as <image id>.json) into the registry, and return every blob's size. Each layer is hashed as
    it is sent, because which <id> is which diff_id is written last, and so every layer is sent
    again even where the registry has it; only a full hit skips the save (push_uncompressed)."""
    sizes: dict[str, int] = {}
    save = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert save.stdout is not None
        with tarfile.open(fileobj=save.stdout, mode="r|") as tar:
            for member in tar:
                f = tar.extractfile(member) if member.isfile() else None
                if f is None:
                    continue  # directories, and a repeated layer's symlink to the first copy
                if member.name.endswith("/layer.tar"):
                    digest, size = rc.upload_stream(repo, iter(lambda f=f: f.read(1 << 20), b""))
                    sizes[digest] = size
                elif (
                    "/" not in member.name
                    and member.name.endswith(".json")
                    and member.name != "manifest.json"
                ):
                    config = f.read()
                    if "sha256:" + hashlib.sha256(config).hexdigest() != cfg_digest:
                        raise RuntimeError(
                            f"docker save {tag}: its config {member.name} is not image {cfg_digest}"
                        )
                    if cfg_digest not in present:
                        rc.upload_blob(repo, cfg_digest, len(config), lambda c=config: [c])
                    sizes[cfg_digest] = len(config)
        if save.wait(timeout=60) != 0:
            raise RuntimeError(
                f"docker save {tag} failed: {save.stderr.read().decode()[-2000:] if save.stderr else ''}"
            )
    finally:
        if save.poll() is None:
            save.kill()
            save.wait()
    if missing := [d for d in [cfg_digest, *diff_ids] if d not in sizes]:
        raise RuntimeError(f"docker save {tag}: no layer or config with digest {', '.join(missing)}")
    return sizes


def build_and_push(
    name: str, dockerfile: str, registry: str, build_args: dict[str, str], compress: bool = True
) -> Built:
    """Build `dockerfile` on the local base, push it to `registry` as modeldeploy/<name>, and
    return its reference by digest: the digest the registry computed, from `docker push`, or, with
    `compress=False`, that of the plain-tar OCI image push_uncompressed sent."""
    tag = f"{registry}/modeldeploy/{name}:dev"
    build_s = build(dockerfile, tag, build_args)
    t0 = time.monotonic()
    if compress:
        out = docker("push", tag, timeout=3600)
        digest = next((w for w in out.split() if w.startswith("sha256:")), None)
        if digest is None:
            raise RuntimeError(f"docker push {tag} printed no digest:\n{out}")
    else:
        digest = push_uncompressed(tag, registry, f"modeldeploy/{name}")
    push_s = time.monotonic() - t0
    size = int(docker("image", "inspect", "--format", "{{.Size}}", tag).strip())
    return Built(name, f"{registry}/modeldeploy/{name}@{digest}", build_s, push_s, size)


def build_all(
    registry: str, only: list[str] | None = None, uncompressed: tuple[str, ...] = ()
) -> list[Built]:
    """Build and push the images (`only` these, if given); those named in `uncompressed` go as
    plain-tar OCI images (push_uncompressed)."""
    todo = {
        "operator": ("Dockerfile.operator", {}),
        "runtime": ("Dockerfile.runtime", RUNTIME_ARGS),
    }
    return [
        build_and_push(n, df, registry, a, compress=n not in uncompressed)
        for n, (df, a) in todo.items()
        if not only or n in only
    ]


def build_runtime_or_operator(registry: str, name: str) -> str:
    """`name`'s (runtime or operator) reference by digest, built and pushed as the real-node e2e and
    chaos runs want it: the runtime (6.3 GB) as plain tars, since gzip on one core was minutes of a
    cold run; the operator by `docker push`, as `make images` does. Prints the build's figures."""
    (b,) = build_all(registry, [name], uncompressed=("runtime",))
    print(f"[images] {b.ref} build {b.build_s:.0f}s push {b.push_s:.0f}s size {b.size_bytes / 1e6:.0f} MB")
    return b.ref


ENGINE_LINE = re.compile(r"^(\s*image:\s*)\S+@sha256:[0-9a-f]{64}\s*$", re.M)


def write_examples(refs: dict[str, str], out: Path) -> list[Path]:
    """examples/modeldeployment-*.yaml with `bundle.engine.image` set to the runtime image just
    pushed (comments kept: a line edit, not a YAML round trip), and the chart values that pin the
    operator image by digest. `make example` = `make images` + this."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if "runtime" in refs:
        for src in sorted((ROOT / "examples").glob("modeldeployment-*.yaml")):
            text, n = ENGINE_LINE.subn(lambda m: m.group(1) + refs["runtime"], src.read_text())
            if n != 1:
                raise RuntimeError(f"{src}: expected one engine image line pinned by digest, found {n}")
            (out / src.name).write_text(text)
            written.append(out / src.name)
    if "operator" in refs:
        repo, digest = refs["operator"].split("@")
        values = out / "operator-values.yaml"
        values.write_text(
            f"# helm install mdop charts/modeldeploy-operator -f {values.name}\n"
            f"image:\n  repository: {repo}\n  digest: {digest}\n"
        )
        written.append(values)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeldeploy_dev.cluster.realnode.images", description=__doc__)
    p.add_argument("--only", action="append", choices=["operator", "runtime"], help="build just this image")
    p.add_argument("--json", type=Path, help="also write the results (refs, times, sizes) here")
    p.add_argument("--examples", type=Path, help="write the example manifests pinned to the new images here")
    a = p.parse_args(argv)
    if why := engine_ready():
        print(f"images: {why}", file=sys.stderr)
        return 2
    from modeldeploy_dev.cluster.local import LocalCluster

    reg = LocalCluster.existing().registry()
    started = reg.pid() is None
    reg.up()
    try:
        built = build_all(reg.host, a.only)
    finally:
        if started:
            reg.down()
    for b in built:
        print(b.ref)
    if a.json:
        a.json.write_text(json.dumps([asdict(b) for b in built], indent=1))
    if a.examples:
        for path in write_examples({b.name: b.ref for b in built}, a.examples):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
