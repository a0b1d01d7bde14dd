"""/v1/responses: OpenAI's Responses API, stateless (no `previous_response_id`, nothing stored).

The input (a string, or message, function_call and function_call_output items) becomes the same
conversation a chat request would be (`ResponsesRequest.as_chat`), so one tool planner and one
chat template serve both. The output is a list of items: a message (the text outside tool calls)
then one function_call item per call; a stream sends OpenAI's typed, sequence-numbered events
(responses_output.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from modeldeploy.runtime.engine.output import RequestOutput
from modeldeploy.runtime.server import formats as F
from modeldeploy.runtime.server import structured as S
from modeldeploy.runtime.server import toolcalls as TC
from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.protocol import ResponsesRequest, parse_body
from modeldeploy.runtime.server.responses_output import ResponsesEvents, response
from modeldeploy.runtime.server.serving_engine import (
    Generation,
    OpenAIServing,
    Prepared,
    is_json_schema,
    new_logprob_ids,
)


class OpenAIServingResponses(OpenAIServing[ResponsesRequest]):
    id_prefix = "resp_"

    def parse(self, raw: bytes) -> ResponsesRequest:
        return parse_body(raw, ResponsesRequest)

    def needs_grammar(self, req: ResponsesRequest) -> bool:
        return bool(req.tools) or is_json_schema(req.text.format if req.text is not None else None)

    def prepare(self, req: ResponsesRequest) -> Prepared:
        ctx, limits = self.ctx, self.ctx.cfg.limits
        schema_limits = limits.schema()
        self.check_logprob_entries("top_logprobs", req.top_logprobs, n=1)  # one output, no `n`
        S.check_tool_count(len(req.tools or []), limits.max_tools)
        chat = req.as_chat()
        plan = S.tool_plan(chat, ctx.chat_template, "tools.{i}.parameters", schema_limits)
        structured, logprobs = S.from_text_format(req.text, schema_limits), req.logprobs
        if plan.mode != "none" and structured is not None:
            raise APIError(400, "text.format: cannot be combined with tools", param="text.format")
        tools = [t.model_dump(exclude_none=True) for t in chat.tools] if chat.tools else None
        ids = ctx.encode_chat([m.render() for m in chat.messages], tools)
        max_tokens = ctx.limit_tokens(len(ids), req.max_output_tokens, "max_output_tokens", "input")
        params = ctx.sampling(req, max_tokens, plan.structured or structured, logprobs, None)
        return Prepared(ids, params, plan)

    def full_response(self, gen: Generation[ResponsesRequest], outs: list[RequestOutput]) -> dict[str, Any]:
        req, plan, out = gen.req, gen.plan, outs[0]
        content, calls = out.text, None
        if plan.mode != "none":
            content, calls = TC.final_calls(plan.mode, plan.function, out.text)
        lps = F.chat_logprobs(gen.tok, out.token_ids, out.logprobs, req.top_logprobs or 0)
        return response(gen.rid, _msg_id(gen.rid), gen.created, gen.model, req, out, content, calls, lps)

    async def stream(self, gen: Generation[ResponsesRequest], first: RequestOutput) -> AsyncIterator[bytes]:
        """Typed events as OpenAI sends them: text in a message item (deltas with their logprobs), each
        tool call in a function_call item (added with its name, then arguments deltas, then done)."""
        req, plan = gen.req, gen.plan
        st = ResponsesEvents(_msg_id(gen.rid), req.logprobs is not None)
        shell = response(gen.rid, st.msg_id, gen.created, gen.model, req, None)
        yield st.ev("response.created", response=shell)
        yield st.ev("response.in_progress", response=shell)
        ts = TC.ToolStream(plan.mode, plan.function) if plan.mode != "none" else None
        if ts is None:
            for e in st.open_message():
                yield e
        last = first
        async for out in gen.outputs(first):
            last = out
            lps = None
            if out.new_logprobs and req.logprobs is not None:
                top = req.top_logprobs or 0
                lps = (F.chat_logprobs(gen.tok, new_logprob_ids(out), out.new_logprobs, top) or {}).get(
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
        if st.open_item is None:  # nothing at all: an empty message, as in the non-streamed body
            for e in st.open_message():
                yield e
        for e in st.close():
            yield e
        content = st.content if st.content or not st.calls else None
        lps_all = {"content": st.logprobs}
        body = response(gen.rid, st.msg_id, gen.created, gen.model, req, last, content, st.calls, lps_all)
        # Always `response.completed` (the SDK's stream helper waits for it); a max_output_tokens cut
        # shows as status "incomplete" with incomplete_details inside, as in the non-streaming body.
        yield st.ev("response.completed", response=body)


def _msg_id(rid: str) -> str:
    """The output message's id: the response's, under the message prefix."""
    return "msg_" + rid.removeprefix(OpenAIServingResponses.id_prefix)
