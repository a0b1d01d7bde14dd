"""The chart's Argo CD health check and resource actions (Lua), run through lupa as Argo CD's
gopher-lua would run them.

Shared by the unit tests (status objects built or recorded) and the rollout e2e (live objects).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from lupa.lua51 import _LuaTable  # typeshed's name for a Lua table; no runtime class of that name

LUA = Path(__file__).resolve().parents[2] / "charts/modeldeploy-operator/argocd/health.lua"
ACTIONS = LUA.parent / "actions"
ACTION_NAMES = ("promote", "abort", "rollback-to")


class ActionError(Exception):
    """An action script refused the object (Lua `error`); Argo CD shows the message to the user."""


def _runtime(obj: dict[str, Any], params: dict[str, str] | None = None) -> Any:
    from lupa import lua51  # dev dependency: only tests evaluate the Lua

    lua = lua51.LuaRuntime(unpack_returned_tuples=False)
    lua.globals()["obj"] = lua.table_from(obj, recursive=True)
    # Argo CD sets `actionParams` for every action run, empty when the user gave none
    lua.globals()["actionParams"] = lua.table_from(params or {})
    return lua


def _plain(v: Any) -> Any:
    """A Lua table as JSON-like Python: a table with keys 1..n is a list (Argo CD's decoding)."""
    from lupa import lua51

    if lua51.lua_type(v) != "table":
        return v
    keys = list(v.keys())
    if keys and all(isinstance(k, int) for k in keys) and sorted(keys) == list(range(1, len(keys) + 1)):
        return [_plain(v[k]) for k in sorted(keys)]
    return {k: _plain(v[k]) for k in keys}


def discover(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """discovery.lua's answer: action name -> {disabled, iconClass, params}."""
    return _plain(_runtime(obj).execute((ACTIONS / "discovery.lua").read_text()))


def run_action(obj: dict[str, Any], name: str, params: dict[str, str] | None = None) -> dict[str, Any]:
    """The object as the action returns it (Argo CD patches the live object to it)."""
    from lupa import lua51

    try:
        out = _runtime(obj, params).execute((ACTIONS / name / "action.lua").read_text())
    except lua51.LuaError as e:
        raise ActionError(str(e)) from e
    return _plain(out)


def health(obj: dict[str, Any], script: str | None = None) -> tuple[str, str]:
    """(status, message) of a ModelDeployment object, e.g. ("Suspended", "Canary paused: ...")."""
    from lupa import lua51  # dev dependency: only tests evaluate the Lua

    lua = lua51.LuaRuntime(unpack_returned_tuples=False)  # lupa's default, named for its type stubs
    lua.globals()["obj"] = lua.table_from(obj, recursive=True)
    ret = lua.execute(script if script is not None else LUA.read_text())
    # Argo CD's contract: a health script returns a table {status=..., message=...}
    assert lua51.lua_type(ret) == "table", f"health script returned {ret!r}, not a table"
    hs = cast("_LuaTable", ret)
    return hs["status"], hs["message"]


def checked(md: dict[str, Any], expected: str, label: str) -> str:
    """Assert the health of a live object; with MODELDEPLOY_RECORD_STATUS=DIR also write it to
    DIR/<label>.json with its health, for the unit tests to replay (tests/data/argocd/)."""
    status, message = health(md)
    out = os.environ.get("MODELDEPLOY_RECORD_STATUS")
    if out:
        keep = {
            "apiVersion": md["apiVersion"],
            "kind": md["kind"],
            "metadata": {k: md["metadata"][k] for k in ("name", "generation")},
            "status": md["status"],
        }
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{label}.json").write_text(
            json.dumps({"expected": [status, message], "object": keep}, indent=1)
        )
    assert status == expected, (label, status, message, md.get("status"))
    return message
