"""Dockerfile.runtime, built and run for real: conformance against the container.

No registry is reachable, so the base image is made locally: debootstrap a minimal Debian
bookworm (python3 3.11, venv), `docker import` it once (kept as modeldeploy-base:bookworm),
build Dockerfile.runtime on it (pip pulls the wheels from PyPI) with the real node's arguments
(EXTRAS=runtime: the GPU variant adds only CuPy's wheel, which a CPU run cannot exercise), through
the same builder the real node uses (modeldeploy_dev.cluster.realnode.images), start the container as its
non-root user on a tiny model mounted read-only, run `modeldeploy conformance` against it,
then `docker stop` (SIGTERM -> drain) must exit 0. Needs the Docker engine and debootstrap
(.ci/run installs docker.io and debootstrap; the fixture starts dockerd when none runs).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

from modeldeploy.conformance import ConformanceConfig, run_conformance
from modeldeploy_dev.cluster.realnode import images
from modeldeploy_dev.wait import wait_until

pytestmark = pytest.mark.slow
IMAGE = "modeldeploy-runtime:ci"


def docker(*args: str, timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p


@pytest.fixture(scope="module")
def engine():
    if (
        shutil.which("docker") is None
        or shutil.which("dockerd") is None
        and not Path("/usr/sbin/dockerd").exists()
    ):
        pytest.skip("no Docker engine installed (.ci/run installs docker.io)")
    with images.docker_engine() as why:  # starts dockerd when none answers, stops only that one
        assert why is None, why
        yield


@pytest.fixture(scope="module")
def image(engine):
    """The real node's runtime image (images.RUNTIME_ARGS), built here first. Not removed after:
    e2e/test_real_node.py builds the same Dockerfile, context and arguments and gets a full layer
    cache hit, and the next CI run reuses the torch layer; only superseded tops are pruned."""
    try:
        images.build("Dockerfile.runtime", IMAGE, images.RUNTIME_ARGS, timeout=2400)
    except RuntimeError as e:
        raise AssertionError(str(e)) from None
    yield IMAGE
    docker("image", "prune", "-f", check=False)  # dangling tops of earlier source trees


def test_container_passes_conformance_and_drains(image, llama_dir):
    cfg = docker("image", "inspect", "--format", "{{json .Config.Entrypoint}} {{.Config.User}}", image).stdout
    assert '["modeldeploy","serve"]' in cfg and "10001" in cfg
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        shutil.copytree(llama_dir, model)
        os.chmod(tmp, 0o755)
        for p in [model, *model.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)  # readable by the image's non-root user
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        name = f"modeldeploy-ci-{os.getpid()}"
        docker(
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            "-v",
            f"{model}:/models/model:ro",
            image,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            "/models/model",
            "--device",
            "cpu",
            "--served-model-name",
            "tiny",
            "--max-num-seqs",
            "2",
            "--max-queue",
            "8",
            "--bundle-id",
            "ci",
        )
        try:
            url = f"http://127.0.0.1:{port}"

            def ready() -> bool:
                state = docker("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
                assert state == "true", docker("logs", name, check=False).stderr
                return httpx.get(url + "/health/ready", timeout=2).status_code == 200

            wait_until(ready, 300, 0.5, "the container to be ready", ignore=(httpx.TransportError,))
            assert docker("exec", name, "id", "-u").stdout.strip() == "10001"
            report = run_conformance(ConformanceConfig(url=url, requests=8, concurrency=4))
            assert report.passed, report.table()
            assert report.bundle["bundle_id"] == "ci" and report.bundle["device"] == "cpu"
            # The image has no compiler: the CPU attention kernel it runs was prebuilt for this CPU's level.
            attention = report.bundle["engine_info"]["kernels"]["attention"]
            assert attention["path"] == "cpp" and attention["origin"].startswith("prebuilt x86-64-v"), (
                attention
            )
            assert "g++" not in docker("exec", name, "sh", "-c", "ls /usr/bin", check=False).stdout.split()
            docker("stop", "-t", "60", name, timeout=90)
            assert docker("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
        finally:
            docker("rm", "-f", name, check=False)
