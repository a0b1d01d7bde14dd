"""The operator's API client: the few calls the reconcile makes, on one shared connection pool.

Every call asks for the raw body (`_preload_content=False`) and reads JSON itself: decoding
into the kubernetes client's models costs more than the reconcile's own work at scale.
Children are addressed by kind (Deployment, Service, HTTPRoute, NetworkPolicy), so `apply.py` maps an
action to one call without caring which API group serves it. Errors stay `ApiException`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, PLURAL, VERSION
from modeldeploy.operator.rollout.network import KIND as POLICY_KIND
from modeldeploy.operator.rollout.routing import KIND as ROUTE_KIND

ROUTE_API = ("gateway.networking.k8s.io", "v1", "httproutes")
LIST_PAGE = 250  # nodes or pods per page of a cluster-wide list
POOL_SIZE = 48  # above the 16 worker threads, apply's 16 and the resync task and ticks
MERGE = "application/merge-patch+json"
# the response body is read as JSON, not decoded into models; typed Any so `**RAW` fits every keyword
RAW: Mapping[str, Any] = MappingProxyType({"_preload_content": False})


def _body(obj: dict[str, Any]) -> Any:
    """A plain dict as a request body: the client serializes dicts as they are, but its annotations
    name only its model classes (V1Deployment, V1DeleteOptions...), so the dict goes through as Any."""
    return obj


def _json(resp: Any) -> dict[str, Any]:
    return json.loads(resp.data)


def _pages(lister: Callable[..., Any], **kw: Any) -> Iterator[dict[str, Any]]:
    """The items of a cluster-wide LIST, LIST_PAGE at a time (limit/continue): only one page's body and
    objects are held at once, not thousands of nodes or pods (tens of MB of JSON at 2,000 nodes)."""
    token: str | None = None
    while True:
        more = {"_continue": token} if token else {}
        body = _json(lister(limit=LIST_PAGE, **more, **kw, **RAW))
        yield from body.pop("items")
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return


class Kube:
    """Typed access to the API server for one operator process (one ApiClient, connections reused)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core, self.apps, self.custom = (
            client.CoreV1Api(api),
            client.AppsV1Api(api),
            client.CustomObjectsApi(api),
        )
        self.net = client.NetworkingV1Api(api)

    @classmethod
    def connect(cls) -> Kube:
        """In-cluster credentials, else $KUBECONFIG / ~/.kube/config."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        cfg = client.Configuration.get_default_copy()
        cfg.connection_pool_maxsize = POOL_SIZE
        return cls(client.ApiClient(cfg))

    def get_md(self, ns: str, name: str) -> dict[str, Any] | None:
        """The ModelDeployment, or None once it is gone."""
        try:
            return _json(self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, **RAW))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def get_configmap(self, ns: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap (the quality gate's evaluation set), or None when there is none."""
        try:
            return _json(self.core.read_namespaced_config_map(name, ns, **RAW))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def get_node(self, name: str) -> dict[str, Any] | None:
        """One Node (a lost-node check of the node a not-Ready pod of ours sits on), None if gone."""
        try:
            return _json(self.core.read_node(name, **RAW))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, kind: str, ns: str, selector: str) -> list[dict[str, Any]]:
        """Objects of `kind` (Deployment, Service, NetworkPolicy, Pod) by label."""
        lister = {
            "Deployment": self.apps.list_namespaced_deployment,
            "Service": self.core.list_namespaced_service,
            POLICY_KIND: self.net.list_namespaced_network_policy,
            "Pod": self.core.list_namespaced_pod,
        }[kind]
        return _json(lister(ns, label_selector=selector, **RAW))["items"]

    def list_routes(self, ns: str, selector: str) -> list[dict[str, Any]] | None:
        """HTTPRoutes by label; None when the cluster does not serve the Gateway API."""
        try:
            resp = self.custom.list_namespaced_custom_object(
                *ROUTE_API[:2], ns, ROUTE_API[2], label_selector=selector, **RAW
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return _json(resp)["items"]

    def list_nodes(self) -> Iterator[dict[str, Any]]:
        """Every node, a page at a time (see `_pages`)."""
        return _pages(self.core.list_node)

    def list_bound_pods(self) -> Iterator[dict[str, Any]]:
        """Every namespace's pods bound to a node and not finished: what holds the nodes' GPUs."""
        sel = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        return _pages(self.core.list_pod_for_all_namespaces, field_selector=sel)

    def list_unbound_pods(self) -> Iterator[dict[str, Any]]:
        """Every namespace's Pending pods not yet bound to a node: GPUs about to be taken."""
        sel = "spec.nodeName=,status.phase=Pending"
        return _pages(self.core.list_pod_for_all_namespaces, field_selector=sel)

    def create(self, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create a child; returns the object as stored (uid, generation, a Service's clusterIP)."""
        kind = obj["kind"]
        if kind == ROUTE_KIND:
            resp = self.custom.create_namespaced_custom_object(*ROUTE_API[:2], ns, ROUTE_API[2], obj, **RAW)
        elif kind == "Deployment":
            resp = self.apps.create_namespaced_deployment(ns, _body(obj), **RAW)
        elif kind == POLICY_KIND:
            resp = self.net.create_namespaced_network_policy(ns, _body(obj), **RAW)
        else:
            resp = self.core.create_namespaced_service(ns, _body(obj), **RAW)
        return _json(resp)

    def patch(self, kind: str, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of a child; returns the object as stored."""
        if kind == ROUTE_KIND:
            resp = self.custom.patch_namespaced_custom_object(
                *ROUTE_API[:2], ns, ROUTE_API[2], name, body, _content_type=MERGE, **RAW
            )
        elif kind == "Deployment":
            resp = self.apps.patch_namespaced_deployment(name, ns, body, _content_type=MERGE, **RAW)
        elif kind == POLICY_KIND:
            resp = self.net.patch_namespaced_network_policy(name, ns, body, _content_type=MERGE, **RAW)
        else:
            resp = self.core.patch_namespaced_service(name, ns, body, _content_type=MERGE, **RAW)
        return _json(resp)

    def delete(self, kind: str, ns: str, name: str) -> None:
        if kind == ROUTE_KIND:
            self.custom.delete_namespaced_custom_object(*ROUTE_API[:2], ns, ROUTE_API[2], name, **RAW)
        elif kind == "Deployment":
            self.apps.delete_namespaced_deployment(
                name, ns, body=_body({"propagationPolicy": "Background"}), **RAW
            )
        elif kind == POLICY_KIND:
            self.net.delete_namespaced_network_policy(name, ns, **RAW)
        elif kind == "Pod":  # only a pod the rollout waits on, stuck on a lost node (plan_lost_pods)
            self.core.delete_namespaced_pod(name, ns, **RAW)
        else:
            self.core.delete_namespaced_service(
                name, ns, body=_body({"propagationPolicy": "Background"}), **RAW
            )

    def annotate_md(self, ns: str, name: str, annotations: dict[str, str | None]) -> dict[str, Any]:
        """Merge patch of the ModelDeployment's annotations (None removes one); returns it as stored."""
        body = {"metadata": {"annotations": annotations}}
        return _json(
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, body, _content_type=MERGE, **RAW
            )
        )

    def replace_status(self, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Write the whole status; returns the object as stored (its resourceVersion tells the echo)."""
        # JSON patch `add /status` replaces the whole status, so fields plan() dropped go too
        body = [{"op": "add", "path": "/status", "value": status}]
        resp = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, PLURAL, name, body, _content_type="application/json-patch+json", **RAW
        )
        return _json(resp)

    def create_event(self, ns: str, body: dict[str, Any]) -> None:
        self.core.create_namespaced_event(ns, _body(body), **RAW)
