"""Manual rollout commands as annotations on the ModelDeployment: their names and what they mean. Pure.

`modeldeploy rollout promote|abort|rollback` (rollout_cli.py) sets them; the reconcile reads
them into `rollout.Signals.command` and removes them once acted on, so a command acts once
and survives an operator restart until then. The operator never writes spec (GitOps owns it).
"""

from __future__ import annotations

PROMOTE = "modeldeploy.dev/promote"
ABORT = "modeldeploy.dev/abort"
ROLLBACK_TO = "modeldeploy.dev/rollback-to"
ANNOTATIONS = (ABORT, ROLLBACK_TO, PROMOTE)  # precedence when several are set


def command_from_annotations(annotations: dict[str, str] | None) -> str | None:
    """What `rollout.Signals.command` should be for these annotations (abort > rollback-to > promote)."""
    a = annotations or {}
    if a.get(ABORT):
        return "abort"
    if a.get(ROLLBACK_TO):
        return f"rollback-to:{a[ROLLBACK_TO]}"
    if a.get(PROMOTE):
        return "promote"
    return None


def pending(annotations: dict[str, str] | None) -> tuple[str, ...]:
    """The command annotations set on the object (removed by the reconcile that acts on them)."""
    a = annotations or {}
    return tuple(k for k in ANNOTATIONS if a.get(k))
