"""The kubernetes client's models as the API server returns them, for the test infrastructure.

The client types nearly every field as optional (`V1Pod.metadata: V1ObjectMeta | None`,
`V1ObjectMeta.name: str | None`) because a request body may leave them out. An object read back
from the API server always has them: metadata with its name, namespace and uid, a spec, and a
status (the server defaults one on create). These accessors state that once, as asserts, so the
harness reads `name(pod)` instead of repeating the check at every use; a None there is a broken
API server, worth a loud failure. `body` and `custom_object` do the same for request bodies and
the custom-objects API, which the client types only as its model classes and `object`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: importing this module costs no kubernetes import
    from datetime import datetime

    from kubernetes import client


class Stored(Protocol):
    """Any object the API server stores (Pod, Node, PersistentVolume, Namespace, Event...)."""

    @property
    def metadata(self) -> client.V1ObjectMeta | None: ...


def meta(obj: Stored) -> client.V1ObjectMeta:
    """The object's metadata, set on every stored object."""
    m = obj.metadata
    assert m is not None, f"{type(obj).__name__} read from the API server without metadata"
    return m


def name(obj: Stored) -> str:
    """metadata.name, set on every stored object."""
    n = meta(obj).name
    assert n is not None, f"{type(obj).__name__} read from the API server without a name"
    return n


def namespace(obj: Stored) -> str:
    """metadata.namespace, set on every stored object of a namespaced kind."""
    ns = meta(obj).namespace
    assert ns is not None, f"{type(obj).__name__} {meta(obj).name} has no namespace"
    return ns


def uid(obj: Stored) -> str:
    """metadata.uid, set by the API server on create."""
    u = meta(obj).uid
    assert u is not None, f"{type(obj).__name__} {meta(obj).name} has no uid"
    return u


def created(obj: Stored) -> datetime:
    """metadata.creationTimestamp, set by the API server on create."""
    t = meta(obj).creation_timestamp
    assert t is not None, f"{type(obj).__name__} {meta(obj).name} has no creationTimestamp"
    return t


def pod_spec(pod: client.V1Pod) -> client.V1PodSpec:
    """A stored pod's spec (required on create)."""
    assert pod.spec is not None, f"pod {meta(pod).name} has no spec"
    return pod.spec


def pod_status(pod: client.V1Pod) -> client.V1PodStatus:
    """A stored pod's status (the API server sets phase Pending on create)."""
    assert pod.status is not None, f"pod {meta(pod).name} has no status"
    return pod.status


def node_status(node: client.V1Node) -> client.V1NodeStatus:
    """A stored node's status (the API server defaults one on create)."""
    assert node.status is not None, f"node {meta(node).name} has no status"
    return node.status


def pvc_spec(claim: client.V1PersistentVolumeClaim) -> client.V1PersistentVolumeClaimSpec:
    """A stored claim's spec (required on create)."""
    assert claim.spec is not None, f"claim {meta(claim).name} has no spec"
    return claim.spec


def pv_spec(pv: client.V1PersistentVolume) -> client.V1PersistentVolumeSpec:
    """A stored volume's spec (required on create)."""
    assert pv.spec is not None, f"volume {meta(pv).name} has no spec"
    return pv.spec


def body(obj: dict[str, Any]) -> Any:
    """A plain dict as a request body: the client serializes dicts as they are, but its annotations
    name only its model classes (V1Node, V1Service...), so the dict goes through as Any."""
    return obj


def custom_object(obj: object) -> dict[str, Any]:
    """A custom-objects API answer: the decoded JSON object (the client types it as `object`)."""
    assert isinstance(obj, dict), f"custom-objects API answered {type(obj).__name__}, not an object"
    return obj
