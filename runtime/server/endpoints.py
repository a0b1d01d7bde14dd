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
from modeldeploy.runtime.server import structured as S
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


def _prepare(ctx: ServerContext, kind: str, req: Any) -> tuple[list[int], Any, S.ToolPlan]:
    plan = S.ToolPlan("none")
    if kind == "completion":
        req.check_n()
        if isinstance(req.prompt, str):
            ids = ctx.encode_text(req.prompt) if req.prompt else []
        else:
            ids = list(req.prompt)
            ctx.check_ids(ids, "prompt")
        max_tokens = ctx.limit_tokens(len(ids), req.max_tokens, "max_tokens", "prompt")
        structured, logprobs = S.from_response_format(req.response_format), req.logprobs
    elif kind == "chat":
        req.check_n()
        limit = req.token_limit()
        plan = S.tool_plan(req, ctx.chat_template)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        ids = ctx.encode_chat([m.render() for m in req.messages], tools)
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = ctx.limit_tokens(len(ids), limit, param, "messages")
        structured = plan.structured or S.from_response_format(req.response_format)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs: requires logprobs to be true", param="top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        ids = ctx.encode_chat(req.messages())
        max_tokens = ctx.limit_tokens(len(ids), req.max_output_tokens, "max_output_tokens", "input")
        structured, logprobs = S.from_text_format(req.text), None
    return ids, ctx.sampling(req, max_tokens, structured, logprobs), plan


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
        ids, params, plan = _prepare(ctx, kind, req)
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
    tok = ctx.engine.tokenizer
    if not req.stream:
        await job.close(client_gone=False)
        outs = first_or_final
        if kind == "completion":
            return JSONResponse(F.completion(rid, created, model, outs, tok))
        if kind == "chat":
            calls = [S.tool_calls(plan, o.text) if plan.mode != "none" else None for o in outs]
            if plan.mode == "auto":  # text around the calls stays content
                outs = [S.with_text(o, S.split_auto(o.text)[0]) for o in outs]
            elif plan.mode != "none":  # the whole output was the call
                outs = [S.with_text(o, None) if c else o for o, c in zip(outs, calls, strict=True)]
            return JSONResponse(F.chat(rid, created, model, outs, tok, req.top_logprobs, calls))
        return JSONResponse(F.response(rid, "msg_" + rid[5:], created, model, req, outs[0]))
    head = (job, first_or_final, rid, created, model, req)
    if kind == "completion":
        body = _completion_stream(*head, tok)
    elif kind == "chat":
        body = _chat_stream(*head, tok, plan)
    else:
        body = _responses_stream(*head)
    return SSEResponse(body, on_close=lambda: job.close(client_gone=True))


async def _all(job: Job, first: Any) -> AsyncIterator[Any]:
    yield first
    async for out in job.outputs():
        yield out


async def _completion_stream(
    job: Job, first: Any, rid: str, created: int, model: str, req: Any, tok: Any
) -> AsyncIterator[bytes]:
    usage = req.include_usage
    lasts: dict[int, Any] = {}
    offsets: dict[int, int] = {}
    async for out in _all(job, first):
        lasts[out.index] = out
        if out.delta_text or out.finished or out.new_logprobs:
            finish = out.finish_reason if out.finished else None
            lps = None
            if out.new_logprobs:
                new_ids = out.token_ids[len(out.token_ids) - len(out.new_logprobs) :]
                lps = F.completion_logprobs(tok, new_ids, out.new_logprobs, offsets.get(out.index, 0))
                offsets[out.index] = offsets.get(out.index, 0) + sum(len(t) for t in lps["tokens"])
            chunk = F.completion_chunk(rid, created, model, out.delta_text, finish, usage, out.index, lps)
            yield event(chunk)
    if usage:
        yield event(F.usage_chunk(rid, created, model, "text_completion", [lasts[i] for i in sorted(lasts)]))
    yield DONE


async def _chat_stream(
    job: Job, first: Any, rid: str, created: int, model: str, req: Any, tok: Any, plan: S.ToolPlan
) -> AsyncIterator[bytes]:
    """Content deltas per choice; with a named tool the arguments stream as delta.tool_calls, with
    tool_choice 'required' the call is sent whole once the grammar completes (its name comes first)."""
    usage = req.include_usage
    for i in range(req.n):
        yield event(F.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None, usage, i))
    lasts: dict[int, Any] = {}
    opened: set[int] = set()
    shown: dict[int, int] = {}  # auto: content characters already streamed, per choice
    async for out in _all(job, first):
        lasts[out.index] = out
        lps = None
        if out.new_logprobs:
            new_ids = out.token_ids[len(out.token_ids) - len(out.new_logprobs) :]
            lps = F.chat_logprobs(tok, new_ids, out.new_logprobs, req.top_logprobs or 0)
        if plan.mode == "named":
            if out.delta_text:
                call = {"index": 0, "function": {"arguments": out.delta_text}}
                if out.index not in opened:  # the first delta opens the call: id, type, name
                    opened.add(out.index)
                    call = {**S.call(plan.function, out.delta_text), "index": 0}
                yield event(
                    F.chat_chunk(rid, created, model, {"tool_calls": [call]}, None, usage, out.index, lps)
                )
        elif plan.mode == "required":
            if out.finished:
                calls = S.tool_calls(plan, out.text) or []
                if calls:
                    delta = {"tool_calls": [{**c, "index": k} for k, c in enumerate(calls)]}
                    yield event(F.chat_chunk(rid, created, model, delta, None, usage, out.index, lps))
        elif plan.mode == "auto":
            upto = (
                len(out.text) if out.finished and S.CALL_BEGIN not in out.text else S.auto_visible(out.text)
            )
            sent = shown.get(out.index, 0)
            if upto > sent:
                shown[out.index] = upto
                yield event(
                    F.chat_chunk(
                        rid, created, model, {"content": out.text[sent:upto]}, None, usage, out.index
                    )
                )
            calls = S.split_auto(out.text)[1] if out.finished else None
            if calls:
                delta = {"tool_calls": [{**c, "index": k} for k, c in enumerate(calls)]}
                yield event(F.chat_chunk(rid, created, model, delta, None, usage, out.index, lps))
        elif out.delta_text or lps:
            delta = {"content": out.delta_text}
            yield event(F.chat_chunk(rid, created, model, delta, None, usage, out.index, lps))
        if out.finished:
            finish = out.finish_reason
            if (
                plan.mode != "none"
                and finish == "stop"
                and (plan.mode != "auto" or S.split_auto(out.text)[1])
            ):
                finish = "tool_calls"
            yield event(F.chat_chunk(rid, created, model, {}, finish, usage, out.index))
    if usage:
        outs = [lasts[i] for i in sorted(lasts)]
        yield event(F.usage_chunk(rid, created, model, "chat.completion.chunk", outs))
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
