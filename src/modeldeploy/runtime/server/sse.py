"""Server-sent events: encoding, and a response that always runs its cleanup.

Starlette cancels a stream when the client disconnects, and never starts the body at all
when the client is gone before the first byte; `SSEResponse` runs `on_close` in both
cases, so the engine sequence is aborted and the admission slot released exactly once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse

DONE = b"data: [DONE]\n\n"


def event(data: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class SSEResponse(StreamingResponse):
    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]):
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
