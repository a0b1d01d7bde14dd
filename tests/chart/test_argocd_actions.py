"""Argo CD resource actions of a ModelDeployment (charts/modeldeploy-operator/argocd/actions/), run in
Lua 5.1 through lupa: which actions apply to which status, what each writes (only the annotation the
operator reads; never spec), and what the operator makes of it. e2e/test_gitops.py runs them through
the real Argo CD API and CLI."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from modeldeploy.operator.rollout.commands import command_from_annotations
from modeldeploy_dev.argocd import ACTION_NAMES, ACTIONS, ActionError, discover, run_action

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = ROOT / "charts/modeldeploy-operator/argocd/argocd-cm-snippet.yaml"
KEY = "resource.customizations.actions.serving.modeldeploy.dev_ModelDeployment"
HISTORY = [
    {"bundle": "1111111111111111", "revision": "r1", "replacedAt": "2026-01-01T00:00:00Z"},
    {"bundle": "2222222222222222", "revision": "r2", "replacedAt": "2026-01-02T00:00:00Z"},
]


def md(phase: str, history: list[dict[str, str]] | None = None, **annotations: str) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "serving.modeldeploy.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": "llm", "generation": 3},
        "spec": {"bundle": {"config": {"maxNumSeqs": 8}}},
        "status": {"phase": phase, "history": history or []},
    }
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    return obj


def enabled(obj: dict[str, Any]) -> set[str]:
    return {name for name, a in discover(obj).items() if not a.get("disabled")}


def test_the_snippet_carries_the_action_scripts_verbatim() -> None:
    data = yaml.safe_load(SNIPPET.read_text())["data"]
    actions = yaml.safe_load(data[KEY])
    assert actions["discovery.lua"] == (ACTIONS / "discovery.lua").read_text()
    assert [d["name"] for d in actions["definitions"]] == list(ACTION_NAMES)
    for d in actions["definitions"]:
        assert d["action.lua"] == (ACTIONS / d["name"] / "action.lua").read_text(), d["name"]


@pytest.mark.parametrize(
    ("phase", "history", "expected"),
    [
        ("Canary", HISTORY, {"promote", "abort", "rollback-to"}),
        ("Verifying", [], {"abort"}),
        ("Deploying", HISTORY, {"abort", "rollback-to"}),
        ("Stable", HISTORY, {"rollback-to"}),
        ("Stable", [], set()),
        ("RollingBack", HISTORY, {"rollback-to"}),
    ],
)
def test_discovery_offers_what_the_phase_allows(
    phase: str, history: list[dict[str, str]], expected: set[str]
) -> None:
    assert enabled(md(phase, history)) == expected
    # every action is listed (Argo CD greys out the disabled ones), rollback-to with its parameter
    listed = discover(md(phase, history))
    assert set(listed) == set(ACTION_NAMES)
    assert listed["rollback-to"]["params"] == [{"name": "bundle"}]


def test_discovery_of_an_object_without_status() -> None:
    obj = md("Stable")
    del obj["status"]
    assert enabled(obj) == set()


@pytest.mark.parametrize("name", ["promote", "abort"])
def test_promote_and_abort_write_one_timestamped_annotation_and_nothing_else(name: str) -> None:
    before = md("Canary", HISTORY, keep="me")
    after = run_action(copy.deepcopy(before), name)
    stamp = after["metadata"]["annotations"].pop(f"modeldeploy.dev/{name}")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp), stamp
    assert after == before  # spec, status and the other annotations untouched
    # the operator reads it as the command
    assert command_from_annotations({f"modeldeploy.dev/{name}": stamp}) == name


def test_promote_on_an_object_without_annotations() -> None:
    after = run_action(md("Canary"), "promote")
    assert set(after["metadata"]["annotations"]) == {"modeldeploy.dev/promote"}


def test_rollback_to_defaults_to_the_newest_history_entry() -> None:
    after = run_action(md("Stable", HISTORY), "rollback-to")
    assert after["metadata"]["annotations"] == {"modeldeploy.dev/rollback-to": "2222222222222222"}
    assert command_from_annotations(after["metadata"]["annotations"]) == "rollback-to:2222222222222222"


def test_rollback_to_the_named_bundle() -> None:
    after = run_action(md("Stable", HISTORY), "rollback-to", {"bundle": "1111111111111111"})
    assert after["metadata"]["annotations"] == {"modeldeploy.dev/rollback-to": "1111111111111111"}
    # an empty parameter (the UI's blank field) means the default
    after = run_action(md("Stable", HISTORY), "rollback-to", {"bundle": ""})
    assert after["metadata"]["annotations"] == {"modeldeploy.dev/rollback-to": "2222222222222222"}


def test_rollback_to_an_unknown_bundle_is_refused_by_name() -> None:
    with pytest.raises(ActionError, match="bundle 9999 is not in status.history; choose one of: 1111"):
        run_action(md("Stable", HISTORY), "rollback-to", {"bundle": "9999"})
    with pytest.raises(ActionError, match="status.history is empty"):
        run_action(md("Stable"), "rollback-to")
