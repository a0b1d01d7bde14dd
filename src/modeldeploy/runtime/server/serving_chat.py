"""/v1/chat/completions: messages through the model's chat template, `n` choices, tool calls.

Tools shape decoding through a tool plan (structured.py); the constrained output is turned back
into OpenAI `tool_calls`, whole in the body or streamed as OpenAI streams them (toolcalls.py).
vLLM's template flags (`add_generation_prompt`, `continue_final_message`), `prompt_logprobs` and
`return_token_ids` are accepted as vLLM accepts them: with `return_token_ids` the body carries the
rendered template's ids as top-level `prompt_token_ids` and each choice its generated `token_ids` (as in
serving_completion.py: a final EOS or stop token included); a stream's role chunks carry
`prompt_token_ids` and every later chunk of a choice its new `token_ids`, so they concatenate to the
body's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from modeldeploy.runtime.engine.output import RequestOutput
from modeldeploy.runtime.server import formats as F
from modeldeploy.runtime.server import structured as S
from modeldeploy.runtime.server import toolcalls as TC
from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.protocol import ChatCompletionRequest, parse_body
from modeldeploy.runtime.server.serving_engine import (
    Generation,
    OpenAIServing,
    Prepared,
    is_json_schema,
    new_logprob_ids,
)
from modeldeploy.runtime.server.sse import DONE, event

Calls = list[dict[str, Any]]


class OpenAIServingChat(OpenAIServing[ChatCompletionRequest]):
    id_prefix = "chatcmpl-"

    def parse(self, raw: bytes) -> ChatCompletionRequest:
        return parse_body(raw, ChatCompletionRequest)

    def needs_grammar(self, req: ChatCompletionRequest) -> bool:
        return bool(req.tools) or is_json_schema(req.response_format)

    def prepare(self, req: ChatCompletionRequest) -> Prepared:
        ctx, limits = self.ctx, self.ctx.cfg.limits
        self.check_logprob_entries("top_logprobs", req.top_logprobs if req.logprobs else None, req.n)
        req.check_n()
        req.check_prompt_options()
        limit = req.token_limit()
        S.check_tool_count(len(req.tools or []), limits.max_tools)
        plan = S.tool_plan(req, ctx.chat_template, limits=limits.schema())
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        msgs = [m.render() for m in req.messages]
        ids = ctx.encode_chat(msgs, tools, req.add_generation_prompt, req.continue_final_message)
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = ctx.limit_tokens(len(ids), limit, param, "messages")
        structured = plan.structured or self.response_format(req.response_format)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs: requires logprobs to be true", param="top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = ctx.sampling(req, max_tokens, structured, logprobs, req.prompt_logprobs)
        return Prepared(ids, params, plan)

    def full_response(
        self, gen: Generation[ChatCompletionRequest], outs: list[RequestOutput]
    ) -> dict[str, Any]:
        """With tools, the text outside the calls stays content; with prompt_logprobs, the prompt's
        scores at the top level (vLLM's place for chat)."""
        plan, req = gen.plan, gen.req
        calls: list[Calls | None] = [None] * len(outs)
        if plan.mode != "none":
            pairs = [TC.final_calls(plan.mode, plan.function, o.text) for o in outs]
            outs = [S.with_text(o, content) for o, (content, _) in zip(outs, pairs, strict=True)]
            calls = [c for _, c in pairs]
        body = chat(gen.rid, gen.created, gen.model, outs, gen.tok, req.top_logprobs, calls)
        if req.prompt_logprobs is not None:
            body["prompt_logprobs"] = F.prompt_logprobs(gen.tok, gen.ids, outs[0], req.prompt_logprobs)
        if req.return_token_ids:  # vLLM's places for chat: the prompt's at the top, each choice's in it
            body["prompt_token_ids"] = list(gen.ids)
            for choice, o in zip(body["choices"], outs, strict=True):
                choice["token_ids"] = list(o.token_ids)
        return body

    async def stream(
        self, gen: Generation[ChatCompletionRequest], first: RequestOutput
    ) -> AsyncIterator[bytes]:
        """Content deltas per choice; tool calls as OpenAI streams them (toolcalls.py): a first
        delta.tool_calls with id, type and name, then argument fragments, for every tool mode."""
        req, plan = gen.req, gen.plan
        usage, want_ids = req.include_usage, bool(req.return_token_ids)

        def chunk(
            delta: dict[str, Any],
            finish: str | None,
            index: int,
            lps: Any = None,
            ids: list[int] | None = None,
        ) -> bytes:
            body = chat_chunk(gen.rid, gen.created, gen.model, delta, finish, usage, index, lps)
            if want_ids:
                body["choices"][0]["token_ids"] = ids or []
            return event(body)

        for i in range(req.n):
            role = chat_chunk(
                gen.rid, gen.created, gen.model, {"role": "assistant", "content": ""}, None, usage, i
            )
            if want_ids:  # vLLM's place: the prompt's ids with each choice's first (role) chunk
                role["prompt_token_ids"] = list(gen.ids)
            yield event(role)
        lasts: dict[int, RequestOutput] = {}
        streams: dict[int, TC.ToolStream] = {}
        async for out in gen.outputs(first):
            lasts[out.index] = out
            lps = None
            if out.new_logprobs:
                lps = F.chat_logprobs(gen.tok, new_logprob_ids(out), out.new_logprobs, req.top_logprobs or 0)
            pieces = _pieces(out, plan, streams, lps)
            if want_ids and out.new_token_ids and not pieces:  # tokens with no visible text yet
                pieces.append(({}, None, None))
            for k, (delta, finish, lp) in enumerate(pieces):  # the output's new ids ride on its first
                yield chunk(delta, finish, out.index, lp, out.new_token_ids if k == 0 else None)
        if usage:
            outs = [lasts[i] for i in sorted(lasts)]
            yield event(F.usage_chunk(gen.rid, gen.created, gen.model, "chat.completion.chunk", outs))
        yield DONE


Piece = tuple[dict[str, Any], str | None, Any]  # a chunk's delta, finish_reason and logprobs


def _pieces(out: RequestOutput, plan: S.ToolPlan, streams: dict[int, TC.ToolStream], lps: Any) -> list[Piece]:
    """The chunks one output of a choice becomes: its content or tool-call deltas, then the finish."""
    pieces: list[Piece] = []
    if plan.mode != "none":
        ts = streams.setdefault(out.index, TC.ToolStream(plan.mode, plan.function))
        for delta in map(_tool_delta, ts.feed(out.text, out.finished)):
            pieces.append((delta, None, lps))
            lps = None
        if lps:  # tokens that added nothing visible yet still carry their logprobs
            pieces.append(({}, None, lps))
    elif out.delta_text or lps:
        pieces.append(({"content": out.delta_text}, None, lps))
    if out.finished:
        finish = out.finish_reason
        if finish == "stop" and plan.mode != "none" and streams[out.index].calls:
            finish = "tool_calls"
        pieces.append(({}, finish, None))
    return pieces


def _tool_delta(p: TC.Piece) -> dict[str, Any]:
    if p.kind == "content":
        return {"content": p.text}
    if p.kind == "open":
        return {"tool_calls": [{"index": p.index, **(p.call or {})}]}
    return {"tool_calls": [{"index": p.index, "function": {"arguments": p.text}}]}


def chat_message(out: Any, calls: Calls | None) -> dict[str, Any]:
    """The assistant message; with tool calls, content is the text outside them (None if there is none)."""
    if calls:
        return {"role": "assistant", "content": out.text or None, "tool_calls": calls}
    return {"role": "assistant", "content": out.text}


def chat(
    rid: str,
    created: int,
    model: str,
    outs: list[Any],
    tok: Any = None,
    top: int | None = None,
    calls: list[Calls | None] | None = None,
) -> dict[str, Any]:
    per_choice: list[Calls | None] = calls or [None] * len(outs)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": o.index,
                "message": chat_message(o, c),
                "logprobs": F.chat_logprobs(tok, o.token_ids, o.logprobs, top or 0),
                "finish_reason": "tool_calls" if c and o.finish_reason == "stop" else o.finish_reason,
            }
            for o, c in zip(outs, per_choice, strict=True)
        ],
        "usage": F.out_usage(outs[0], outs),
    }


def chat_chunk(
    rid: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish: str | None,
    with_usage: bool,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk
