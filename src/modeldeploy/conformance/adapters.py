"""The LoRA adapter check: every adapter /v1/models lists answers under its own name, and
differently from the base model on a fixture prompt with greedy decoding; an unknown adapter
name is a 404.

A model card whose `parent` is the base model is an adapter (vLLM and modeldeploy list them
that way). A server listing none skips the check.
"""

from __future__ import annotations

from typing import Any

from modeldeploy.conformance.result import CheckResult, Target

PROMPT = "A tenant asked the support assistant about their invoice, and the assistant replied:"
MAX_TOKENS = 24


def listed_adapters(t: Target) -> list[str]:
    data = t.server.get_json("/v1/models")
    cards = data.get("data", []) if isinstance(data, dict) else []
    return [c["id"] for c in cards if isinstance(c, dict) and c.get("parent") == t.model and c.get("id")]


def _greedy(t: Target, model: str) -> tuple[int, Any]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, **t.extra()}
    r = t.server.post("/v1/completions", body)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text[:300]


def _text(body: Any) -> str | None:
    try:
        return body["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return None


def adapters(t: Target) -> CheckResult:
    res = CheckResult("adapters")
    names = listed_adapters(t)
    res.observations["adapters"] = names
    if not names:
        res.skip("/v1/models lists no adapter (no card with parent == the base model)")
        return res
    if t.is_modeldeploy:
        pinned = [a.get("name") for a in (t.bundle or {}).get("adapters") or [] if isinstance(a, dict)]
        res.observations["bundle_adapters"] = pinned
        res.expect(
            # key=str: an entry without a name (None) fails the comparison instead of the sort
            sorted(pinned, key=str) == sorted(names),
            f"/v1/bundle pins adapters {pinned}, /v1/models lists {names}",
        )
    status, body = _greedy(t, t.model)
    base = _text(body)
    res.observations["base"] = {"status": status, "text": base}
    if not res.expect(
        status == 200 and base is not None, f"base model {t.model!r} answered {status}: {body}"
    ):
        return res
    for name in names:
        status, body = _greedy(t, name)
        text = _text(body)
        res.observations[name] = {"status": status, "text": text}
        if not res.expect(status == 200 and text is not None, f"adapter {name!r} answered {status}: {body}"):
            continue
        res.expect(body.get("model") == name, f"adapter {name!r}: response model is {body.get('model')!r}")
        res.expect(
            text != base,
            f"adapter {name!r} answered exactly as the base model on the fixture prompt (greedy, "
            f"{MAX_TOKENS} tokens): the adapter is not applied",
        )
    unknown = names[0] + "-no-such-adapter"
    status, body = _greedy(t, unknown)
    err = error_field_of(body)
    res.observations["unknown"] = {"model": unknown, "status": status, "error": err}
    res.expect(status == 404, f"unknown adapter {unknown!r} answered {status}, expected 404")
    return res


def error_field_of(body: Any) -> dict[str, Any]:
    return body.get("error") or {} if isinstance(body, dict) else {}
