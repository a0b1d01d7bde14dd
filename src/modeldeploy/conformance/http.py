"""HTTP plumbing of the suite: one httpx client per server, SSE parsing.

Pure HTTP on purpose (no torch, no engine import): the operator runs this suite against
every canary pod, and users point it at other OpenAI-compatible servers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class SSEEvent:
    event: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def iter_sse(lines: Iterable[str]) -> Iterator[SSEEvent]:
    """Parse `text/event-stream` lines into events (comments and `id:`/`retry:` ignored)."""
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield SSEEvent(name, "\n".join(data))
            name, data = None, []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield SSEEvent(name, "\n".join(data))


class Server:
    """An OpenAI-compatible server at `url` (with or without a trailing /v1)."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 60.0):
        url = url.rstrip("/")
        self.base = url[:-3] if url.endswith("/v1") else url
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.client = self.new_client()

    def new_client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=self.timeout_s)

    def get(self, path: str) -> httpx.Response:
        return self.client.get(path)

    def post(self, path: str, body: Any = None, *, content: bytes | None = None) -> httpx.Response:
        if content is not None:
            return self.client.post(path, content=content, headers={"Content-Type": "application/json"})
        return self.client.post(path, json=body)

    def get_json(self, path: str) -> Any | None:
        """GET and decode, or None when the endpoint is absent or not JSON."""
        try:
            r = self.get(path)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def close(self) -> None:
        self.client.close()


def error_field(resp: httpx.Response) -> dict[str, Any]:
    """The `error` object of an OpenAI-format error body ({} when the body is not one)."""
    try:
        body = resp.json()
    except ValueError:
        return {}
    err = body.get("error") if isinstance(body, dict) else None
    return err if isinstance(err, dict) else {}
