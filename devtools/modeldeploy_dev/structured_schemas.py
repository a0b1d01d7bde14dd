"""The structured-output test schemas: nested objects, arrays, enums, required fields, bounded
numbers, string patterns and (`limits`) what pydantic writes: `minLength`/`maxLength`, a pattern
with a `maxLength`, formats, `minItems`/`maxItems`. Strings are bounded (by a pattern or a length
limit) because a random-weight model rarely closes a free string within a test's token budget.
tests/runtime/engine/structured_output/test_structured_engine.py decodes them;
bench/structured_output.py times their compilation.
"""

from __future__ import annotations

from typing import Any

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
        },
        "required": ["name", "age"],
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"enum": ["A1", "B2", "C3"]},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                    },
                    "required": ["sku", "qty"],
                },
                "minItems": 1,
                "maxItems": 3,
            },
            "express": {"type": "boolean"},
        },
        "required": ["id", "items"],
    },
    "reading": {
        "type": "object",
        "properties": {
            "sensor": {"enum": ["temp", "humidity", "pressure"]},
            "value": {"type": "number", "minimum": -40, "maximum": 125},
            "ok": {"type": "boolean"},
        },
        "required": ["sensor", "value", "ok"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "config": {
                "type": "object",
                "properties": {
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 8},
                    "mode": {"enum": ["canary", "stable"]},
                    "limits": {
                        "type": "object",
                        "properties": {"gpu": {"type": "integer", "minimum": 0, "maximum": 8}},
                        "required": ["gpu"],
                    },
                },
                "required": ["replicas", "mode", "limits"],
            }
        },
        "required": ["config"],
    },
    "refs": {
        "$defs": {
            "point": {
                "type": "array",
                "prefixItems": [
                    {"type": "integer", "minimum": -99, "maximum": 99},
                    {"type": "integer", "minimum": 0, "maximum": 999},
                ],
            }
        },
        "type": "object",
        "properties": {
            "label": {"type": "string", "pattern": "^[a-z]{2,6}$"},
            "path": {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2},
            "kind": {"const": "polyline"},
        },
        "required": ["label", "kind"],
    },
    "limits": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": 10},
            "slug": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 12},
            "when": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 4},
                "minItems": 1,
                "maxItems": 2,
            },
        },
        "required": ["title", "slug", "when", "id", "tags"],
    },
}
