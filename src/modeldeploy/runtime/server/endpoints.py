"""The three generation endpoints: /v1/completions, /v1/chat/completions, /v1/responses."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from modeldeploy.runtime.engine.output import EngineDead
from modeldeploy.runtime.server import evidence
from modeldeploy.runtime.server import formats as F
from modeldeploy.runtime.server import structured as S
from modeldeploy.runtime.server import toolcalls as TC
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
    """Tokens, sampling parameters and tool plan of a parsed request; every bound of `ctx.cfg.limits`
    that can be checked before tokenizing is checked first (a refusal costs no template render)."""
    plan = S.ToolPlan("none")
    limits = ctx.cfg.limits
    schema_limits = limits.schema()
    prompt_logprobs = getattr(req, "prompt_logprobs", None)
    _check_logprob_entries(kind, req, limits.max_logprob_entries)
    if kind == "completion":
        req.check_n()
        if isinstance(req.prompt, str):
            ids = ctx.encode_text(req.prompt) if req.prompt else []
        else:
            ids = list(req.prompt)
            ctx.check_ids(ids, "prompt")
        # max_tokens 0 (echo only): the engine samples the one token the prefill gives anyway; it is dropped
        max_tokens = ctx.limit_tokens(len(ids), req.max_tokens or 1, "max_tokens", "prompt")
        structured = S.from_response_format(_response_format(ctx, req), schema_limits)
        logprobs = req.logprobs
        if req.echo and logprobs is not None:  # the echoed prompt tokens carry their logprobs too
            prompt_logprobs = max(prompt_logprobs or 0, logprobs)
    elif kind == "chat":
        req.check_n()
        req.check_prompt_options()
        limit = req.token_limit()
        S.check_tool_count(len(req.tools or []), limits.max_tools)
        plan = S.tool_plan(req, ctx.chat_template, limits=schema_limits)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        msgs = [m.render() for m in req.messages]
        ids = ctx.encode_chat(msgs, tools, req.add_generation_prompt, req.continue_final_message)
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = ctx.limit_tokens(len(ids), limit, param, "messages")
        structured = plan.structured or S.from_response_format(_response_format(ctx, req), schema_limits)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs: requires logprobs to be true", param="top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        S.check_tool_count(len(req.tools or []), limits.max_tools)
        chat = req.as_chat()
        plan = S.tool_plan(chat, ctx.chat_template, "tools.{i}.parameters", schema_limits)
        structured, logprobs = S.from_text_format(req.text, schema_limits), req.logprobs
        if plan.mode != "none" and structured is not None:
            raise APIError(400, "text.format: cannot be combined with tools", param="text.format")
        tools = [t.model_dump(exclude_none=True) for t in chat.tools] if chat.tools else None
        ids = ctx.encode_chat([m.render() for m in chat.messages], tools)
        max_tokens = ctx.limit_tokens(len(ids), req.max_output_tokens, "max_output_tokens", "input")
        structured = plan.structured or structured
    return ids, ctx.sampling(req, max_tokens, structured, logprobs, prompt_logprobs), plan


def _check_logprob_entries(kind: str, req: Any, bound: int) -> None:
    """n x top_logprobs: the entries the server formats for each generated position of the request."""
    if kind == "completion":
        top, param = req.logprobs, "logprobs"
    elif kind == "chat":
        top, param = (req.top_logprobs if req.logprobs else None), "top_logprobs"
    else:
        top, param = req.top_logprobs, "top_logprobs"
    n = getattr(req, "n", 1)
    if top is not None and n * top > bound:
        raise APIError(
            400,
            f"{param}: n ({n}) x {param} ({top}) = {n * top} logprob entries per token, over {bound} "
            "(limit: --max-logprob-entries)",
            param=param,
            code="too_many_logprobs",
        )


def _needs_grammar(kind: str, req: Any) -> bool:
    """Whether preparing the request checks a JSON Schema (tools, response_format, text.format)."""
    if getattr(req, "tools", None):
        return True
    fmt = getattr(req, "response_format", None)
    if kind == "responses":
        fmt = req.text.format if req.text is not None else None
    return fmt is not None and fmt.type == "json_schema"


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


_PATH_CHARS = ("/", "\\", "..", "\x00")


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


DEADLINE = "x-request-deadline-ms"


def _deadline(request: Request) -> float | None:
    """The client's wait budget in seconds (header x-request-deadline-ms), or None."""
    raw = request.headers.get(DEADLINE)
    if raw is None:
        return None
    if not raw.isdigit() or not 0 < int(raw) <= 3_600_000:
        raise APIError(400, f"{DEADLINE}: must be an integer of milliseconds in 1..3600000", param=DEADLINE)
    return int(raw) / 1000


