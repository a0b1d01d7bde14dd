"""/v1/completions: OpenAI's legacy text completion, with vLLM's prompt scoring.

The prompt is text or token ids. `echo` puts the prompt before the completion (with `logprobs`, its
tokens' scores too), and `max_tokens` 0 with echo scores a text without generating: the legacy
idiom evaluation harnesses use. Logprobs are the legacy shape (tokens, token_logprobs, top_logprobs,
text_offset), not chat's.

vLLM's `return_token_ids`: each choice carries `prompt_token_ids` (the prompt as submitted) and
`token_ids` (every id the engine generated for it: a final EOS or stop token included, and the tokens of
a stop string the text was cut at, as vLLM's output ids; with echo, the generated ids only, the prompt's
being in `prompt_token_ids`). Streamed, each chunk carries its new ids and a choice's first chunk the
prompt's; a step whose tokens show no text yet still sends a chunk, so the chunks' ids concatenate to
the body's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from modeldeploy.runtime.engine.output import RequestOutput
from modeldeploy.runtime.server import formats as F
from modeldeploy.runtime.server.protocol import CompletionRequest, parse_body
from modeldeploy.runtime.server.serving_engine import (
    Generation,
    OpenAIServing,
    Prepared,
    is_json_schema,
    new_logprob_ids,
)
from modeldeploy.runtime.server.sse import DONE, event


class OpenAIServingCompletion(OpenAIServing[CompletionRequest]):
    id_prefix = "cmpl-"

    def parse(self, raw: bytes) -> CompletionRequest:
        return parse_body(raw, CompletionRequest)

    def needs_grammar(self, req: CompletionRequest) -> bool:
        return is_json_schema(req.response_format)

    def prepare(self, req: CompletionRequest) -> Prepared:
        ctx = self.ctx
        self.check_logprob_entries("logprobs", req.logprobs, req.n)
        req.check_n()
        if isinstance(req.prompt, str):
            ids = ctx.encode_text(req.prompt) if req.prompt else []
        else:
            ids = list(req.prompt)
            ctx.check_ids(ids, "prompt")
        # max_tokens 0 (echo only): the engine samples the one token the prefill gives anyway; it is dropped
        max_tokens = ctx.limit_tokens(len(ids), req.max_tokens or 1, "max_tokens", "prompt")
        structured = self.response_format(req.response_format)
        prompt_logprobs = req.prompt_logprobs
        if req.echo and req.logprobs is not None:  # the echoed prompt tokens carry their logprobs too
            prompt_logprobs = max(prompt_logprobs or 0, req.logprobs)
        return Prepared(ids, ctx.sampling(req, max_tokens, structured, req.logprobs, prompt_logprobs))

    def full_response(self, gen: Generation[CompletionRequest], outs: list[RequestOutput]) -> dict[str, Any]:
        req = gen.req
        text = req.prompt if isinstance(req.prompt, str) else None
        echo = Echo(
            gen.ids,
            text,
            req.echo,
            req.logprobs,
            req.prompt_logprobs,
            req.max_tokens == 0,
            bool(req.return_token_ids),
        )
        return completion(gen.rid, gen.created, gen.model, outs, gen.tok, echo)

    async def stream(self, gen: Generation[CompletionRequest], first: RequestOutput) -> AsyncIterator[bytes]:
        usage, want_ids = gen.req.include_usage, bool(gen.req.return_token_ids)
        lasts: dict[int, RequestOutput] = {}
        offsets: dict[int, int] = {}
        async for out in gen.outputs(first):
            first_of_choice = out.index not in lasts
            lasts[out.index] = out
            if out.delta_text or out.finished or out.new_logprobs or (want_ids and out.new_token_ids):
                finish = out.finish_reason if out.finished else None
                lps = None
                if out.new_logprobs:
                    at = offsets.get(out.index, 0)
                    lps = completion_logprobs(gen.tok, new_logprob_ids(out), out.new_logprobs, at)
                    offsets[out.index] = at + sum(len(t) for t in lps["tokens"]) if lps else at
                chunk = completion_chunk(
                    gen.rid, gen.created, gen.model, out.delta_text, finish, usage, out.index, lps
                )
                if want_ids:  # vLLM's places: the prompt's ids in a choice's first chunk, new ids in each
                    choice = chunk["choices"][0]
                    choice["prompt_token_ids"] = list(gen.ids) if first_of_choice else None
                    choice["token_ids"] = list(out.new_token_ids)
                yield event(chunk)
        if usage:
            outs = [lasts[i] for i in sorted(lasts)]
            yield event(F.usage_chunk(gen.rid, gen.created, gen.model, "text_completion", outs))
        yield DONE


@dataclasses.dataclass
class Echo:
    """A completion request's prompt options. `text` is the prompt as sent (None for token ids: then
    its decoding); `logprobs` the legacy top-k, `prompt_logprobs` vLLM's, `drop_output` max_tokens 0,
    `token_ids` vLLM's return_token_ids."""

    ids: list[int]
    text: str | None = None
    echo: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    drop_output: bool = False
    token_ids: bool = False


def completion_logprobs(
    tok: Any, token_ids: list[int], lps: list[Any], offset: int = 0
) -> dict[str, Any] | None:
    """OpenAI legacy completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""
    if not lps:
        return None
    texts = [F.token_text(tok, t) for t in token_ids]
    offsets, at = [], offset
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": texts,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{F.token_text(tok, i): v for i, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def echo_logprobs(tok: Any, prompt_ids: list[int], out: Any, k: int) -> dict[str, Any]:
    """The legacy `logprobs` of the echoed prompt: the first token's logprob and top are None."""
    texts = [F.token_text(tok, t) for t in prompt_ids]
    offsets, at = [], 0
    for text in texts:
        offsets.append(at)
        at += len(text)
    scored = out.prompt_logprobs or []
    return {
        "tokens": texts,
        "token_logprobs": [None, *(e.logprob for e in scored)][: len(texts)],
        "top_logprobs": [None, *({F.token_text(tok, i): v for i, v in e.top[:k]} for e in scored)][
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
        choice["prompt_logprobs"] = F.prompt_logprobs(tok, echo.ids, first, echo.prompt_logprobs)
    if echo.token_ids:  # vLLM's places: both in each choice; with echo, token_ids is the output's only
        choice["prompt_token_ids"] = list(echo.ids)
        choice["token_ids"] = list(o.token_ids)
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
        "usage": F.usage(first.num_prompt_tokens, 0) if echo.drop_output else F.out_usage(outs[0], outs),
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
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk
