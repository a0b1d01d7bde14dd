"""The three generation endpoints: /v1/completions, /v1/chat/completions, /v1/responses."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from modeldeploy.runtime.server import evidence
from modeldeploy.runtime.server import formats as F
from modeldeploy.runtime.server.context import ServerContext
from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.job import ClientGone, Job, race_disconnect
from modeldeploy.runtime.server.metrics import refusal_outcome
from modeldeploy.runtime.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponsesRequest,
    parse_body,
)
from modeldeploy.runtime.server.sse import DONE, SSEResponse, event

KINDS = {"completion": CompletionRequest, "chat": ChatCompletionRequest, "responses": ResponsesRequest}
_PREFIX = {"completion": "cmpl-", "chat": "chatcmpl-", "responses": "resp_"}


def _prepare(ctx: ServerContext, kind: str, req: Any) -> tuple[list[int], Any]:
    if kind == "completion":
        req.check_n()
        if isinstance(req.prompt, str):
            ids = ctx.encode_text(req.prompt) if req.prompt else []
        else:
            ids = list(req.prompt)
            ctx.check_ids(ids, "prompt")
        max_tokens = ctx.limit_tokens(len(ids), req.max_tokens, "max_tokens", "prompt")
    elif kind == "chat":
        req.check_n()
        limit = req.token_limit()
        ids = ctx.encode_chat([{"role": m.role, "content": m.text()} for m in req.messages])
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = ctx.limit_tokens(len(ids), limit, param, "messages")
    else:
        ids = ctx.encode_chat(req.messages())
        max_tokens = ctx.limit_tokens(len(ids), req.max_output_tokens, "max_output_tokens", "input")
    return ids, ctx.sampling(req, max_tokens)


async def generate(ctx: ServerContext, request: Request, kind: str) -> Response:
    arrival = time.monotonic()
    try:
        ctx.check_serving()
    except APIError as e:
        ctx.metrics.outcome(refusal_outcome(e.status))
        raise
    except Exception:
        ctx.metrics.outcome("error")
        raise
    adapter = None
    try:
        req = parse_body(await request.body(), KINDS[kind])
        adapter = ctx.check_model(req.model)
        ids, params = _prepare(ctx, kind, req)
    except APIError as e:
        ctx.metrics.outcome(refusal_outcome(e.status), adapter or "")
        raise
    except Exception:
        ctx.metrics.outcome("error", adapter or "")
        raise
    rid = _PREFIX[kind] + uuid.uuid4().hex
    job = Job(ctx, rid, ids, params, arrival, adapter)
    job.evidence = evidence.of(request)
    created = int(time.time())
    model = req.model  # the base model's name or the adapter's, as the client asked
    try:
        first_or_final = await race_disconnect(request, job.start() if req.stream else job.run())
    except ClientGone:
        await job.close(client_gone=True)
        return Response(status_code=499)  # nobody reads it; the client is gone
    except BaseException:
        await job.close(client_gone=False)
        raise
    if not req.stream:
        await job.close(client_gone=False)
        out = first_or_final
        if kind == "completion":
            return JSONResponse(F.completion(rid, created, model, out))
        if kind == "chat":
            return JSONResponse(F.chat(rid, created, model, out))
        return JSONResponse(F.response(rid, "msg_" + rid[5:], created, model, req, out))
    stream = {"completion": _completion_stream, "chat": _chat_stream, "responses": _responses_stream}[kind]
    return SSEResponse(
        stream(job, first_or_final, rid, created, model, req), on_close=lambda: job.close(client_gone=True)
    )


async def _all(job: Job, first: Any) -> AsyncIterator[Any]:
    yield first
    async for out in job.outputs():
        yield out


async def _completion_stream(
    job: Job, first: Any, rid: str, created: int, model: str, req: Any
) -> AsyncIterator[bytes]:
    usage = req.include_usage
    last = first
    async for out in _all(job, first):
        last = out
        if out.delta_text or out.finished:
            finish = out.finish_reason if out.finished else None
            yield event(F.completion_chunk(rid, created, model, out.delta_text, finish, usage))
    if usage:
        yield event(F.usage_chunk(rid, created, model, "text_completion", last))
    yield DONE


async def _chat_stream(
    job: Job, first: Any, rid: str, created: int, model: str, req: Any
) -> AsyncIterator[bytes]:
    usage = req.include_usage
    yield event(F.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None, usage))
    last = first
    async for out in _all(job, first):
        last = out
        if out.delta_text:
            yield event(F.chat_chunk(rid, created, model, {"content": out.delta_text}, None, usage))
        if out.finished:
            yield event(F.chat_chunk(rid, created, model, {}, out.finish_reason, usage))
    if usage:
        yield event(F.usage_chunk(rid, created, model, "chat.completion.chunk", last))
    yield DONE


async def _responses_stream(
    job: Job, first: Any, rid: str, created: int, model: str, req: Any
) -> AsyncIterator[bytes]:
    seq = 0
    msg_id = "msg_" + rid[5:]
    where = {"item_id": msg_id, "output_index": 0, "content_index": 0}

    def ev(kind: str, **data: Any) -> bytes:
        nonlocal seq
        seq += 1
        return event({"type": kind, "sequence_number": seq - 1, **data}, name=kind)

    shell = F.response(rid, msg_id, created, model, req, None)
    yield ev("response.created", response=shell)
    yield ev("response.in_progress", response=shell)
    yield ev("response.output_item.added", output_index=0, item=F.message_item(msg_id, None, "in_progress"))
    yield ev("response.content_part.added", **where, part=F.text_part(""))
    last = first
    async for out in _all(job, first):
        last = out
        if out.delta_text:
            yield ev("response.output_text.delta", **where, delta=out.delta_text, logprobs=[])
    yield ev("response.output_text.done", **where, text=last.text, logprobs=[])
    yield ev("response.content_part.done", **where, part=F.text_part(last.text))
    yield ev("response.output_item.done", output_index=0, item=F.message_item(msg_id, last.text, "completed"))
    # Always `response.completed` (the SDK's stream helper waits for it); a max_output_tokens cut
    # shows as status "incomplete" with incomplete_details inside, as in the non-streaming body.
    yield ev("response.completed", response=F.response(rid, msg_id, created, model, req, last))
