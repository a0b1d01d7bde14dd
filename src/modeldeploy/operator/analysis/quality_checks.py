"""The quality gate's answer checks: one answer against its item's one check (exact, contains,
regex or a JSON Schema, validated here for the keywords the API admits). The figures over a set and the
verdict are in quality_verdict.py; no I/O here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from modeldeploy.conformance.bench.checks import json_doc
from modeldeploy.operator.api.v1alpha1.quality import EvalItem

_TYPES: Mapping[str, Callable[[Any], bool]] = MappingProxyType(
    {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
)


def schema_violations(doc: Any, schema: dict[str, Any], at: str = "$") -> list[str]:
    """Why `doc` does not satisfy `schema` (empty: it does), for the keywords the API admits
    (api/v1alpha1/quality.py SCHEMA_KEYWORDS): no jsonschema dependency in the operator image."""
    t = schema.get("type")
    types = t if isinstance(t, list) else [t] if t is not None else []
    if types and not any(_TYPES[x](doc) for x in types):
        return [f"{at}: {type(doc).__name__} is not {'/'.join(types)}"]
    out: list[str] = []
    if "enum" in schema and doc not in schema["enum"]:
        out.append(f"{at}: {doc!r} not in {schema['enum']}")
    if "const" in schema and doc != schema["const"]:
        out.append(f"{at}: {doc!r} is not {schema['const']!r}")
    if isinstance(doc, int | float) and not isinstance(doc, bool):
        if doc < schema.get("minimum", -math.inf) or doc > schema.get("maximum", math.inf):
            out.append(f"{at}: {doc} outside the schema's minimum/maximum")
    elif isinstance(doc, str):
        if not schema.get("minLength", 0) <= len(doc) <= schema.get("maxLength", math.inf):
            out.append(f"{at}: length {len(doc)} outside the schema's minLength/maxLength")
        if "pattern" in schema and not re.search(schema["pattern"], doc):
            out.append(f"{at}: {doc!r} does not match {schema['pattern']!r}")
    elif isinstance(doc, list):
        out += _array(doc, schema, at)
    elif isinstance(doc, dict):
        out += _object(doc, schema, at)
    return out


def _array(doc: list[Any], schema: dict[str, Any], at: str) -> list[str]:
    out: list[str] = []
    if not schema.get("minItems", 0) <= len(doc) <= schema.get("maxItems", math.inf):
        out.append(f"{at}: {len(doc)} items outside the schema's minItems/maxItems")
    if isinstance(schema.get("items"), dict):
        for i, v in enumerate(doc):
            out += schema_violations(v, schema["items"], f"{at}[{i}]")
    return out


def _object(doc: dict[str, Any], schema: dict[str, Any], at: str) -> list[str]:
    props = schema.get("properties") or {}
    out = [f"{at}: missing required {k!r}" for k in schema.get("required") or [] if k not in doc]
    extra = schema.get("additionalProperties", True)
    for k, v in doc.items():
        if k in props:
            out += schema_violations(v, props[k], f"{at}.{k}")
        elif extra is False:
            out.append(f"{at}: unexpected property {k!r}")
        elif isinstance(extra, dict):
            out += schema_violations(v, extra, f"{at}.{k}")
    return out


def check(item: EvalItem, answer: str) -> tuple[bool, str]:
    """(passed, why not) for one answer against the item's one check."""
    if item.exact is not None:
        ok = answer.strip() == item.exact.strip()
        return ok, "" if ok else f"not exactly {item.exact!r}"
    if item.contains is not None:
        ok = item.contains.casefold() in answer.casefold()
        return ok, "" if ok else f"does not contain {item.contains!r}"
    if item.regex is not None:
        ok = re.search(item.regex, answer) is not None
        return ok, "" if ok else f"does not match {item.regex!r}"
    try:
        doc = json_doc(answer)
    except ValueError as e:
        return False, f"not JSON: {e}"
    bad = schema_violations(doc, item.json_schema or {})
    return not bad, "; ".join(bad[:3])
