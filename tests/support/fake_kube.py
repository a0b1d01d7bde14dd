"""An in-memory API server with `operator.kube.Kube`'s methods, for Controller unit tests.

It keeps objects by (kind, namespace, name), gives each a uid and a resourceVersion that
changes on every write, filters lists by an equality label selector and answers 404 for
missing objects, as the real API server does. The e2e tests run the same Controller against
a real kube-apiserver; this is for the fast tier.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from kubernetes.client.exceptions import ApiException

from modeldeploy.operator.api.v1alpha1.modeldeployment import GROUP, VERSION
from modeldeploy.operator.rollout.routing import KIND as ROUTE_KIND

MD = "ModelDeployment"


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.nodes: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        meta["resourceVersion"] = str(next(self._rv))
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj
        return obj

    def remove(self, kind: str, ns: str, name: str) -> None:
        if self.objects.pop((kind, ns, name), None) is None:
            raise ApiException(status=404, reason="Not Found")

    def _get(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        try:
            return self.objects[(kind, ns, name)]
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None

    def get_md(self, ns: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((MD, ns, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, kind: str, ns: str, selector: str) -> list[dict[str, Any]]:
        want = dict(term.split("=", 1) for term in selector.split(","))
        return [
            copy.deepcopy(o)
            for (k, n, _), o in self.objects.items()
            if k == kind and n == ns and want.items() <= (o["metadata"].get("labels") or {}).items()
        ]

    def list_routes(self, ns: str, selector: str) -> list[dict[str, Any]] | None:
        return self.list(ROUTE_KIND, ns, selector)

    def list_nodes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.nodes)

    def get_node(self, name: str) -> dict[str, Any] | None:
        return next((copy.deepcopy(n) for n in self.nodes if n["metadata"]["name"] == name), None)

    def list_bound_pods(self) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (k, _, _), o in self.objects.items()
            if k == "Pod" and o["spec"].get("nodeName")
        ]

    def list_unbound_pods(self) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (k, _, _), o in self.objects.items()
            if k == "Pod"
            and not o["spec"].get("nodeName")
            and (o.get("status") or {}).get("phase") == "Pending"
        ]

    def create(self, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        if (obj["kind"], ns, obj["metadata"]["name"]) in self.objects:
            raise ApiException(status=409, reason="Conflict")
        stored = self.put({**obj, "metadata": {**obj["metadata"], "namespace": ns, "generation": 1}})
        return copy.deepcopy(stored)

    def patch(self, kind: str, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(self._get(kind, ns, name))
        _merge(obj, body)
        return copy.deepcopy(self.put(obj))

    def delete(self, kind: str, ns: str, name: str) -> None:
        self.remove(kind, ns, name)

    def annotate_md(self, ns: str, name: str, annotations: dict[str, str | None]) -> dict[str, Any]:
        return self.patch(MD, ns, name, {"metadata": {"annotations": annotations}})

    def replace_status(self, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(self._get(MD, ns, name))
        obj["status"] = copy.deepcopy(status)
        return copy.deepcopy(self.put(obj))

    def create_event(self, ns: str, body: dict[str, Any]) -> None:
        assert body["involvedObject"]["apiVersion"] == f"{GROUP}/{VERSION}"
        self.events.append(body)


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386): null removes, maps merge, everything else replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)
