"""Plain HTTP calls to a test server of the tiny model: a JSON POST, and a streamed one read as SSE."""

from __future__ import annotations

import json
from typing import Any

import httpx


def post(s: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST `body` to the server `s` (anything with a `.url`), the model named "tiny"."""
    return httpx.post(s.url + path, json={"model": "tiny", **body}, timeout=120)


def sse(s: Any, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed events of `body`: completions and chat end with [DONE] (checked and dropped),
    /v1/responses sends typed events and no [DONE]."""
    with httpx.stream("POST", s.url + path, json={"model": "tiny", "stream": True, **body}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    if path == "/v1/responses":
        return [json.loads(x) for x in lines]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]
