"""The FastAPI application: routes, auth, error format, and the background load.

`create_app(cfg)` builds everything in-process (tests drive it through a real uvicorn or
httpx's ASGI transport); `modeldeploy serve` wraps it with uvicorn and SIGTERM draining.
There are no admin, weight-reload or adapter load/unload endpoints: a bundle (LoRA adapters
included) is changed by rolling pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from modeldeploy.runtime.engine.client.base import EngineClient
from modeldeploy.runtime.engine.client.factory import make_client
from modeldeploy.runtime.server import readiness
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy.runtime.server.context import ServerContext
from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.evidence import EvidenceMiddleware
from modeldeploy.runtime.server.serving_chat import OpenAIServingChat
from modeldeploy.runtime.server.serving_completion import OpenAIServingCompletion
from modeldeploy.runtime.server.serving_models import OpenAIServingModels
from modeldeploy.runtime.server.serving_responses import OpenAIServingResponses
from modeldeploy.runtime.server.tracing import Tracing

log = logging.getLogger("modeldeploy.server")
PROM_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def create_app(cfg: ServerConfig, engine: EngineClient | None = None, freeze_heap: bool = False) -> FastAPI:
    """Build the app; the engine client (default: `make_client(cfg.engine, cfg.engine_core)`) is built
    and loaded in the background once the app starts, so health endpoints answer while it loads.
    `freeze_heap`: freeze this process's heap once loaded (`modeldeploy serve`; runtime/engine/heap.py)."""
    cfg.validate()
    cfg.limits.validate()
    ctx = ServerContext(cfg, None)
    tracing = Tracing.from_env(ctx.metrics.labels)  # None unless OTEL_EXPORTER_OTLP_ENDPOINT is set

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(
            readiness.load(_client_factory(cfg, engine), ctx.attach, ctx.state, cfg.load_delay_s, freeze_heap)
        )
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            if ctx.state.load_seconds:
                await ctx.engine.shutdown()
            if tracing is not None:
                tracing.shutdown()

    app = FastAPI(
        title="modeldeploy runtime", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.ctx = ctx
    _errors(app)
    if cfg.api_key is not None:
        app.add_middleware(BearerAuth, api_key=cfg.api_key, gate_key_sha256=cfg.gate_key_sha256)
    _health_routes(app, ctx)
    _api_routes(app, ctx)
    # outermost (added last): its headers reach every response, 401s from `auth` included
    app.add_middleware(
        EvidenceMiddleware, bundle=cfg.engine.bundle_id, labels=ctx.metrics.labels, tracing=tracing
    )
    return app


def _client_factory(cfg: ServerConfig, engine: EngineClient | None) -> Callable[[], EngineClient]:
    """What readiness.load calls on a worker thread: the given client, or a new one for the layout
    (the thread layout imports torch there, off the event loop, after the port has opened)."""

    def make() -> EngineClient:
        return engine if engine is not None else make_client(cfg.engine, cfg.engine_core)

    return make


def _health_routes(app: FastAPI, ctx: ServerContext) -> None:
    @app.get("/health/live")
    async def live() -> JSONResponse:
        return JSONResponse(ctx.state.body(), status_code=200 if ctx.live else 503)

    @app.get("/health/ready")
    async def ready() -> JSONResponse:
        return JSONResponse(ctx.state.body(), status_code=200 if ctx.ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=PROM_TEXT)


def _api_routes(app: FastAPI, ctx: ServerContext) -> None:
    """The OpenAI-compatible API: one serving object per endpoint (serving_*.py)."""
    serving_models = OpenAIServingModels(ctx)
    serving_completion = OpenAIServingCompletion(ctx)
    serving_chat = OpenAIServingChat(ctx)
    serving_responses = OpenAIServingResponses(ctx)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return await serving_models.models()

    @app.get("/v1/bundle")
    async def bundle() -> JSONResponse:
        return await serving_models.bundle()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serving_completion.handle(request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await serving_chat.handle(request)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await serving_responses.handle(request)


class BearerAuth:
    """`Authorization: Bearer KEY` on /v1/*; health and metrics stay open. Pure ASGI: starlette's
    `@app.middleware("http")` relays every streamed chunk through a memory stream and a task, which
    cost a large share of the server's CPU under many streams (bench/results/server_cpu.md).

    `gate_key_sha256`: a second token is accepted, the one whose sha256 is this digest. The operator
    derives it and the pod is given only the digest, so the operator's gates can ask a keyed pod
    without the operator reading the API key's Secret, and a pod that saw the digest cannot ask."""

    def __init__(self, app: Any, api_key: str, gate_key_sha256: str | None = None) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()
        self.gate = bytes.fromhex(gate_key_sha256) if gate_key_sha256 else None

    def _allowed(self, given: bytes) -> bool:
        if hmac.compare_digest(given, self.expected):
            return True
        if self.gate is None or not given.startswith(b"Bearer "):
            return False
        return hmac.compare_digest(hashlib.sha256(given[7:]).digest(), self.gate)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith("/v1/"):
            given = next((v for k, v in scope.get("headers", []) if k.lower() == b"authorization"), b"")
            if not self._allowed(given):
                err = APIError(
                    401,
                    "missing or invalid API key (send 'Authorization: Bearer <key>')",
                    code="invalid_api_key",
                )
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = {
            404: f"no route {request.url.path}",
            405: f"method {request.method} not allowed on {request.url.path}",
        }.get(exc.status_code, str(exc.detail))
        return APIError(exc.status_code, msg).response()

    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return APIError(400, f"invalid request: {exc.errors()[0].get('msg')}").response()

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error").response()
