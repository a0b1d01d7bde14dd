"""Output checks a workload item may carry: goodput that counts quality.

A dataset row may hold `"check": {"exact": S} | {"contains": S} | {"regex": R} | {"json_schema": {...}}`
(one kind), and optionally `"response_format"`, sent as is (so structured output can be
benchmarked with its own schema as the check). A request with a check is good only if it meets
the latency SLO *and* its completed output passes the check (a fast wrong answer is not good
output, so goodput means meeting the stated latency and quality targets); the pass rate over the
checked requests is reported beside goodput. Same semantics as the operator's quality gate
(operator/analysis/quality_checks.py, which this package cannot import): exact compares stripped
text, contains is case-insensitive, regex is Python's `re.search`, json_schema parses the whole
output (or its first `{...}`/`[...]` span: models wrap JSON in prose) and validates it with
`jsonschema` (imported only when a workload has such a check, since the base install does not
carry it).
"""

from __future__ import annotations

import json
import re
from typing import Any

KINDS = ("exact", "contains", "regex", "json_schema")


def parse_check(obj: Any, where: str) -> dict[str, Any]:
    """A workload row's `check`, validated: one kind, of the right type (ValueError naming `where`)."""
    if not isinstance(obj, dict) or len(obj) != 1 or next(iter(obj)) not in KINDS:
        raise ValueError(f"{where}: check must be an object with exactly one of {', '.join(KINDS)}")
    kind, value = next(iter(obj.items()))
    if kind == "json_schema":
        if not isinstance(value, dict):
            raise ValueError(f"{where}: check.json_schema must be a JSON Schema object")
        validator = _validator_class()
        try:
            validator.check_schema(value)
        except Exception as e:  # jsonschema.SchemaError
            raise ValueError(f"{where}: check.json_schema is not a valid schema: {str(e)[:200]}") from None
    elif not isinstance(value, str):
        raise ValueError(f"{where}: check.{kind} must be a string")
    elif kind == "regex":
        try:
            re.compile(value)
        except re.error as e:
            raise ValueError(f"{where}: check.regex does not compile: {e}") from None
    return {kind: value}


def _validator_class() -> Any:
    try:
        import jsonschema
    except ImportError:
        raise ValueError(
            "a json_schema check needs the jsonschema package (pip install jsonschema)"
        ) from None
    return jsonschema.Draft202012Validator


def json_doc(text: str) -> Any:
    """The text as JSON: the whole of it, else its first {...} or [...] span (models wrap JSON in prose
    or a code fence); raises ValueError when there is none. The quality gate's checks use it too."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no JSON object or array in the output")
    doc, _ = json.JSONDecoder().raw_decode(text[min(starts) :])
    return doc


def run_check(check: dict[str, Any], text: str) -> tuple[bool, str | None]:
    """(passed, why not) for one output."""
    kind, value = next(iter(check.items()))
    if kind == "exact":
        ok = text.strip() == value.strip()
        return ok, None if ok else f"not exactly {value[:60]!r}"
    if kind == "contains":
        ok = value.casefold() in text.casefold()
        return ok, None if ok else f"does not contain {value[:60]!r}"
    if kind == "regex":
        ok = re.search(value, text) is not None
        return ok, None if ok else f"does not match {value[:60]!r}"
    try:
        doc = json_doc(text)
    except ValueError as e:
        return False, f"not JSON: {str(e)[:100]}"
    err = next(iter(_validator_class()(value).iter_errors(doc)), None)
    return err is None, None if err is None else f"schema: {err.message[:160]}"
