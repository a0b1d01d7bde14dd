"""OpenAI response bodies and stream chunks for completions, chat and responses."""

from __future__ import annotations

import dataclasses
from typing import Any


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def out_usage(out: Any, outs: list[Any] | None = None) -> dict[str, int]:
    """Usage of a request: the prompt once, the completion tokens of every choice."""
    return usage(out.num_prompt_tokens, sum(len(o.token_ids) for o in (outs or [out])))


def token_text(tok: Any, token_id: int) -> str:
    return tok.decode([token_id])


def chat_logprobs(tok: Any, token_ids: list[int], lps: list[Any], top: int) -> dict[str, Any] | None:
    """OpenAI chat `logprobs.content`: per token its logprob, bytes and the `top` most likely."""
    if not lps:
        return None

    def entry(t: int, lp: float) -> dict[str, Any]:
        text = token_text(tok, t)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    return {
        "content": [
            {**entry(t, lp.logprob), "top_logprobs": [entry(i, v) for i, v in lp.top[:top]]}
            for t, lp in zip(token_ids, lps, strict=True)
        ]
    }


def completion_logprobs(
    tok: Any, token_ids: list[int], lps: list[Any], offset: int = 0
) -> dict[str, Any] | None:
    """OpenAI legacy completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""
    if not lps:
        return None
    texts = [token_text(tok, t) for t in token_ids]
    offsets, at = [], offset
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": texts,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{token_text(tok, i): v for i, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


@dataclasses.dataclass
class Echo:
    """A completion request's prompt options. `text` is the prompt as sent (None for token ids: then
    its decoding); `logprobs` the legacy top-k, `prompt_logprobs` vLLM's, `drop_output` max_tokens 0."""

    ids: list[int]
    text: str | None = None
    echo: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    drop_output: bool = False


def prompt_logprobs(tok: Any, prompt_ids: list[int], out: Any, k: int) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs`: one entry per prompt token, the first None (nothing precedes it), then
    {str(token id): {logprob, rank, decoded_token}} holding the actual token (its own rank) and the top k."""
    texts: dict[int, str] = {}

    def entry(t: int, lp: float, rank: int) -> dict[str, Any]:
        if t not in texts:
            texts[t] = token_text(tok, t)
        return {"logprob": lp, "rank": rank, "decoded_token": texts[t]}

    scored = out.prompt_logprobs or []
    result: list[dict[str, Any] | None] = [None] if prompt_ids else []
    for e in scored:
        d = {str(e.token_id): entry(e.token_id, e.logprob, e.rank)}
        for rank, (i, v) in enumerate(e.top[:k], start=1):
            if str(i) not in d:
                d[str(i)] = entry(i, v, rank)
        result.append(d)
    return result


def echo_logprobs(tok: Any, prompt_ids: list[int], out: Any, k: int) -> dict[str, Any]:
    """The legacy `logprobs` of the echoed prompt: the first token's logprob and top are None."""
    texts = [token_text(tok, t) for t in prompt_ids]
    offsets, at = [], 0
    for text in texts:
        offsets.append(at)
        at += len(text)
    scored = out.prompt_logprobs or []
    return {
        "tokens": texts,
        "token_logprobs": [None, *(e.logprob for e in scored)][: len(texts)],
        "top_logprobs": [None, *({token_text(tok, i): v for i, v in e.top[:k]} for e in scored)][
            : len(texts)
        ],
        "text_offset": offsets,
    }


def _completion_choice(o: Any, tok: Any, echo: Echo, first: Any) -> dict[str, Any]:
    """One completion choice; with echo, the prompt's text (and logprobs) before the output's."""
    if echo.drop_output:
        o = dataclasses.replace(o, text="", token_ids=[], logprobs=[])
    text, lps = o.text, completion_logprobs(tok, o.token_ids, o.logprobs)
    if echo.echo:
        prompt_text = echo.text if echo.text is not None else tok.decode(echo.ids)
        text = prompt_text + o.text
        if echo.logprobs is not None:
            head = echo_logprobs(tok, echo.ids, first, echo.logprobs)
            end = sum(len(t) for t in head["tokens"])
            tail = completion_logprobs(tok, o.token_ids, o.logprobs, end) or {}
            lps = {key: head[key] + tail.get(key, []) for key in head}
    choice = {"index": o.index, "text": text, "logprobs": lps, "finish_reason": o.finish_reason}
    if echo.prompt_logprobs is not None:  # vLLM's place for completions: in each choice
        choice["prompt_logprobs"] = prompt_logprobs(tok, echo.ids, first, echo.prompt_logprobs)
    return choice


def completion(
    rid: str, created: int, model: str, outs: list[Any], tok: Any = None, echo: Echo | None = None
) -> dict[str, Any]:
    echo = echo or Echo([])
    first = outs[0]  # choice 0 carries the prompt's scores (the prompt is the same for every choice)
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [_completion_choice(o, tok, echo, first) for o in outs],
        "usage": usage(first.num_prompt_tokens, 0) if echo.drop_output else out_usage(outs[0], outs),
    }


def completion_chunk(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str | None,
    with_usage: bool,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    chunk = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def chat_message(out: Any, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
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
    calls: list[list[dict[str, Any]] | None] | None = None,
) -> dict[str, Any]:
    calls = calls or [None] * len(outs)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": o.index,
                "message": chat_message(o, c),
                "logprobs": chat_logprobs(tok, o.token_ids, o.logprobs, top or 0),
                "finish_reason": "tool_calls" if c and o.finish_reason == "stop" else o.finish_reason,
            }
            for o, c in zip(outs, calls, strict=True)
        ],
        "usage": out_usage(outs[0], outs),
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
    chunk = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(rid: str, created: int, model: str, obj: str, outs: list[Any]) -> dict[str, Any]:
    """The extra last chunk of `stream_options.include_usage`: empty choices, usage filled."""
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": out_usage(outs[0], outs),
    }


def response(
    rid: str,
    msg_id: str,
    created: int,
    model: str,
    req: Any,
    out: Any | None,
    content: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A /v1/responses object; `out=None` is the in-progress shell sent at stream start. The output
    is a message (the text outside tool calls, when there is some or no call) then one
    `function_call` item per call."""
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
