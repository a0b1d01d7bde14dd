"""What a generation request must pass before its body is a request: the body's size, the client's
deadline header, and a `model` that is a plain name."""

from __future__ import annotations

from fastapi import Request

from modeldeploy.runtime.server.context import ServerContext
from modeldeploy.runtime.server.errors import APIError

DEADLINE = "x-request-deadline-ms"
_PATH_CHARS = ("/", "\\", "..", "\x00")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, read only up to `max_bytes`: a declared or streamed body beyond it is a 413 at once,
    before any of it is parsed (a client that sends 10 MB learns the bound, the server holds none of it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(int(declared), max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(size, max_bytes, at_least=True)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, bound: int, at_least: bool = False) -> APIError:
    return APIError(
        413,
        f"request body: {'over ' if at_least else ''}{size} bytes, over the {bound}-byte limit "
        "(limit: --max-body-bytes)",
        code="request_too_large",
    )


def check_model_name(ctx: ServerContext, name: str) -> None:
    """A `model` that is no served name and carries path or control characters is a 400 saying so
    (adapter names are plain names: DNS labels in a ModelDeployment), never a lookup or a path."""
    if name in ctx.served_models:
        return
    bad = next((c for c in _PATH_CHARS if c in name), None) or next(
        (c for c in name if not c.isprintable()), None
    )
    if bad is not None:
        raise APIError(
            400,
            f"model: {name[:64]!r} contains {bad!r}; model and adapter names never contain path "
            "separators, '..' or control characters",
            param="model",
            code="invalid_value",
        )


def request_deadline(request: Request) -> float | None:
    """The client's wait budget in seconds (header x-request-deadline-ms), or None."""
    raw = request.headers.get(DEADLINE)
    if raw is None:
        return None
    if not raw.isdigit() or not 0 < int(raw) <= 3_600_000:
        raise APIError(400, f"{DEADLINE}: must be an integer of milliseconds in 1..3600000", param=DEADLINE)
    return int(raw) / 1000
