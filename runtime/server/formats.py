"""OpenAI response bodies and stream chunks for completions, chat and responses."""

from __future__ import annotations

from typing import Any


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def out_usage(out: Any) -> dict[str, int]:
    return usage(out.num_prompt_tokens, len(out.token_ids))


def completion(rid: str, created: int, model: str, out: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason}],
        "usage": out_usage(out),
    }


def completion_chunk(
    rid: str, created: int, model: str, text: str, finish: str | None, with_usage: bool
) -> dict[str, Any]:
    chunk = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def chat(rid: str, created: int, model: str, out: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": out.text},
                "logprobs": None,
                "finish_reason": out.finish_reason,
            }
        ],
        "usage": out_usage(out),
    }


def chat_chunk(
    rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None, with_usage: bool
) -> dict[str, Any]:
    chunk = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(rid: str, created: int, model: str, obj: str, out: Any) -> dict[str, Any]:
    """The extra last chunk of `stream_options.include_usage`: empty choices, usage filled."""
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": out_usage(out),
    }


def response(rid: str, msg_id: str, created: int, model: str, req: Any, out: Any | None) -> dict[str, Any]:
    """A /v1/responses object; `out=None` is the in-progress shell sent at stream start."""
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
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "user": req.user,
    }
    if out is None:
        return body
    body["output"] = [message_item(msg_id, out.text, "completed")]
    body["usage"] = {
        "input_tokens": out.num_prompt_tokens,
        "output_tokens": len(out.token_ids),
        "total_tokens": out.num_prompt_tokens + len(out.token_ids),
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    if out.finish_reason == "length":
        body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    else:
        body["status"] = "completed"
    return body


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def message_item(msg_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": msg_id, "status": status, "role": "assistant", "content": content}