def _echo(req: Any, ids: list[int]) -> F.Echo:
    """What a completion body adds about its prompt: the echo, the prompt's scores, or neither."""
    text = req.prompt if isinstance(req.prompt, str) else None
    return F.Echo(ids, text, req.echo, req.logprobs, req.prompt_logprobs, req.max_tokens == 0)


def _response_format(ctx: ServerContext, req: Any) -> Any:
    return None if ctx.cfg.ignore_response_format else req.response_format  # the test hook's defect


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
        budget = _deadline(request)
        req = parse_body(await read_body(request, ctx.cfg.limits.max_body_bytes), KINDS[kind])
        check_model_name(ctx, req.model)
        adapter = ctx.check_model(req.model)
        if _needs_grammar(kind, req):  # schema checks are Python work: off the loop other streams use
            ids, params, plan = await asyncio.to_thread(_prepare, ctx, kind, req)
        else:
            ids, params, plan = _prepare(ctx, kind, req)
    except APIError as e:
        ctx.metrics.outcome(refusal_outcome(e.status), adapter or "")
        raise
    except Exception:
        ctx.metrics.outcome("error", adapter or "")
        raise
    rid = _PREFIX[kind] + uuid.uuid4().hex
    job = Job(ctx, rid, ids, params, arrival, adapter, budget)
    job.evidence = evidence.of(request)
    created = int(time.time())
    model = req.model  # the base model's name or the adapter's, as the client asked
    try:
        first_or_final = await race_disconnect(request, job.start() if req.stream else job.run())
    except ClientGone:
        await job.close(client_gone=True)
        return Response(status_code=499)  # nobody reads it; the client is gone
    except EngineDead as e:
        job.server_aborted = True
        await job.close(client_gone=False)
        raise APIError(503, str(e), code="engine_failed") from None
    except BaseException:
        await job.close(client_gone=False)
        raise
    tok = ctx.engine.tokenizer
    if not req.stream:
        await job.close(client_gone=False)
        outs = first_or_final
        if kind == "completion":
            return JSONResponse(F.completion(rid, created, model, outs, tok, _echo(req, ids)))
        if kind == "chat":
            return JSONResponse(_chat_body(rid, created, model, outs, tok, req, plan, ids))
        content, calls = outs[0].text, None
        if plan.mode != "none":
            content, calls = TC.final_calls(plan.mode, plan.function, outs[0].text)
        lps = F.chat_logprobs(tok, outs[0].token_ids, outs[0].logprobs, req.top_logprobs or 0)
        body = F.response(rid, "msg_" + rid[5:], created, model, req, outs[0], content, calls, lps)
        return JSONResponse(body)
    head = (job, first_or_final, rid, created, model, req)
    if kind == "completion":
        body = _completion_stream(*head, tok)
    elif kind == "chat":
        body = _chat_stream(*head, tok, plan)
    else:
        body = _responses_stream(*head, tok, plan)
    return SSEResponse(_until_engine_fails(job, body), on_close=lambda: job.close(client_gone=True))


