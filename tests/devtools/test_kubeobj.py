"""The harness's accessors of the kubernetes client's models: the field when the API server set it,
a loud failure naming the object when it did not."""

from __future__ import annotations

import pytest
from kubernetes import client

from modeldeploy_dev import kubeobj as K


def test_accessors_return_what_a_stored_pod_carries() -> None:
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="p", namespace="ns", uid="u-1"),
        spec=client.V1PodSpec(containers=[], node_name="n"),
        status=client.V1PodStatus(phase="Running", pod_ip="10.0.0.1"),
    )
    assert (K.name(pod), K.namespace(pod), K.uid(pod)) == ("p", "ns", "u-1")
    assert K.pod_spec(pod).node_name == "n" and K.pod_status(pod).pod_ip == "10.0.0.1"


def test_a_missing_field_fails_naming_the_object() -> None:
    with pytest.raises(AssertionError, match="V1Pod read from the API server without metadata"):
        K.name(client.V1Pod())
    with pytest.raises(AssertionError, match="pod p has no status"):
        K.pod_status(client.V1Pod(metadata=client.V1ObjectMeta(name="p")))
    with pytest.raises(AssertionError, match="V1Node n has no uid"):
        K.uid(client.V1Node(metadata=client.V1ObjectMeta(name="n")))


def test_custom_object_accepts_only_a_decoded_object() -> None:
    assert K.custom_object({"spec": {}}) == {"spec": {}}
    with pytest.raises(AssertionError, match="not an object"):
        K.custom_object([])
