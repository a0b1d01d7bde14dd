"""Image pull failures name the image (operator/controller/pull.py): the reason a rollout rolls back with."""

from __future__ import annotations

from modeldeploy.operator.controller.pull import crash_failure, pull_failure

IMAGE = "127.0.0.1:5011/modeldeploy/runtime@sha256:" + "0" * 64


def pod(reason: str | None, message: str = "", init: bool = False) -> dict:
    cs = {"name": "serve", "image": IMAGE, "state": {"waiting": {"reason": reason, "message": message}}}
    if reason is None:
        cs["state"] = {"running": {}}
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"status": {"phase": "Pending", key: [cs]}}


def test_back_off_names_the_image_and_kubelets_message() -> None:
    msg = pull_failure(pod("ImagePullBackOff", 'Back-off pulling image "x": not found'))
    assert msg == f'image {IMAGE} cannot be pulled (ImagePullBackOff): Back-off pulling image "x": not found'


def test_invalid_name_and_init_containers_count() -> None:
    assert (
        pull_failure(pod("InvalidImageName", init=True))
        == f"image {IMAGE} cannot be pulled (InvalidImageName)"
    )


def test_a_first_failed_attempt_or_a_running_pod_is_not_a_failure() -> None:
    assert pull_failure(pod("ErrImagePull", "connection refused")) is None  # kubelet retries it
    assert pull_failure(pod("ContainerCreating")) is None
    assert pull_failure(pod(None)) is None
    assert pull_failure({"status": {"phase": "Pending"}}) is None


def test_load_probe_reports_a_pull_failure_as_the_bundles_load_error() -> None:
    from modeldeploy.operator.controller.observe import LoadProbe
    from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL

    p = pod("ImagePullBackOff", "not found")
    p["metadata"] = {"uid": "u1", "labels": {BUNDLE_LABEL: "b1"}}
    loading, errors = LoadProbe(8000).probe(("ns", "md"), [p])
    assert errors == {"b1": f"image {IMAGE} cannot be pulled (ImagePullBackOff): not found"}
    assert loading == {}


def crashed(restarts: int, code: int, ready: bool = False, message: str = "") -> dict:
    last = {"terminated": {"exitCode": code, "reason": "Error", "message": message}}
    cs = {"name": "serve", "image": IMAGE, "restartCount": restarts, "ready": ready, "lastState": last}
    cs["state"] = {"running": {}}
    return {"status": {"phase": "Running", "containerStatuses": [cs]}, "metadata": {"uid": "u2"}}


def test_a_serving_container_that_crashed_and_is_not_ready_is_a_failure() -> None:
    """The runtime exits 1 when a tensor-parallel rank dies; a canary doing that rolls back with it."""
    assert crash_failure(crashed(1, 1)) == "container serve exited with code 1 (Error, 1 restart)"
    assert crash_failure(crashed(3, 137, message="OOMKilled")) == (
        "container serve exited with code 137 (Error, 3 restarts): OOMKilled"
    )
    assert crash_failure(crashed(1, 1, ready=True)) is None  # it came back and serves
    assert crash_failure(crashed(1, 0)) is None  # a clean exit (drain) is no crash
    assert crash_failure(crashed(0, 1)) is None
    assert crash_failure(pod(None)) is None


def test_load_probe_reports_a_crash_as_the_bundles_load_error() -> None:
    from modeldeploy.operator.controller.observe import LoadProbe
    from modeldeploy.operator.rollout.bundle import BUNDLE_LABEL

    p = crashed(2, 1)
    p["metadata"]["labels"] = {BUNDLE_LABEL: "b2"}
    _, errors = LoadProbe(8000).probe(("ns", "md"), [p])
    assert errors == {"b2": "container serve exited with code 1 (Error, 2 restarts)"}
