"""Pod spec -> local command line (no cluster needed): command check, $(VAR), volume path mapping."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from modeldeploy_dev.procnode.spec import MODELDEPLOY, UnsupportedPod, build_launch, expand


def pod(container: client.V1Container, volumes: list[client.V1Volume]) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="p", namespace="ns", uid="0123456789abcdef"),
        spec=client.V1PodSpec(containers=[container], volumes=volumes, node_name="proc-0"),
    )


def test_modeldeploy_command_volumes_and_env(tmp_path: Path) -> None:
    c = client.V1Container(
        name="main",
        command=["modeldeploy"],
        args=["serve", "--model", "/models/tiny", "--cache=/scratch/c", "--name", "$(NAME)", "/other"],
        env=[
            client.V1EnvVar(name="NAME", value="n-$(POD_IP)"),
            client.V1EnvVar(
                name="POD_IP",
                value_from=client.V1EnvVarSource(
                    field_ref=client.V1ObjectFieldSelector(field_path="status.podIP")
                ),
            ),
            client.V1EnvVar(name="HF_HOME", value="/models/hf"),
        ],
        volume_mounts=[
            client.V1VolumeMount(name="m", mount_path="/models"),
            client.V1VolumeMount(name="s", mount_path="/scratch"),
        ],
    )
    vols = [
        client.V1Volume(name="m", host_path=client.V1HostPathVolumeSource(path=str(tmp_path / "models"))),
        client.V1Volume(name="s", empty_dir=client.V1EmptyDirVolumeSource()),
    ]
    launch = build_launch(pod(c, vols), c, None, "10.244.0.7", tmp_path / "state")  # type: ignore[arg-type]
    scratch = tmp_path / "state" / "pods" / "0123456789abcdef" / "volumes" / "s"
    assert launch.argv == [
        str(MODELDEPLOY),
        "serve",
        "--model",
        f"{tmp_path}/models/tiny",
        f"--cache={scratch}/c",
        "--name",
        "n-$(POD_IP)",
        "/other",
    ]
    assert scratch.is_dir()
    assert launch.env["POD_IP"] == "10.244.0.7"
    assert launch.env["HF_HOME"] == f"{tmp_path}/models/hf"
    assert launch.env["NAME"] == "n-$(POD_IP)"  # declared before POD_IP: not expanded, as in Kubernetes


def test_args_expand_declared_env() -> None:
    assert expand("--x=$(A)/$(B)", {"A": "1"}) == "--x=1/$(B)"


def test_non_modeldeploy_command_is_refused(tmp_path: Path) -> None:
    c = client.V1Container(name="sh", command=["/bin/sh", "-c", "true"])
    with pytest.raises(UnsupportedPod, match="/bin/sh"):
        build_launch(pod(c, []), c, None, "10.244.0.7", tmp_path)  # type: ignore[arg-type]


def test_no_command_uses_the_runtime_image_entrypoint(tmp_path: Path) -> None:
    c = client.V1Container(name="serve", image="x", args=["--model", "/m", "--port", "9000"])
    assert build_launch(pod(c, []), c, None, "10.244.0.7", tmp_path).argv == [  # type: ignore[arg-type]
        str(MODELDEPLOY),
        "serve",
        "--model",
        "/m",
        "--port",
        "9000",
    ]
    bare = client.V1Container(name="serve", image="x")
    argv = build_launch(pod(bare, []), bare, None, "10.244.0.7", tmp_path).argv  # type: ignore[arg-type]
    assert argv[1:] == ["serve", "--host", "0.0.0.0", "--port", "8000", "--model", "/models/model"]


def test_name_equals_mount_path_args_are_rewritten(tmp_path: Path) -> None:
    """`serve --adapter NAME=/models/adapters/NAME` (one mount per adapter) reaches the local dir."""
    c = client.V1Container(
        name="serve",
        command=["modeldeploy", "serve"],
        args=["--adapter", "tenant-a=/models/adapters/tenant-a", "--adapter-digest", "tenant-a=sha256:00"],
        volume_mounts=[client.V1VolumeMount(name="adapter-0", mount_path="/models/adapters/tenant-a")],
    )
    vols = [
        client.V1Volume(name="adapter-0", host_path=client.V1HostPathVolumeSource(path=str(tmp_path / "a")))
    ]
    launch = build_launch(pod(c, vols), c, None, "10.244.0.7", tmp_path / "state")  # type: ignore[arg-type]
    assert launch.argv[1:] == [
        "serve",
        "--adapter",
        f"tenant-a={tmp_path}/a",
        "--adapter-digest",
        "tenant-a=sha256:00",
    ]
