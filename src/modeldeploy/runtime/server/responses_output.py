"""The output of /v1/responses: the response object, its items, and the typed stream events.

A response's output is a message item (the text outside tool calls, when there is some or no call)
then one function_call item per call. A stream builds the same items with OpenAI's events, each
numbered (`sequence_number`): an item is added, filled by deltas, then done, one item open at a time.
"""

from __future__ import annotations

from typing import Any, Literal

from modeldeploy.runtime.server import toolcalls as TC
from modeldeploy.runtime.server.protocol import ResponsesRequest
from modeldeploy.runtime.server.sse import event


def response(
    rid: str,
    msg_id: str,
    created: int,
    model: str,
    req: ResponsesRequest,
    out: Any | None,
    content: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A /v1/responses object; `out=None` is the in-progress shell sent at stream start."""
    choice = req.tool_choice
    body: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": "in_progress",
        "output": [],
        "usage": None,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_logprobs": req.top_logprobs,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "tool_choice": (choice.model_dump() if choice is not None and not isinstance(choice, str) else choice)
        or ("auto" if req.tools else "none"),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "user": req.user,
    }
    if out is None:
        return body
    done = "incomplete" if out.finish_reason == "length" else "completed"
    if content is not None or not calls:
        lps = (logprobs or {}).get("content") if req.logprobs is not None else None
        body["output"].append(message_item(msg_id, content or "", "completed", lps))
    body["output"] += [function_call_item(c, done) for c in calls or []]
    body["usage"] = {
        "input_tokens": out.num_prompt_tokens,
        "output_tokens": len(out.token_ids),
        "total_tokens": out.num_prompt_tokens + len(out.token_ids),
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    body["status"] = done
    if done == "incomplete":
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    return body


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def message_item(
    msg_id: str, text: str | None, status: str, logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    content = [] if text is None else [text_part(text, logprobs)]
    return {"type": "message", "id": msg_id, "status": status, "role": "assistant", "content": content}


def function_call_item(call: dict[str, Any], status: str) -> dict[str, Any]:
    """A tool call as a /v1/responses output item: `call_id` is what a function_call_output answers."""
    return {
        "type": "function_call",
        "id": "fc_" + call["id"].removeprefix("call_"),
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": status,
    }


class ResponsesEvents:
    """The open output item of a /v1/responses stream and the sequence numbers of its events.
    `with_logprobs`: the request asked for output text logprobs (the text parts carry them)."""

    def __init__(self, msg_id: str, with_logprobs: bool) -> None:
        self.seq, self.msg_id, self.with_logprobs = 0, msg_id, with_logprobs
        self.index = -1  # output_index of the open item
        self.open_item: Literal["message", "call"] | None = None
        self.content = ""
        self.logprobs: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []

    def ev(self, event_type: str, **data: Any) -> bytes:
        self.seq += 1
        return event({"type": event_type, "sequence_number": self.seq - 1, **data}, name=event_type)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.msg_id, "output_index": self.index, "content_index": 0}

    def open_message(self) -> list[bytes]:
        self.index, self.open_item = self.index + 1, "message"
        item = message_item(self.msg_id, None, "in_progress")
        part = text_part("", [] if self.with_logprobs else None)
        return [
            self.ev("response.output_item.added", output_index=self.index, item=item),
            self.ev("response.content_part.added", **self._where(), part=part),
        ]

    def text(self, delta: str, lps: list[dict[str, Any]]) -> list[bytes]:
        evs = self.open_message() if self.open_item != "message" else []
        self.content += delta
        self.logprobs += lps
        return evs + [self.ev("response.output_text.delta", **self._where(), delta=delta, logprobs=lps)]

    def call(self, p: TC.Piece) -> list[bytes]:
        if p.kind == "open":
            evs = self.close()
            self.index, self.open_item = self.index + 1, "call"
            self.calls.append(p.call or {})
            item = function_call_item(self.calls[-1], "in_progress")
            return evs + [self.ev("response.output_item.added", output_index=self.index, item=item)]
        fn = self.calls[p.index]["function"]
        fn["arguments"] += p.text
        item_id = function_call_item(self.calls[p.index], "")["id"]
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
        closing, self.open_item = self.open_item, None
        if closing == "message":
            lps = self.logprobs if self.with_logprobs else None
            part = text_part(self.content, lps)
            item = message_item(self.msg_id, self.content, "completed", lps)
            return [
                self.ev("response.output_text.done", **self._where(), text=self.content, logprobs=lps or []),
                self.ev("response.content_part.done", **self._where(), part=part),
                self.ev("response.output_item.done", output_index=self.index, item=item),
            ]
        if closing == "call":
            item = function_call_item(self.calls[-1], "completed")
            done = {"item_id": item["id"], "output_index": self.index, "arguments": item["arguments"]}
            return [
                self.ev("response.function_call_arguments.done", **done),
                self.ev("response.output_item.done", output_index=self.index, item=item),
            ]
        return []
