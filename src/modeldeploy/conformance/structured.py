"""The structured-output check: a json_schema request returns JSON that parses and validates, on
any model (random weights included: the schema bounds every string, number and array), and a
schema feature the server cannot enforce is refused with a 400 that names it. The schema holds a
string bounded by `minLength`/`maxLength` alone (what pydantic's `Field(max_length=...)` writes),
so an engine whose grammar library lets a length limit through, or a raw control character (which
json.loads refuses: "not JSON"), fails.

The operator runs it when the bundle declares `config.structuredOutput: true`, so a canary whose
constrained decoding broke (an engine or grammar-library upgrade) is caught before traffic.
The validator covers exactly the keywords of the fixture schema: no jsonschema dependency in the
operator image.
"""

from __future__ import annotations

import json
import re
from typing import Any

from modeldeploy.conformance.http import error_field
from modeldeploy.conformance.result import CheckResult, Target

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "service": {"type": "string", "pattern": "^[a-z]{2,10}$"},
        "tier": {"enum": ["gold", "silver", "bronze"]},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 9},
        "healthy": {"type": "boolean"},
        "owner": {"type": "string", "minLength": 1, "maxLength": 8},
    },
    "required": ["service", "tier", "replicas", "healthy", "owner"],
    "additionalProperties": False,
}
UNSUPPORTED_FEATURE = "uniqueItems"
UNSUPPORTED_SCHEMA = {"type": "array", "items": {"type": "integer"}, UNSUPPORTED_FEATURE: True}


def violations(doc: Any, schema: dict[str, Any] = SCHEMA) -> list[str]:
    """Why `doc` does not satisfy the fixture schema (empty: it does)."""
    if not isinstance(doc, dict):
        return [f"not an object: {type(doc).__name__}"]
    props = schema["properties"]
    out = [f"missing required {k!r}" for k in schema["required"] if k not in doc]
    out += [f"unexpected property {k!r}" for k in doc if k not in props]
    for key, sub in props.items():
        if key not in doc:
            continue
        v = doc[key]
        if "enum" in sub and v not in sub["enum"]:
            out.append(f"{key}: {v!r} not in {sub['enum']}")
        elif sub.get("type") == "string":
            out += _string_violations(key, v, sub)
        elif sub.get("type") == "integer" and not (
            isinstance(v, int) and not isinstance(v, bool) and sub["minimum"] <= v <= sub["maximum"]
        ):
            out.append(f"{key}: {v!r} is not an integer in [{sub['minimum']}, {sub['maximum']}]")
        elif sub.get("type") == "boolean" and not isinstance(v, bool):
            out.append(f"{key}: {v!r} is not a boolean")
    return out


def _string_violations(key: str, v: Any, sub: dict[str, Any]) -> list[str]:
    if not isinstance(v, str):
        return [f"{key}: {v!r} is not a string"]
    out = []
    if "pattern" in sub and not re.search(sub["pattern"], v):
        out.append(f"{key}: {v!r} does not match {sub['pattern']}")
    if not sub.get("minLength", 0) <= len(v) <= sub.get("maxLength", len(v)):
        out.append(
            f"{key}: {v!r} has length {len(v)}, outside [{sub.get('minLength', 0)}, {sub.get('maxLength')}]"
        )
    return out


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "conformance", "schema": schema, "strict": True}}


def structured_output(t: Target) -> CheckResult:
    res = CheckResult("structured_output")
    cases = [
        ("chat_greedy", "/v1/chat/completions", {"temperature": 0}),
        ("chat_sampled", "/v1/chat/completions", {"temperature": 1.0, "seed": 7}),
        ("completion_greedy", "/v1/completions", {"temperature": 0}),
    ]
    for name, path, kw in cases:
        body: dict[str, Any] = {"model": t.model, "max_tokens": 200, "response_format": _format(SCHEMA), **kw}
        if path.endswith("chat/completions"):
            body["messages"] = [{"role": "user", "content": "Describe one service as JSON."}]
        else:
            body["prompt"] = "One service as JSON:"
        r = t.server.post(path, body)
        obs: dict[str, Any] = {"status": r.status_code}
        res.observations[name] = obs
        if not res.expect(r.status_code == 200, f"{name}: status {r.status_code}: {r.text[:200]}"):
            continue
        choice = (r.json().get("choices") or [{}])[0]
        text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
        obs.update(text=(text or "")[:300], finish_reason=choice.get("finish_reason"))
        res.expect(
            choice.get("finish_reason") == "stop", f"{name}: finish_reason {choice.get('finish_reason')!r}"
        )
        try:
            doc = json.loads(text or "")
        except json.JSONDecodeError as e:
            res.expect(False, f"{name}: output is not JSON ({e}): {(text or '')[:120]!r}")
            continue
        bad = violations(doc)
        obs["violations"] = bad
        res.expect(not bad, f"{name}: output does not validate against the schema: {'; '.join(bad)}")
    r = t.server.post(
        "/v1/chat/completions",
        {
            "model": t.model,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "x"}],
            "response_format": _format(UNSUPPORTED_SCHEMA),
        },
    )
    err = error_field(r)
    res.observations["unsupported_feature"] = {"status": r.status_code, "error": err}
    res.expect(r.status_code == 400, f"unsupported schema feature: status {r.status_code}, expected 400")
    named = UNSUPPORTED_FEATURE in f"{err.get('message')} {err.get('param')}"
    res.expect(named, f"unsupported schema feature: the error does not name {UNSUPPORTED_FEATURE!r}: {err}")
    return res
