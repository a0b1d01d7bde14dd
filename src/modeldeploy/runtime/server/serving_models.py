"""/v1/models and /v1/bundle: what this server serves.

/v1/models lists the base model and each LoRA adapter (`parent`: the base model) as OpenAI's model
cards; /v1/bundle is the whole bundle (model, tokenizer, adapters, engine and server settings), so a
caller can check exactly what answers it.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from modeldeploy.runtime.server.context import ServerContext


class OpenAIServingModels:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    async def models(self) -> JSONResponse:
        ctx = self.ctx
        max_len = ctx.effective_config().get("max_model_len")
        base = ctx.cfg.served_model_name

        def card(name: str, parent: str | None) -> dict[str, Any]:
            return {
                "id": name,
                "object": "model",
                "created": ctx.created,
                "owned_by": "modeldeploy",
                "root": base,
                "parent": parent,  # LoRA adapters name their base model
                "max_model_len": max_len,
            }

        cards = [card(base, None)] + [card(n, base) for n in ctx.adapter_names]
        return JSONResponse({"object": "list", "data": cards})

    async def bundle(self) -> JSONResponse:
        return JSONResponse(self.ctx.bundle())
