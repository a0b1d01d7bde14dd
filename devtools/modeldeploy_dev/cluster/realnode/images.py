"""`make images`: build the runtime and operator images and push them to the loopback registry,
printing the `repo@sha256:` references a cluster pins.

No registry outside this machine is reachable, so both build on a debootstrapped Debian bookworm
(python3 3.11 + venv), `docker import`ed once as modeldeploy-base:bookworm (the same base
tests/test_server_docker.py uses). pip inside the builds reaches PyPI. The runtime image is built
with EXTRAS=runtime (no CuPy): the real node has no GPU. PyPI's Linux torch wheel is the CUDA
build, so the image still carries the CUDA user-space wheels (a CPU-only torch is not on PyPI).
Build times and sizes go to stdout as JSON (bench/results/real_node.md records them).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

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


# The runtime image's build arguments, shared with tests/test_server_docker.py: the same
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


def build_and_push(name: str, dockerfile: str, registry: str, build_args: dict[str, str]) -> Built:
    """Build `dockerfile` on the local base, push it to `registry` as modeldeploy/<name>, and
    return its reference by digest (the digest the registry computed, from `docker push`)."""
    tag = f"{registry}/modeldeploy/{name}:dev"
    build_s = build(dockerfile, tag, build_args)
    t0 = time.monotonic()
    out = docker("push", tag, timeout=3600)
    push_s = time.monotonic() - t0
    digest = next((w for w in out.split() if w.startswith("sha256:")), None)
    if digest is None:
        raise RuntimeError(f"docker push {tag} printed no digest:\n{out}")
    size = int(docker("image", "inspect", "--format", "{{.Size}}", tag).strip())
    return Built(name, f"{registry}/modeldeploy/{name}@{digest}", build_s, push_s, size)


def build_all(registry: str, only: list[str] | None = None) -> list[Built]:
    todo = {
        "operator": ("Dockerfile.operator", {}),
        "runtime": ("Dockerfile.runtime", RUNTIME_ARGS),
    }
    return [build_and_push(n, df, registry, a) for n, (df, a) in todo.items() if not only or n in only]


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