def _chat_body(
    rid: str, created: int, model: str, outs: list[Any], tok: Any, req: Any, plan: S.ToolPlan, ids: list[int]
) -> dict[str, Any]:
    """The non-streamed chat completion; with prompt_logprobs, the prompt's scores at the top level
    (vLLM's place for chat)."""
    calls: list[Any] = [None] * len(outs)
    if plan.mode != "none":  # the text outside the calls stays content
        pairs = [TC.final_calls(plan.mode, plan.function, o.text) for o in outs]
        outs = [S.with_text(o, content) for o, (content, _) in zip(outs, pairs, strict=True)]
        calls = [c for _, c in pairs]
    body = F.chat(rid, created, model, outs, tok, req.top_logprobs, calls)
    if req.prompt_logprobs is not None:
        body["prompt_logprobs"] = F.prompt_logprobs(tok, ids, outs[0], req.prompt_logprobs)
    return body


async def _until_engine_fails(job: Job, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A stream whose engine dies mid-way (a dead tensor-parallel rank, a crashed step loop) ends with
    an error event and no [DONE], so the client knows at once; the outcome is the server's error."""
    try:
        async for chunk in body:
            yield chunk
    except EngineDead as e:
        job.server_aborted = True
        yield event({"error": {"message": str(e), "type": "engine_error", "code": "engine_failed"}})


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
    """Content deltas per choice; tool calls as OpenAI streams them (toolcalls.py): a first
    delta.tool_calls with id, type and name, then argument fragments, for every tool mode."""
    usage = req.include_usage
    for i in range(req.n):
        yield event(F.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None, usage, i))
    lasts: dict[int, Any] = {}
    streams: dict[int, TC.ToolStream] = {}
    async for out in _all(job, first):
        lasts[out.index] = out
        lps = None
        if out.new_logprobs:
            new_ids = out.token_ids[len(out.token_ids) - len(out.new_logprobs) :]
            lps = F.chat_logprobs(tok, new_ids, out.new_logprobs, req.top_logprobs or 0)
        if plan.mode != "none":
            ts = streams.setdefault(out.index, TC.ToolStream(plan.mode, plan.function))
            for delta in map(_tool_delta, ts.feed(out.text, out.finished)):
                yield event(F.chat_chunk(rid, created, model, delta, None, usage, out.index, lps))
                lps = None
            if lps:  # tokens that added nothing visible yet still carry their logprobs
                yield event(F.chat_chunk(rid, created, model, {}, None, usage, out.index, lps))
        elif out.delta_text or lps:
            delta = {"content": out.delta_text}
            yield event(F.chat_chunk(rid, created, model, delta, None, usage, out.index, lps))
        if out.finished:
            finish = out.finish_reason
            if finish == "stop" and plan.mode != "none" and streams[out.index].calls:
                finish = "tool_calls"
            yield event(F.chat_chunk(rid, created, model, {}, finish, usage, out.index))
    if usage:
        outs = [lasts[i] for i in sorted(lasts)]
        yield event(F.usage_chunk(rid, created, model, "chat.completion.chunk", outs))
    yield DONE


def _tool_delta(p: TC.Piece) -> dict[str, Any]:
    if p.kind == "content":
        return {"content": p.text}
    if p.kind == "open":
        return {"tool_calls": [{"index": p.index, **(p.call or {})}]}
    return {"tool_calls": [{"index": p.index, "function": {"arguments": p.text}}]}


