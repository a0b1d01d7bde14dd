"""Kubernetes schema validation of rendered manifests (strict: unknown fields are errors)."""

from __future__ import annotations

from typing import Any

import jsonschema


def strict(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that refuses unknown fields."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def errors(schema: Any, obj: dict[str, Any]) -> list[str]:
    v = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(obj)]
