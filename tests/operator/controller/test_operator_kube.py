"""Kube's cluster-wide lists (nodes, bound pods) come a page at a time: limit/continue, every item once."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from modeldeploy.operator.controller import kube
from modeldeploy.operator.controller.kube import Kube


class PagedLister:
    """A LIST endpoint serving `items` in pages of at most `limit`, the continue token an offset."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items, self.calls = items, []

    def __call__(self, **kw: Any) -> SimpleNamespace:
        self.calls.append(kw)
        start, limit = int(kw.get("_continue") or 0), kw["limit"]
        end = start + limit
        meta = {"continue": str(end)} if end < len(self.items) else {}
        page = {"items": self.items[start:end], "metadata": meta}
        return SimpleNamespace(data=json.dumps(page).encode())


def _kube(nodes: PagedLister, pods: PagedLister) -> Kube:
    k = Kube.__new__(Kube)
    k.core = SimpleNamespace(list_node=nodes, list_pod_for_all_namespaces=pods)
    return k


def test_cluster_wide_lists_are_paged_and_yield_every_item_once(monkeypatch) -> None:
    monkeypatch.setattr(kube, "LIST_PAGE", 3)
    nodes = PagedLister([{"metadata": {"name": f"n{i}"}} for i in range(7)])
    pods = PagedLister([{"metadata": {"name": f"p{i}"}} for i in range(3)])
    k = _kube(nodes, pods)
    assert [n["metadata"]["name"] for n in k.list_nodes()] == [f"n{i}" for i in range(7)]
    assert [c.get("_continue") for c in nodes.calls] == [None, "3", "6"]
    assert all(c["limit"] == 3 and c["_preload_content"] is False for c in nodes.calls)
    assert [p["metadata"]["name"] for p in k.list_bound_pods()] == ["p0", "p1", "p2"]
    assert len(pods.calls) == 1 and "spec.nodeName!=" in pods.calls[0]["field_selector"]
    list(k.list_unbound_pods())
    assert pods.calls[-1]["field_selector"] == "spec.nodeName=,status.phase=Pending"


def test_an_empty_cluster_lists_nothing_in_one_call() -> None:
    nodes = PagedLister([])
    assert list(_kube(nodes, PagedLister([])).list_nodes()) == [] and len(nodes.calls) == 1