async def _responses_stream(
    job: Job, first: Any, rid: str, created: int, model: str, req: Any, tok: Any, plan: S.ToolPlan
) -> AsyncIterator[bytes]:
    """Typed events as OpenAI sends them: text in a message item (deltas with their logprobs), each
    tool call in a function_call item (added with its name, then arguments deltas, then done)."""
    st = _ResponsesEvents(rid, "msg_" + rid[5:], req)
    shell = F.response(rid, st.msg_id, created, model, req, None)
    yield st.ev("response.created", response=shell)
    yield st.ev("response.in_progress", response=shell)
    ts = TC.ToolStream(plan.mode, plan.function) if plan.mode != "none" else None
    if ts is None:
        for e in st.open_message():
            yield e
    last = first
    async for out in _all(job, first):
        last = out
        lps = None
        if out.new_logprobs and req.logprobs is not None:
            new_ids = out.token_ids[len(out.token_ids) - len(out.new_logprobs) :]
            lps = (F.chat_logprobs(tok, new_ids, out.new_logprobs, req.top_logprobs or 0) or {}).get(
                "content"
            )
        if ts is None:
            if out.delta_text or lps:
                for e in st.text(out.delta_text, lps or []):
                    yield e
            continue
        for p in ts.feed(out.text, out.finished):
            for e in st.text(p.text, []) if p.kind == "content" else st.call(p):
                yield e
    if st.kind is None:  # nothing at all: an empty message, as in the non-streamed body
        for e in st.open_message():
            yield e
    for e in st.close():
        yield e
    content = st.content if st.content or not st.calls else None
    body = F.response(rid, st.msg_id, created, model, req, last, content, st.calls, {"content": st.logprobs})
    # Always `response.completed` (the SDK's stream helper waits for it); a max_output_tokens cut
    # shows as status "incomplete" with incomplete_details inside, as in the non-streaming body.
    yield st.ev("response.completed", response=body)


class _ResponsesEvents:
    """The open output item of a /v1/responses stream and the sequence numbers of its events."""

    def __init__(self, rid: str, msg_id: str, req: Any):
        self.seq, self.msg_id, self.req = 0, msg_id, req
        self.index = -1  # output_index of the open item
        self.kind: str | None = None  # "message" | "call" | None (nothing open)
        self.content, self.logprobs = "", []
        self.calls: list[dict[str, Any]] = []

    def ev(self, kind: str, **data: Any) -> bytes:
        self.seq += 1
        return event({"type": kind, "sequence_number": self.seq - 1, **data}, name=kind)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.msg_id, "output_index": self.index, "content_index": 0}

    def open_message(self) -> list[bytes]:
        self.index, self.kind = self.index + 1, "message"
        item = F.message_item(self.msg_id, None, "in_progress")
        part = F.text_part("", [] if self.req.logprobs is not None else None)
        return [
            self.ev("response.output_item.added", output_index=self.index, item=item),
            self.ev("response.content_part.added", **self._where(), part=part),
        ]

    def text(self, delta: str, lps: list[dict[str, Any]]) -> list[bytes]:
        evs = self.open_message() if self.kind != "message" else []
        self.content += delta
        self.logprobs += lps
        return evs + [self.ev("response.output_text.delta", **self._where(), delta=delta, logprobs=lps)]

    def call(self, p: TC.Piece) -> list[bytes]:
        if p.kind == "open":
            evs = self.close()
            self.index, self.kind = self.index + 1, "call"
            self.calls.append(p.call or {})
            item = F.function_call_item(self.calls[-1], "in_progress")
            return evs + [self.ev("response.output_item.added", output_index=self.index, item=item)]
        fn = self.calls[p.index]["function"]
        fn["arguments"] += p.text
        item_id = F.function_call_item(self.calls[p.index], "")["id"]
        return [
            self.ev(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=self.index,
                delta=p.text,
            )
        ]

    def close(self) -> list[bytes]:
        """Done events for the open item, if any."""
        kind, self.kind = self.kind, None
        if kind == "message":
            lps = self.logprobs if self.req.logprobs is not None else None
            part = F.text_part(self.content, lps)
            item = F.message_item(self.msg_id, self.content, "completed", lps)
            return [
                self.ev("response.output_text.done", **self._where(), text=self.content, logprobs=lps or []),
                self.ev("response.content_part.done", **self._where(), part=part),
                self.ev("response.output_item.done", output_index=self.index, item=item),
            ]
        if kind == "call":
            item = F.function_call_item(self.calls[-1], "completed")
            done = {"item_id": item["id"], "output_index": self.index, "arguments": item["arguments"]}
            return [
                self.ev("response.function_call_arguments.done", **done),
                self.ev("response.output_item.done", output_index=self.index, item=item),
            ]
        return []
