"""Shapes more than one endpoint answers with: usage, chat-style and prompt logprobs, the usage chunk.

Each endpoint's own body and stream chunks live with it (serving_completion.py, serving_chat.py,
responses_output.py).
"""

from __future__ import annotations

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
