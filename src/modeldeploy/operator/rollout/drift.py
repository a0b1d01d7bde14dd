"""Create-or-revert for one child object: the desired-hash annotation tells our update from drift. Pure."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from modeldeploy.operator.api.v1alpha1.common import quantity_value
from modeldeploy.operator.rollout.actions import Action, Create, Event, Patch

DESIRED_HASH = "modeldeploy.dev/desired-hash"


def subset(want: Any, have: Any) -> bool:
    """Every field we set has our value (API defaults may add fields; lists must match in length)."""
    if isinstance(want, dict):
        # an empty list or map we set may come back left out (the API server omits empty fields)
        return isinstance(have, dict) and all(
            subset(v, have[k]) if k in have else v in ([], {}) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(subset(a, b) for a, b in zip(want, have, strict=True))
        )
    if want == have:
        return True
    if isinstance(want, str) and isinstance(have, str | int):
        return _same_quantity(want, str(have))
    return False


def _same_quantity(a: str, b: str) -> bool:
    try:
        return quantity_value(a) == quantity_value(b)
    except (ValueError, ArithmeticError):
        return False


def reconcile_child(want: dict[str, Any], have: dict[str, Any] | None) -> list[Action]:
    """Create, or patch back to `want` (stamping `want` with its desired hash)."""
    kind, name = want["kind"], want["metadata"]["name"]
    digest = hashlib.sha256(
        json.dumps([want["spec"], want["metadata"]["labels"]], sort_keys=True).encode()
    ).hexdigest()[:16]
    want["metadata"].setdefault("annotations", {})[DESIRED_HASH] = digest
    if have is None:
        return [Create(want), Event("Normal", "Created", f"created {kind} {name}")]
    fields = {
        "spec": want["spec"],
        "metadata": {"labels": want["metadata"]["labels"], "annotations": {DESIRED_HASH: digest}},
    }
    # a merge patch keeps map keys it does not name: a selector key we no longer want (e.g. the
    # bundle pin of `<name>` once the canary joins) is removed with an explicit null
    stale = set((have.get("spec") or {}).get("selector") or {}) - set(want["spec"].get("selector") or {})
    if kind == "Service" and stale:
        fields["spec"] = {**want["spec"], "selector": {**want["spec"]["selector"], **dict.fromkeys(stale)}}
    if subset(fields, have):  # (a null in the selector never matches, so it always patches)
        return []
    if (have["metadata"].get("annotations") or {}).get(DESIRED_HASH) == digest:
        note = Event("Normal", "DriftReverted", f"{kind} {name} was changed outside the operator; reverted")
    else:
        note = Event("Normal", "Updated", f"updated {kind} {name} to the desired state")
    return [Patch(kind, name, fields), note]


def one_created(actions: list[Action]) -> list[Action]:
    """The `Created` Events of one pass's child actions as one Event naming every child, in place of
    the last of them: a new object's Deployment and Services cost the API server one Event, not one
    each (Events are the largest share of its requests while many objects are created)."""
    events = {i: a for i, a in enumerate(actions) if isinstance(a, Event) and a.reason == "Created"}
    created = list(events)
    if len(created) < 2:
        return actions
    names = ", ".join(e.message.removeprefix("created ") for e in events.values())
    merged = Event("Normal", "Created", f"created {names}")
    return [
        merged if i == created[-1] else a
        for i, a in enumerate(actions)
        if i == created[-1] or i not in created
    ]
