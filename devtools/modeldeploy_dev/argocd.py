"""The chart's Argo CD health check (Lua), run through lupa as Argo CD's gopher-lua would run it.

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
